//! Expert-use counts: how often each routed expert of each layer was chosen, so that the
//! hottest experts can be pinned at start-up next time (design.md, "Data flow").
//!
//! The browser reports counts to the helper (`POST /api/usage`, a [`UsageReport`]); the
//! helper merges them into the model's usage file (a [`UsageFile`], JSON, documented in
//! docs/api.md); the native expert cache and the browser read the same file. Everything
//! here is pure (no file system), so it compiles for wasm32 too; the helper does the
//! locked read-merge-write.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Value of the `format` field of a usage file.
pub const USAGE_FORMAT: &str = "colibri-usage";
/// Version of the usage file layout.
pub const USAGE_VERSION: u32 = 1;

/// Counts of expert uses, dense: (n_layers, n_experts). Dense layers keep zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertUsage {
    n_layers: usize,
    n_experts: usize,
    /// (n_layers, n_experts), row-major
    counts: Vec<u64>,
}

/// What a client reports: `{"model": "demo", "counts": [[layer, expert, count], ...]}`.
/// The same (layer, expert) may appear more than once; the counts add up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    pub model: String,
    pub counts: Vec<(u64, u64, u64)>,
}

/// The persisted form: shape plus the non-zero counts as `[layer, expert, count]`, in
/// (layer, expert) order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageFile {
    pub format: String,
    pub version: u32,
    pub model: String,
    pub n_layers: usize,
    pub n_experts: usize,
    /// Sum of all counts (informational; recomputed on load).
    #[serde(default)]
    pub total: u64,
    /// Which version of the model the counts are for (the xxh3 of its colibri.json, hex):
    /// a retrained model of the same shape must not inherit the old one's counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    pub counts: Vec<(u64, u64, u64)>,
}

impl ExpertUsage {
    pub fn new(n_layers: usize, n_experts: usize) -> Self {
        ExpertUsage { n_layers, n_experts, counts: vec![0; n_layers * n_experts] }
    }

    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    fn index(&self, layer: u64, expert: u64) -> Result<usize> {
        if layer >= self.n_layers as u64 || expert >= self.n_experts as u64 {
            return Err(Error::Invalid(format!(
                "usage: (layer {layer}, expert {expert}) is outside the model ({} layers, {} experts)",
                self.n_layers, self.n_experts
            )));
        }
        Ok(layer as usize * self.n_experts + expert as usize)
    }

    pub fn get(&self, layer: usize, expert: usize) -> u64 {
        self.index(layer as u64, expert as u64).map(|i| self.counts[i]).unwrap_or(0)
    }

    /// Adds `count` uses of one expert (saturating); an error if it is out of bounds.
    pub fn add(&mut self, layer: usize, expert: usize, count: u64) -> Result<()> {
        let i = self.index(layer as u64, expert as u64)?;
        self.counts[i] = self.counts[i].saturating_add(count);
        Ok(())
    }

    /// Adds every triple of a report. All of them are checked first, so a report with
    /// one bad entry changes nothing.
    pub fn merge_triples(&mut self, triples: &[(u64, u64, u64)]) -> Result<()> {
        let idx: Vec<usize> = triples.iter().map(|&(l, e, _)| self.index(l, e)).collect::<Result<_>>()?;
        for (i, &(_, _, c)) in idx.into_iter().zip(triples) {
            self.counts[i] = self.counts[i].saturating_add(c);
        }
        Ok(())
    }

