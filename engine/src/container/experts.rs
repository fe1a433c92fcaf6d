//! Routed experts read from a container on demand: one read of the expert's byte range,
//! a checksum check, and a least-recently-used cache under a byte budget. The bytes are
//! the same whichever way they arrive, so the budget changes speed, never the answer.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::manifest::{parse_checksum, ExpertLayer, Manifest};
use super::{checksum, ByteSource};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::moe::{Expert, ExpertSource};
use crate::tensor::{Bytes, DType, Mat};

/// Where one layer's experts are and how to cut them into gate, up and down.
struct LayerIndex {
    /// (dtype, rows, cols, offset in the range, length) of gate, up, down.
    parts: [(DType, usize, usize, usize, usize); 3],
    /// (offset, length, checksum) per expert.
    experts: Vec<(u64, usize, u64)>,
}

/// Counters of the expert cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub cached_bytes: u64,
    pub cached_experts: u64,
}

#[derive(Default)]
struct Lru {
    /// key -> (expert, bytes, tick of last use)
    map: HashMap<(usize, usize), (Arc<Expert>, u64, u64)>,
    /// tick of last use -> key
    order: BTreeMap<u64, (usize, usize)>,
    bytes: u64,
    tick: u64,
}

/// An [`ExpertSource`] over a container's data file.
pub struct ContainerExperts {
    source: Arc<dyn ByteSource>,
    /// Indexed by model layer; None for dense layers.
    layers: Vec<Option<LayerIndex>>,
    /// None: unlimited.
    budget: Option<u64>,
    lru: Mutex<Lru>,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
}

fn index_layer(l: &ExpertLayer, cfg: &ModelConfig) -> Result<LayerIndex> {
    let (h, i) = (cfg.hidden, cfg.expert_intermediate);
    let want = [[i, h], [i, h], [h, i]];
    let mut parts = [(DType::F32, 0, 0, 0, 0); 3];
    for (k, p) in l.parts.iter().enumerate() {
        let shape = [p.shape[0] as usize, p.shape[1] as usize];
        if shape != want[k] {
            return Err(Error::Invalid(format!(
                "colibri.json: layer {} expert {} has shape {:?}, the config implies {:?}",
                l.layer, p.name, p.shape, want[k]
            )));
        }
        parts[k] = (p.dtype()?, shape[0], shape[1], p.offset as usize, p.length as usize);
    }
    let n = cfg.router.n_experts;
    if l.experts.len() != n {
        return Err(Error::Invalid(format!("colibri.json: layer {} lists {} experts, the config says {n}", l.layer, l.experts.len())));
    }
    let experts = l.experts.iter().map(|e| (e.offset, e.length as usize, parse_checksum(&e.xxh3).unwrap_or(0))).collect();
    Ok(LayerIndex { parts, experts })
}

impl ContainerExperts {
    /// Indexes the manifest's experts, checking them against the model config.
    /// `budget`: bytes of experts to keep in memory (None = all, Some(0) = none).
    pub fn new(m: &Manifest, cfg: &ModelConfig, source: Arc<dyn ByteSource>, budget: Option<u64>) -> Result<Self> {
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for (l, &moe) in cfg.moe_layers.iter().enumerate() {
            match (moe, m.expert_layer(l)) {
                (true, Some(x)) => layers.push(Some(index_layer(x, cfg)?)),
                (true, None) => return Err(Error::Invalid(format!("colibri.json: no experts for MoE layer {l}"))),
                (false, Some(_)) => return Err(Error::Invalid(format!("colibri.json: experts listed for dense layer {l}"))),
                (false, None) => layers.push(None),
            }
        }
        if let Some(x) = m.experts.layers.iter().find(|x| x.layer as usize >= cfg.n_layers) {
            return Err(Error::Invalid(format!("colibri.json: experts listed for layer {}, but the model has {} layers", x.layer, cfg.n_layers)));
        }
        Ok(ContainerExperts {
            source,
            layers,
            budget,
            lru: Mutex::new(Lru::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        })
    }

    pub fn stats(&self) -> CacheStats {
        let lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            cached_bytes: lru.bytes,
            cached_experts: lru.map.len() as u64,
        }
    }

