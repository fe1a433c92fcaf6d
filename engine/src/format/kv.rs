//! A conversation's cache as a file (docs/format.md, "KV cache files"): what a
//! [`Session`] holds, written after a turn and read back after a restart so that the next
//! turn feeds only its new tokens. Nothing in such a file is trusted: the magic, a
//! checksum over every byte, the model's fingerprint, and every size against the model's
//! config are checked before one float is used.
//!
//! Layout (little-endian):
//! ```text
//! b"COLIKV01"                 magic, 8 bytes
//! u32 header_len              then header_len bytes of JSON:
//!   {"fingerprint": "<model fingerprint>", "layers": L, "tokens": [ids...],
//!    "widths": [[k_width, v_width], ... one pair per layer],
//!    "states": [[conv, s], ... one pair per layer]}   (absent: no recurrent layer)
//! per layer: k (tokens * k_width f32), then v (tokens * v_width f32), then a
//!   linear-attention layer's recurrent state: conv (conv f32), then s (s f32)
//! u64 xxh3-64 of every byte before it
//! ```

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::manifest::checksum;
use crate::model::attention::LayerCache;
use crate::model::config::ModelConfig;
use crate::model::deltanet::DeltaState;
use crate::model::Session;

pub const MAGIC: &[u8; 8] = b"COLIKV01";
/// Bytes before the JSON header: the magic and its length.
pub const PREFIX_LEN: usize = 12;
/// The largest header accepted (the ids of a 1M-token conversation fit in ~8 MiB).
const MAX_HEADER: usize = 64 << 20;

/// What a cache file says about itself, readable without its floats.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct KvHeader {
    /// Which model the cache belongs to (see the helper's fingerprint).
    pub fingerprint: String,
    pub layers: usize,
    /// The ids whose cache the file holds.
    pub tokens: Vec<u32>,
    /// Floats per position of each layer's two parts.
    pub widths: Vec<(usize, usize)>,
    /// Floats of each layer's recurrent state (conv inputs, delta-rule matrices); (0, 0)
    /// for attention layers; empty when the model has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<(usize, usize)>,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("KV cache file: {what}"))
}