    /// Adds another table of the same shape.
    pub fn merge(&mut self, other: &ExpertUsage) -> Result<()> {
        if (self.n_layers, self.n_experts) != (other.n_layers, other.n_experts) {
            return Err(Error::Invalid(format!(
                "usage: cannot merge a ({}, {}) table into a ({}, {}) one",
                other.n_layers, other.n_experts, self.n_layers, self.n_experts
            )));
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
        Ok(())
    }

    /// Halves every count (rounding down): the recent counts' decay.
    pub fn halve(&mut self) {
        for c in &mut self.counts {
            *c /= 2;
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Up to `n` used experts as (layer, expert, count), most used first; ties by
    /// (layer, expert). This is the pin order for an expert cache.
    pub fn hottest(&self, n: usize) -> Vec<(usize, usize, u64)> {
        let mut v: Vec<(usize, usize, u64)> = self.nonzero().collect();
        v.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        v.truncate(n);
        v
    }

    fn nonzero(&self) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
        let ne = self.n_experts.max(1);
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(move |(i, &c)| (i / ne, i % ne, c))
    }

    pub fn to_file(&self, model: &str, fingerprint: Option<&str>) -> UsageFile {
        UsageFile {
            format: USAGE_FORMAT.to_string(),
            version: USAGE_VERSION,
            model: model.to_string(),
            n_layers: self.n_layers,
            n_experts: self.n_experts,
            total: self.total(),
            fingerprint: fingerprint.map(str::to_string),
            counts: self.nonzero().map(|(l, e, c)| (l as u64, e as u64, c)).collect(),
        }
    }

    /// Reads a usage file back; its shape must be the model's (`n_layers`, `n_experts`)
    /// and, when the model has a `fingerprint`, the file must carry the same one.
    pub fn from_file(f: &UsageFile, n_layers: usize, n_experts: usize, fingerprint: Option<&str>) -> Result<Self> {
        if let Some(want) = fingerprint {
            if f.fingerprint.as_deref() != Some(want) {
                return Err(Error::Invalid(format!(
                    "usage: the counts are for another version of the model (fingerprint {}; the model's is {want})",
                    f.fingerprint.as_deref().unwrap_or("none")
                )));
            }
        }
        if f.format != USAGE_FORMAT || f.version != USAGE_VERSION {
            return Err(Error::Invalid(format!(
                "usage: unknown file format {:?} version {} (want {USAGE_FORMAT:?} version {USAGE_VERSION})",
                f.format, f.version
            )));
        }
        if (f.n_layers, f.n_experts) != (n_layers, n_experts) {
            return Err(Error::Invalid(format!(
                "usage: the file is for {} layers x {} experts, the model has {n_layers} x {n_experts}",
                f.n_layers, f.n_experts
            )));
        }
        let mut u = ExpertUsage::new(n_layers, n_experts);
        u.merge_triples(&f.counts)?;
        Ok(u)
    }

    pub fn to_json_bytes(&self, model: &str, fingerprint: Option<&str>) -> Vec<u8> {
        // Serialising plain numbers and strings cannot fail.
        serde_json::to_vec_pretty(&self.to_file(model, fingerprint)).unwrap_or_default()
    }

    pub fn from_json_bytes(bytes: &[u8], n_layers: usize, n_experts: usize, fingerprint: Option<&str>) -> Result<Self> {
        let f: UsageFile =
            serde_json::from_slice(bytes).map_err(|e| Error::Invalid(format!("usage: not a valid usage file: {e}")))?;
        Self::from_file(&f, n_layers, n_experts, fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_and_checks_bounds_before_changing_anything() {
        let mut u = ExpertUsage::new(2, 4);
        u.merge_triples(&[(0, 1, 3), (1, 3, 2), (0, 1, 4)]).unwrap();
        assert_eq!(u.get(0, 1), 7);
        assert_eq!(u.get(1, 3), 2);
        assert_eq!(u.total(), 9);
        let before = u.clone();
        assert!(u.merge_triples(&[(0, 0, 1), (2, 0, 1)]).is_err());
        assert!(u.merge_triples(&[(0, 4, 1)]).is_err());
        assert_eq!(u, before);
        u.merge_triples(&[(0, 0, u64::MAX), (0, 0, 5)]).unwrap();
        assert_eq!(u.get(0, 0), u64::MAX);
    }

    #[test]
    fn file_round_trip_keeps_counts_and_checks_shape() {
        let mut u = ExpertUsage::new(3, 5);
        u.merge_triples(&[(2, 4, 10), (0, 0, 1), (1, 2, 10)]).unwrap();
        let bytes = u.to_json_bytes("demo", Some("00ff"));
        let f: UsageFile = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(f.counts, vec![(0, 0, 1), (1, 2, 10), (2, 4, 10)]);
        assert_eq!(f.total, 21);
        assert_eq!(ExpertUsage::from_json_bytes(&bytes, 3, 5, Some("00ff")).unwrap(), u);
        assert_eq!(ExpertUsage::from_json_bytes(&bytes, 3, 5, None).unwrap(), u);
        assert!(ExpertUsage::from_json_bytes(&bytes, 3, 6, Some("00ff")).is_err());
        // Another version of the model, or a file from before fingerprints: not its counts.
        assert!(ExpertUsage::from_json_bytes(&bytes, 3, 5, Some("0100")).is_err());
        assert!(ExpertUsage::from_json_bytes(&u.to_json_bytes("demo", None), 3, 5, Some("00ff")).is_err());
        assert!(ExpertUsage::from_json_bytes(b"{}", 3, 5, None).is_err());
        assert_eq!(u.hottest(2), vec![(1, 2, 10), (2, 4, 10)]);
    }

    #[test]
    fn merging_tables_needs_the_same_shape() {
        let mut a = ExpertUsage::new(1, 2);
        a.add(0, 1, 2).unwrap();
        let b = a.clone();
        a.merge(&b).unwrap();
        assert_eq!(a.get(0, 1), 4);
        assert!(a.merge(&ExpertUsage::new(2, 2)).is_err());
    }

    #[test]
    fn report_parses_from_the_wire_format() {
        let r: UsageReport = serde_json::from_str(r#"{"model":"demo","counts":[[0,1,2],[3,4,5]]}"#).unwrap();
        assert_eq!(r.counts, vec![(0, 1, 2), (3, 4, 5)]);
        assert!(serde_json::from_str::<UsageReport>(r#"{"model":"demo","counts":[[0,-1,2]]}"#).is_err());
        assert!(serde_json::from_str::<UsageReport>(r#"{"model":"demo","counts":[[0,1]]}"#).is_err());
    }
}