    /// Reads expert `index` of `layer` from the source and checks its checksum,
    /// bypassing the cache.
    pub fn load(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        self.read(layer, index).map(|(x, _)| x)
    }

    /// [`ContainerExperts::load`], also returning the bytes the expert holds in memory.
    fn read(&self, layer: usize, index: usize) -> Result<(Arc<Expert>, u64)> {
        let li = self
            .layers
            .get(layer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| Error::Invalid(format!("layer {layer} has no routed experts")))?;
        let &(offset, length, want) =
            li.experts.get(index).ok_or_else(|| Error::Invalid(format!("no expert {index} in layer {layer}")))?;
        let mut buf = vec![0u8; length];
        self.source.read_at(offset, &mut buf)?;
        self.bytes_read.fetch_add(length as u64, Ordering::Relaxed);
        if checksum(&buf) != want {
            return Err(Error::Invalid(format!(
                "{}: checksum mismatch in expert {index} of layer {layer} (bytes {offset}..{}): the file is corrupted; convert the model again",
                self.source.name(),
                offset + length as u64
            )));
        }
        let bytes = Bytes::from_vec(buf);
        let mat = |k: usize| -> Result<Mat> {
            let (dt, rows, cols, off, len) = li.parts[k];
            Mat::new(rows, cols, dt, bytes.slice(off, len)?)
        };
        Ok((Arc::new(Expert { gate: mat(0)?, up: mat(1)?, down: mat(2)? }), length as u64))
    }

    /// Every expert's checksum, calling `progress(done, total)` along the way; returns the
    /// first failure.
    pub fn verify_all(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<()> {
        let total: usize = self.layers.iter().flatten().map(|l| l.experts.len()).sum();
        let mut done = 0;
        for (l, li) in self.layers.iter().enumerate() {
            if let Some(li) = li {
                for e in 0..li.experts.len() {
                    self.load(l, e)?;
                    done += 1;
                    progress(done, total);
                }
            }
        }
        Ok(())
    }
}

impl ExpertSource for ContainerExperts {
    fn prepare(&self, layer: usize, experts: &[usize]) -> Result<()> {
        let Some(Some(li)) = self.layers.get(layer) else { return Ok(()) };
        let lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        let misses: Vec<(u64, usize)> = experts
            .iter()
            .filter(|&&e| !lru.map.contains_key(&(layer, e)))
            .filter_map(|&e| li.experts.get(e).map(|&(off, len, _)| (off, len)))
            .collect();
        drop(lru);
        if misses.is_empty() {
            return Ok(());
        }
        self.source.prefetch(&misses)
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        Some(self.stats())
    }