/// The file's bytes for `s`, whose model has `fingerprint` (the ids its caches hold).
pub fn encode(s: &Session, fingerprint: &str) -> Result<Vec<u8>> {
    // After a cut that a recurrent state could not follow, the caches hold fewer ids.
    let n = s.cached_len();
    let mut widths = Vec::with_capacity(s.caches.len());
    let mut states = Vec::with_capacity(s.caches.len());
    for (l, c) in s.caches.iter().enumerate() {
        if c.len() != n && !(n == 0 && c.is_empty()) {
            return Err(bad(format!("layer {l} caches {} positions for {n} ids", c.len())));
        }
        widths.push((c.k.len().checked_div(n).unwrap_or(0), c.v.len().checked_div(n).unwrap_or(0)));
        states.push(c.recurrent.as_ref().map_or((0, 0), |r| (r.conv.len(), r.s.len())));
    }
    if states.iter().all(|&st| st == (0, 0)) {
        states.clear();
    }
    let header = KvHeader {
        fingerprint: fingerprint.to_string(),
        layers: s.caches.len(),
        tokens: s.tokens[..n].to_vec(),
        widths,
        states,
    };
    let json = serde_json::to_vec(&header).map_err(bad)?;
    let mut out = Vec::with_capacity(PREFIX_LEN + json.len() + s.bytes() + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    for c in &s.caches {
        let state = c.recurrent.as_ref().map(|r| r.conv.iter().chain(&r.s));
        for x in c.k.iter().chain(&c.v).chain(state.into_iter().flatten()) {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// The header's length from the file's first [`PREFIX_LEN`] bytes.
pub fn header_len(prefix: &[u8]) -> Result<usize> {
    if prefix.len() < PREFIX_LEN || &prefix[..8] != MAGIC {
        return Err(bad("not a colibri KV cache file (magic)"));
    }
    let n = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize;
    if n > MAX_HEADER {
        return Err(bad(format!("header of {n} bytes")));
    }
    Ok(n)
}

/// The header from the file's first `PREFIX_LEN + header_len` bytes (or more); its
/// fingerprint and shapes are not checked here (see [`decode`]).
pub fn read_header(bytes: &[u8]) -> Result<KvHeader> {
    let n = header_len(bytes)?;
    let json = bytes.get(PREFIX_LEN..PREFIX_LEN + n).ok_or_else(|| bad("truncated header"))?;
    serde_json::from_slice(json).map_err(|e| bad(format!("header: {e}")))
}

/// The session in `bytes`, checked: magic, checksum, `fingerprint`, and every layer's
/// widths against `cfg` (the cache of another model is refused, even one of the same shape
/// but another fingerprint).
pub fn decode(bytes: &[u8], fingerprint: &str, cfg: &ModelConfig) -> Result<Session> {
    let h = read_header(bytes)?;
    if bytes.len() < PREFIX_LEN + 8 {
        return Err(bad("truncated"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    let want = u64::from_le_bytes(sum.try_into().map_err(|_| bad("truncated"))?);
    if checksum(body) != want {
        return Err(bad("checksum mismatch (truncated or corrupt)"));
    }
    if h.fingerprint != fingerprint {
        return Err(bad(format!("made by another model (fingerprint {} instead of {fingerprint})", h.fingerprint)));
    }
    let n = h.tokens.len();
    if h.layers != cfg.n_layers || h.widths.len() != cfg.n_layers {
        return Err(bad(format!("{} layers; the model has {}", h.layers, cfg.n_layers)));
    }
    if n > cfg.max_positions {
        return Err(bad(format!("{n} positions; the model's context is {}", cfg.max_positions)));
    }
    if let Some(&bad_id) = h.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
        return Err(bad(format!("token id {bad_id} outside the vocabulary")));
    }
    let per_layer = cfg.cache_floats_per_layer();
    // What each layer must hold: (floats per position, recurrent state's (conv, s)).
    let want = |l: usize| match &cfg.linear_attn {
        Some(la) if la.layers.get(l) == Some(&true) => {
            (0, ((la.conv_kernel - 1) * la.conv_dim(), la.n_v_heads * la.k_head_dim * la.v_head_dim))
        }
        _ => (per_layer, (0, 0)),
    };
    if !(h.states.is_empty() || h.states.len() == h.layers) {
        return Err(bad(format!("{} recurrent states for {} layers", h.states.len(), h.layers)));
    }
    let mut floats = &body[PREFIX_LEN + header_len(bytes)?..];
    let mut caches = Vec::with_capacity(h.layers);
    for (l, &(kw, vw)) in h.widths.iter().enumerate() {
        let state = h.states.get(l).copied().unwrap_or((0, 0));
        let (w, st) = want(l);
        if n > 0 && (kw + vw != w || state != st) {
            return Err(bad(format!(
                "layer {l} holds {} floats per position and a state of {state:?}; the model {w} and {st:?}",
                kw + vw
            )));
        }
        let mut take = |count: usize| -> Result<Vec<f32>> {
            let len = count.checked_mul(4).filter(|&b| b <= floats.len()).ok_or_else(|| bad("truncated floats"))?;
            let (now, rest) = floats.split_at(len);
            floats = rest;
            Ok(now.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        };
        let k = take(n * kw)?;
        let v = take(n * vw)?;
        let mut c = LayerCache::default();
        if n > 0 {
            c.append(&k, &v, kw, vw);
        }
        if n > 0 && st != (0, 0) {
            let mut r = DeltaState::default();
            r.conv = take(st.0)?;
            r.s = take(st.1)?;
            r.pos = n;
            c.recurrent = Some(Box::new(r));
        }
        caches.push(c);
    }
    if !floats.is_empty() {
        return Err(bad(format!("{} bytes after the last layer", floats.len())));
    }
    Ok(Session { caches, tokens: h.tokens })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::ModelConfig;

    fn cfg() -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_moe");
        ModelConfig::from_json_bytes(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
    }

    fn session(c: &ModelConfig, n: usize) -> Session {
        let w = c.cache_floats_per_layer() / 2;
        let caches = (0..c.n_layers)
            .map(|l| {
                let mut lc = LayerCache::default();
                let k: Vec<f32> = (0..n * w).map(|i| (i + l) as f32 * 0.5).collect();
                let v: Vec<f32> = (0..n * w).map(|i| -((i * l) as f32)).collect();
                lc.append(&k, &v, w, w);
                lc
            })
            .collect();
        Session { caches, tokens: (0..n as u32).map(|i| i * 3 % c.vocab as u32).collect() }
    }

    #[test]
    fn a_file_round_trips_and_nothing_bad_is_trusted() {
        let c = cfg();
        let s = session(&c, 5);
        let bytes = encode(&s, "abc").unwrap();
        assert_eq!(bytes.len(), PREFIX_LEN + header_len(&bytes).unwrap() + s.bytes() - 4 * 5 + 8);
        let back = decode(&bytes, "abc", &c).unwrap();
        assert_eq!(back.tokens, s.tokens);
        for (a, b) in back.caches.iter().zip(&s.caches) {
            assert_eq!((a.k.as_slice(), a.v.as_slice(), a.len()), (b.k.as_slice(), b.v.as_slice(), 5));
        }
        assert_eq!(read_header(&bytes).unwrap().tokens, s.tokens);
        // Every single flipped byte is caught (header, floats or the checksum itself).
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b, "abc", &c).is_err(), "byte {i} flipped was trusted");
        }
        for cut in [0, 3, 11, 12, 40, bytes.len() - 9, bytes.len() - 1] {
            assert!(decode(&bytes[..cut], "abc", &c).is_err(), "cut at {cut} was trusted");
        }
        let e = decode(&bytes, "other", &c).err().expect("another model").to_string();
        assert!(e.contains("another model"), "{e}");
        let mut other = c.clone();
        other.n_layers += 1;
        assert!(decode(&bytes, "abc", &other).is_err());
        // An empty session is a valid (useless) file.
        let empty = Session { caches: vec![LayerCache::default(); c.n_layers], tokens: vec![] };
        assert!(decode(&encode(&empty, "abc").unwrap(), "abc", &c).unwrap().tokens.is_empty());
    }
}