    fn cached(&self) -> Vec<(usize, usize)> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner()).map.keys().copied().collect()
    }

    fn expert(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        let key = (layer, index);
        {
            let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
            let Lru { map, order, tick, .. } = &mut *lru;
            if let Some((x, _, last)) = map.get_mut(&key) {
                order.remove(last);
                *tick += 1;
                *last = *tick;
                order.insert(*tick, key);
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(x.clone());
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let (x, size) = self.read(layer, index)?;
        if self.budget.is_some_and(|b| size > b) {
            return Ok(x);
        }
        let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        if lru.map.contains_key(&key) {
            return Ok(x);
        }
        if let Some(b) = self.budget {
            while lru.bytes + size > b {
                let Some((_, victim)) = lru.order.pop_first() else { break };
                if let Some((_, n, _)) = lru.map.remove(&victim) {
                    lru.bytes -= n;
                }
            }
        }
        lru.tick += 1;
        let t = lru.tick;
        lru.order.insert(t, key);
        lru.map.insert(key, (x.clone(), size, t));
        lru.bytes += size;
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::manifest::{checksum_hex, plan, ExpertLayerPlan, QuantSummary};
    use crate::container::quant::quantize_row;
    use crate::container::MemorySource;

    fn cfg() -> ModelConfig {
        ModelConfig::from_json_bytes(
            br#"{"model_type":"mixtral","hidden_size":8,"intermediate_size":4,"num_hidden_layers":2,
            "num_attention_heads":2,"vocab_size":10,"num_local_experts":3,"num_experts_per_tok":2}"#,
        )
        .unwrap()
    }

    /// A container of random int8 experts in memory, and the f32 values they decode to.
    fn container() -> (Manifest, Vec<u8>, Vec<Vec<f32>>) {
        let dt = DType::Int8 { group: 8 };
        let layers: Vec<ExpertLayerPlan> = (0..2).map(|l| ExpertLayerPlan { layer: l, count: 3, parts: [(dt, [4, 8]), (dt, [4, 8]), (dt, [8, 4])] }).collect();
        let mut m = plan("weights.bin", QuantSummary::default(), serde_json::json!({}), vec![], &[], &layers).unwrap();
        let mut data = vec![0u8; m.data_size as usize];
        let mut gate_rows = Vec::new();
        let mut seed = 3u64;
        for l in &mut m.experts.layers {
            let parts = l.parts.clone();
            for e in &mut l.experts {
                for p in &parts {
                    let (rows, cols) = (p.shape[0] as usize, p.shape[1] as usize);
                    let rb = dt.row_bytes(cols).unwrap();
                    for r in 0..rows {
                        let row: Vec<f32> = (0..cols)
                            .map(|_| {
                                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                            })
                            .collect();
                        let at = (e.offset + p.offset) as usize + r * rb;
                        quantize_row(dt, &row, &mut data[at..at + rb]).unwrap();
                        if p.name == "gate" && r == 0 {
                            let mut out = vec![0.0; cols];
                            crate::tensor::decode_row(dt, cols, &data[at..at + rb], &mut out);
                            gate_rows.push(out);
                        }
                    }
                }
                e.xxh3 = checksum_hex(checksum(&data[e.offset as usize..(e.offset + e.length) as usize]));
            }
        }
        (m, data, gate_rows)
    }

    fn source(data: &[u8]) -> Arc<dyn ByteSource> {
        Arc::new(MemorySource { bytes: Bytes::from_vec(data.to_vec()), name: "mem".into() })
    }

    #[test]
    fn reads_decodes_and_caches_under_the_budget() {
        let (m, data, gate_rows) = container();
        let size = m.experts.layers[0].experts[0].length;
        for (budget, want_misses, want_cached) in [(Some(0), 5, 0), (Some(size), 5, 1), (Some(size * 2), 3, 2), (None, 3, 3)] {
            let x = ContainerExperts::new(&m, &cfg(), source(&data), budget).unwrap();
            for (l, e) in [(0, 0), (1, 2), (0, 0), (0, 1), (0, 0)] {
                let got = x.expert(l, e).unwrap();
                let mut row = vec![0.0; 8];
                got.gate.row_into(0, &mut row);
                assert_eq!(row, gate_rows[l * 3 + e]);
            }
            let s = x.stats();
            assert_eq!((s.misses, s.cached_experts), (want_misses, want_cached), "budget {budget:?}");
            assert!(s.cached_bytes <= budget.unwrap_or(u64::MAX));
        }
    }

    #[test]
    fn corruption_and_mismatches_are_errors() {
        let (m, mut data, _) = container();
        let e = &m.experts.layers[1].experts[2];
        data[(e.offset + 5) as usize] ^= 4;
        let x = ContainerExperts::new(&m, &cfg(), source(&data), None).unwrap();
        let err = x.expert(1, 2).unwrap_err().to_string();
        assert!(err.contains("mem: checksum mismatch in expert 2 of layer 1"), "{err}");
        assert!(x.expert(0, 2).is_ok());
        assert!(x.expert(0, 3).is_err() && x.expert(5, 0).is_err());
        assert!(x.verify_all(&mut |_, _| {}).is_err());
        let short = &data[..data.len() - 1];
        assert!(ContainerExperts::new(&m, &cfg(), source(short), None).unwrap().expert(1, 2).is_err());
        let mut m2 = m.clone();
        m2.experts.layers[0].experts.pop();
        assert!(ContainerExperts::new(&m2, &cfg(), source(&data), None).err().unwrap().to_string().contains("lists 2 experts"));
        let mut m3 = m.clone();
        m3.experts.layers.pop();
        assert!(ContainerExperts::new(&m3, &cfg(), source(&data), None).err().unwrap().to_string().contains("no experts for MoE layer 1"));
    }
}
