//! A conversation's cache as a file (docs/format.md, "KV cache files"): what a
//! [`Session`] holds, written after a turn and read back after a restart so that the next
//! turn feeds only its new tokens. Nothing in such a file is trusted: the magic, checksums
//! over every byte, the model's fingerprint, and every size against the model's config are
//! checked before one float is used, and a reader can check a file's length against what
//! its header and record heads say ([`scan`]) before it reads the file.
//!
//! Version 2 (written since conversations are appended to turn by turn; little-endian):
//! ```text
//! b"COLIKV02"                 magic, 8 bytes
//! u32 header_len              then header_len bytes of JSON:
//!   {"fingerprint": "<model fingerprint>", "layers": L,
//!    "widths": [[k_width, v_width], ... one pair per layer],
//!    "states": [[conv, s], ... one pair per layer]}   (absent: no recurrent layer)
//! u64 xxh3-64 of every byte before it
//! then one record per turn, appended:
//!   b"TURN", u32 n            the record's positions
//!   n x u32                   their ids
//!   per layer: k (n * k_width f32), v (n * v_width f32), then a linear-attention
//!     layer's recurrent state after these positions: conv (conv f32), s (s f32)
//!   u64 xxh3-64 of the record from b"TURN" on
//! ```
//! Version 1 (`b"COLIKV01"`, one block: the header JSON also holds `"tokens"`, then every
//! layer's floats and one checksum of every byte before it) is still read; the helper
//! rewrites such a file as version 2 the next time it saves the conversation.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::manifest::checksum;
use crate::model::attention::LayerCache;
use crate::model::config::ModelConfig;
use crate::model::deltanet::DeltaState;
use crate::model::v4::persist::{self, V4Layout};
use crate::model::v4::V4State;
use crate::model::Session;

/// Magic of version 1 files (read, no longer written).
pub const MAGIC: &[u8; 8] = b"COLIKV01";
/// Magic of version 2 files.
pub const MAGIC_V2: &[u8; 8] = b"COLIKV02";
/// Bytes before the JSON header: the magic and its length.
pub const PREFIX_LEN: usize = 12;
/// The largest header accepted (the ids of a 1M-token conversation fit in ~8 MiB).
const MAX_HEADER: usize = 64 << 20;
/// A record's head: b"TURN" and its count of positions.
pub const RECORD_HEAD: usize = 8;
const RECORD_MAGIC: &[u8; 4] = b"TURN";

/// What a cache file says about itself, readable without its floats.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct KvHeader {
    /// Which model the cache belongs to (see the helper's fingerprint).
    pub fingerprint: String,
    pub layers: usize,
    /// The ids whose cache the file holds (version 1: in the header; version 2: gathered
    /// from the records by [`scan`] and [`decode`], never written in the header).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<u32>,
    /// Floats per position of each layer's two parts.
    pub widths: Vec<(usize, usize)>,
    /// Floats of each layer's recurrent state (conv inputs, delta-rule matrices); (0, 0)
    /// for attention layers; empty when the model has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<(usize, usize)>,
    /// DeepSeek-V4's layout: its records hold the state of [`persist`] after the ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v4: Option<V4Layout>,
}

impl KvHeader {
    /// Floats of one position over every layer.
    fn floats_per_position(&self) -> Option<usize> {
        self.widths.iter().try_fold(0usize, |a, &(k, v)| a.checked_add(k)?.checked_add(v))
    }

    /// Floats of every layer's recurrent state.
    fn state_floats(&self) -> Option<usize> {
        self.states.iter().try_fold(0usize, |a, &(c, s)| a.checked_add(c)?.checked_add(s))
    }

    /// Bytes of a version 2 record of `n` positions after the first `from` (None: it
    /// would overflow).
    pub fn record_len(&self, from: usize, n: usize) -> Option<u64> {
        let v4 = match &self.v4 {
            Some(v) => v.record_floats(from, from.checked_add(n)?)?,
            None => 0,
        };
        let floats = n.checked_mul(self.floats_per_position()?)?.checked_add(self.state_floats()?)?.checked_add(v4)?;
        let body = n.checked_add(floats)?.checked_mul(4)?;
        (RECORD_HEAD + 8).checked_add(body).map(|b| b as u64)
    }

    /// Whether a session with header `other` may be appended to a file with this one.
    pub fn same_shape(&self, other: &KvHeader) -> bool {
        self.fingerprint == other.fingerprint
            && self.layers == other.layers
            && self.widths == other.widths
            && self.states == other.states
            && self.v4 == other.v4
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("KV cache file: {what}"))
}

/// A part of the file that fails its checksum.
fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Checksum(format!("KV cache file: {what}"))
}

/// The header of `s` (without ids) and the positions its caches hold.
fn session_header(s: &Session, fingerprint: &str) -> Result<(KvHeader, usize)> {
    // After a cut that a recurrent state could not follow, the caches hold fewer ids.
    let n = s.cached_len();
    if s.v4.is_some() {
        // DeepSeek-V4: no per-position rows; its records hold the state (persist).
        let layers = s.caches.len();
        let h = KvHeader {
            fingerprint: fingerprint.to_string(),
            layers,
            tokens: vec![],
            widths: vec![(0, 0); layers],
            states: vec![],
            v4: s.v4.as_ref().and_then(|v| v.layout.clone()),
        };
        return Ok((h, n));
    }
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
    let h = KvHeader {
        fingerprint: fingerprint.to_string(),
        layers: s.caches.len(),
        tokens: vec![],
        widths,
        states,
        v4: None,
    };
    Ok((h, n))
}

/// The header `s` would be written with (its ids in `tokens`), to compare with a file's
/// ([`KvHeader::same_shape`]) before appending to it.
pub fn header_of(s: &Session, fingerprint: &str) -> Result<KvHeader> {
    let (mut h, n) = session_header(s, fingerprint)?;
    h.tokens = s.tokens[..n].to_vec();
    Ok(h)
}

/// The start of a version 2 file for `s`: magic, header, its checksum; no record.
pub fn encode_header(s: &Session, fingerprint: &str) -> Result<Vec<u8>> {
    let (header, _) = session_header(s, fingerprint)?;
    let json = serde_json::to_vec(&header).map_err(bad)?;
    let mut out = Vec::with_capacity(PREFIX_LEN + json.len() + 8);
    out.extend_from_slice(MAGIC_V2);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// The record of positions `from..` of `s` (what a turn appends to the file that holds
/// the first `from`), with the recurrent states after them. Where a Gated DeltaNet layer
/// holds a snapshot inside `from..` (where a prompt ended: `DeltaState::snapshot`), two
/// records, split there, the first with the snapshot's states: reading the file back makes
/// it a snapshot again ([`decode`]), so a next prompt that parts from the answer (a
/// thinking block dropped, an answer that tokenizes back otherwise) goes back to it instead
/// of feeding the whole conversation again.
pub fn encode_record(s: &Session, fingerprint: &str, from: usize) -> Result<Vec<u8>> {
    let (h, n) = session_header(s, fingerprint)?;
    if from > n {
        return Err(bad(format!("a record from position {from} of a session of {n}")));
    }
    let mut out = Vec::new();
    let mut at = from;
    if let Some(split) = snapshot_split(s, from, n) {
        record(&mut out, s, &h, at, split, Some(split))?;
        at = split;
    }
    record(&mut out, s, &h, at, n, None)?;
    Ok(out)
}

/// The position of a snapshot inside `from..n` that every recurrent layer holds (None:
/// none, or a model without recurrent layers).
fn snapshot_split(s: &Session, from: usize, n: usize) -> Option<usize> {
    let mut states = s.caches.iter().filter_map(|c| c.recurrent.as_deref()).peekable();
    states.peek()?;
    let mut pos = None;
    for r in states {
        let (p, _, _) = r.snapshot_between(from, n)?;
        if pos.is_some_and(|q| q != p) {
            return None;
        }
        pos = Some(p);
    }
    pos
}

/// Appends to `out` the record of positions `from..to` of `s` (header `h`), with each
/// recurrent layer's state after them: the current one, or (`snap`) its snapshot at `to`.
fn record(out: &mut Vec<u8>, s: &Session, h: &KvHeader, from: usize, to: usize, snap: Option<usize>) -> Result<()> {
    let count = to - from;
    let len = h.record_len(from, count).ok_or_else(|| bad("record too large"))?;
    let start = out.len();
    out.reserve(len as usize);
    out.extend_from_slice(RECORD_MAGIC);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    for t in &s.tokens[from..to] {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for (c, &(kw, vw)) in s.caches.iter().zip(&h.widths) {
        let (k, v) = (&c.k[from * kw..to * kw], &c.v[from * vw..to * vw]);
        let state = match (c.recurrent.as_deref(), snap) {
            (Some(r), Some(p)) => match r.snapshot_between(p - 1, p + 1) {
                Some((_, conv, st)) => Some((conv, st)),
                None => return Err(bad(format!("no snapshot at position {p}"))),
            },
            (Some(r), None) => Some((&r.conv[..], &r.s[..])),
            (None, _) => None,
        };
        let state = state.map(|(conv, st)| conv.iter().chain(st));
        for x in k.iter().chain(v).chain(state.into_iter().flatten()) {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    if let (Some(layout), Some(v)) = (&h.v4, &s.v4) {
        persist::write(out, layout, v, from)?;
    }
    let sum = checksum(&out[start..]);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(())
}

/// The file's bytes for `s`, whose model has `fingerprint` (the ids its caches hold):
/// version 2, the header and one record of every position.
pub fn encode(s: &Session, fingerprint: &str) -> Result<Vec<u8>> {
    let mut out = encode_header(s, fingerprint)?;
    if s.cached_len() > 0 {
        out.extend(encode_record(s, fingerprint, 0)?);
    }
    Ok(out)
}

/// The file's version (1 or 2) and its header's length from its first [`PREFIX_LEN`] bytes.
pub fn version_and_header_len(prefix: &[u8]) -> Result<(u32, usize)> {
    let version = match prefix.get(..8) {
        Some(m) if prefix.len() >= PREFIX_LEN && m == MAGIC => 1,
        Some(m) if prefix.len() >= PREFIX_LEN && m == MAGIC_V2 => 2,
        _ => return Err(bad("not a colibri KV cache file (magic)")),
    };
    let n = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize;
    if n > MAX_HEADER {
        return Err(bad(format!("header of {n} bytes")));
    }
    Ok((version, n))
}

/// The header's length from the file's first [`PREFIX_LEN`] bytes.
pub fn header_len(prefix: &[u8]) -> Result<usize> {
    version_and_header_len(prefix).map(|(_, n)| n)
}

/// The header from the file's first `PREFIX_LEN + header_len` bytes (or more); its
/// fingerprint and shapes are not checked here (see [`decode`]). A version 2 header holds
/// no ids (they are in the records: [`scan`]).
pub fn read_header(bytes: &[u8]) -> Result<KvHeader> {
    let n = header_len(bytes)?;
    let json = bytes.get(PREFIX_LEN..PREFIX_LEN + n).ok_or_else(|| bad("truncated header"))?;
    serde_json::from_slice(json).map_err(|e| bad(format!("header: {e}")))
}

/// What [`scan`] learns of a file from its header and record heads.
#[derive(Clone, Debug, PartialEq)]
pub struct Scanned {
    /// The header, with every record's ids in `tokens`.
    pub header: KvHeader,
    pub version: u32,
    /// The file's length as its header and records describe it.
    pub len: u64,
}

/// Reads a cache file's header and ids with small reads (`read(offset, buf)` fills `buf`
/// from the file, `file_len` bytes long), checking every size against the file's length
/// on the way: a file whose length is not what its header (version 1) or its records
/// (version 2) describe is refused before any float is read. Checksums are left to
/// [`decode`]; `max_positions` bounds the ids.
pub fn scan(
    read: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    file_len: u64,
    max_positions: usize,
) -> Result<Scanned> {
    let mut prefix = [0u8; PREFIX_LEN];
    if file_len < PREFIX_LEN as u64 {
        return Err(bad("truncated"));
    }
    read(0, &mut prefix)?;
    let (version, n) = version_and_header_len(&prefix)?;
    let head_end = (PREFIX_LEN + n) as u64;
    if head_end > file_len {
        return Err(bad("truncated header"));
    }
    let mut bytes = prefix.to_vec();
    bytes.resize(PREFIX_LEN + n, 0);
    read(PREFIX_LEN as u64, &mut bytes[PREFIX_LEN..])?;
    let mut header = read_header(&bytes)?;
    if header.widths.len() != header.layers || !(header.states.is_empty() || header.states.len() == header.layers) {
        return Err(bad(format!(
            "{} widths and {} states for {} layers",
            header.widths.len(),
            header.states.len(),
            header.layers
        )));
    }
    if version == 1 {
        if header.tokens.len() > max_positions {
            return Err(bad(format!("{} positions; at most {max_positions}", header.tokens.len())));
        }
        // Version 1 keeps recurrent states only for a conversation of some positions.
        let n = header.tokens.len();
        let floats = header
            .floats_per_position()
            .and_then(|f| f.checked_mul(n))
            .and_then(|f| f.checked_add(if n > 0 { header.state_floats()? } else { 0 }));
        let len = floats.and_then(|f| (f as u64).checked_mul(4)).and_then(|b| b.checked_add(head_end + 8));
        return match len {
            Some(len) if len == file_len => Ok(Scanned { header, version, len }),
            _ => Err(bad(format!("{file_len} bytes, but its header describes {len:?}"))),
        };
    }
    if !header.tokens.is_empty() {
        return Err(bad("a version 2 header holds no ids"));
    }
    let mut at = head_end + 8;
    if at > file_len {
        return Err(bad("truncated header"));
    }
    while at < file_len {
        let mut head = [0u8; RECORD_HEAD];
        if at + RECORD_HEAD as u64 > file_len {
            return Err(bad(format!("a record at byte {at} is cut short")));
        }
        read(at, &mut head)?;
        if &head[..4] != RECORD_MAGIC {
            return Err(bad(format!("no record at byte {at}")));
        }
        let count = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let len = header.record_len(header.tokens.len(), count).filter(|&l| l <= file_len - at);
        let Some(len) = len else { return Err(bad(format!("the record at byte {at} runs past the end of the file"))) };
        if header.tokens.len() + count > max_positions {
            return Err(bad(format!("more than {max_positions} positions")));
        }
        let mut ids = vec![0u8; count * 4];
        read(at + RECORD_HEAD as u64, &mut ids)?;
        header.tokens.extend(ids.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        at += len;
    }
    Ok(Scanned { header, version, len: at })
}

/// Checks `h` (fingerprint, layers, widths, states, ids) against `cfg`; returns what
/// each layer must hold: (floats per position, recurrent state's (conv, s)).
fn check_header(h: &KvHeader, n: usize, fingerprint: &str, cfg: &ModelConfig) -> Result<Vec<(usize, (usize, usize))>> {
    if h.fingerprint != fingerprint {
        return Err(bad(format!("made by another model (fingerprint {} instead of {fingerprint})", h.fingerprint)));
    }
    if h.layers != cfg.n_layers || h.widths.len() != cfg.n_layers {
        return Err(bad(format!("{} layers; the model has {}", h.layers, cfg.n_layers)));
    }
    if n > cfg.max_positions {
        return Err(bad(format!("{n} positions; the model's context is {}", cfg.max_positions)));
    }
    if !(h.states.is_empty() || h.states.len() == h.layers) {
        return Err(bad(format!("{} recurrent states for {} layers", h.states.len(), h.layers)));
    }
    if h.v4 != V4Layout::of(cfg) {
        return Err(bad("its DeepSeek-V4 layout is not the model's"));
    }
    let want = |l: usize| match &cfg.linear_attn {
        // DeepSeek-V4's records hold its state, no per-position rows (see session_header).
        _ if cfg.v4.is_some() => (0, (0, 0)),
        Some(la) if la.layers.get(l) == Some(&true) => {
            (0, ((la.conv_kernel - 1) * la.conv_dim(), la.n_v_heads * la.k_head_dim * la.v_head_dim))
        }
        _ => (cfg.cache_floats_at(l), (0, 0)),
    };
    let mut out = Vec::with_capacity(h.layers);
    for (l, &(kw, vw)) in h.widths.iter().enumerate() {
        let state = h.states.get(l).copied().unwrap_or((0, 0));
        let (w, st) = want(l);
        if n > 0 && (kw + vw != w || state != st) {
            return Err(bad(format!(
                "layer {l} holds {} floats per position and a state of {state:?}; the model {w} and {st:?}",
                kw + vw
            )));
        }
        out.push((w, st));
    }
    Ok(out)
}

fn check_ids(ids: &[u32], cfg: &ModelConfig) -> Result<()> {
    match ids.iter().find(|&&t| t as usize >= cfg.vocab) {
        Some(&bad_id) => Err(bad(format!("token id {bad_id} outside the vocabulary"))),
        None => Ok(()),
    }
}

/// Takes `count` f32 from the front of `floats`.
fn take(floats: &mut &[u8], count: usize) -> Result<Vec<f32>> {
    let len = count.checked_mul(4).filter(|&b| b <= floats.len()).ok_or_else(|| bad("truncated floats"))?;
    let (now, rest) = floats.split_at(len);
    *floats = rest;
    Ok(now.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// The session in `bytes` (a whole file of either version), checked: magic, checksums,
/// `fingerprint`, and every layer's widths against `cfg` (the cache of another model is
/// refused, even one of the same shape but another fingerprint).
pub fn decode(bytes: &[u8], fingerprint: &str, cfg: &ModelConfig) -> Result<Session> {
    let (version, hlen) = version_and_header_len(bytes)?;
    if version == 1 {
        return decode_v1(bytes, fingerprint, cfg);
    }
    let h = read_header(bytes)?;
    let head_end = PREFIX_LEN + hlen;
    let sum = bytes.get(head_end..head_end + 8).ok_or_else(|| bad("truncated header"))?;
    if checksum(&bytes[..head_end]) != u64::from_le_bytes(sum.try_into().map_err(|_| bad("truncated"))?) {
        return Err(corrupt("header checksum mismatch (corrupt)"));
    }
    if !h.tokens.is_empty() {
        return Err(bad("a version 2 header holds no ids"));
    }
    check_header(&h, 0, fingerprint, cfg)?;
    let mut caches = vec![LayerCache::default(); h.layers];
    let mut tokens = Vec::new();
    let mut v4: Option<Box<V4State>> = None;
    let mut rest = &bytes[head_end + 8..];
    while !rest.is_empty() {
        let at = bytes.len() - rest.len();
        if rest.len() < RECORD_HEAD || &rest[..4] != RECORD_MAGIC {
            return Err(bad(format!("no record at byte {at}")));
        }
        let n = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
        if tokens.len() + n > cfg.max_positions {
            return Err(bad(format!("more than {} positions; the model's context", cfg.max_positions)));
        }
        let len = h
            .record_len(tokens.len(), n)
            .and_then(|l| usize::try_from(l).ok())
            .filter(|&l| l <= rest.len())
            .ok_or_else(|| bad(format!("the record at byte {at} runs past the end of the file (truncated?)")))?;
        let (record, sum) = rest[..len].split_at(len - 8);
        if checksum(record) != u64::from_le_bytes(sum.try_into().map_err(|_| bad("truncated"))?) {
            return Err(corrupt(format!("checksum mismatch in the record at byte {at} (truncated or corrupt)")));
        }
        rest = &rest[len..];
        // Widths and states are checked against the model once the file holds a position.
        check_header(&h, tokens.len() + n, fingerprint, cfg)?;
        let (ids, mut floats) = record[RECORD_HEAD..].split_at(4 * n);
        let ids: Vec<u32> = ids.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        check_ids(&ids, cfg)?;
        tokens.extend(ids);
        for (l, (c, &(kw, vw))) in caches.iter_mut().zip(&h.widths).enumerate() {
            let k = take(&mut floats, n * kw)?;
            let v = take(&mut floats, n * vw)?;
            if n > 0 {
                c.append(&k, &v, kw, vw);
            }
            let st = h.states.get(l).copied().unwrap_or((0, 0));
            if st != (0, 0) {
                let (conv, s) = (take(&mut floats, st.0)?, take(&mut floats, st.1)?);
                // An earlier record's state becomes a snapshot where that record ended.
                c.recurrent.get_or_insert_with(Box::<DeltaState>::default).advance_to(tokens.len(), conv, s);
            }
        }
        if let Some(layout) = &h.v4 {
            let st = v4.get_or_insert_with(|| Box::new(V4State::new(Some(layout.clone()))));
            // An earlier record's state becomes a snapshot where that record ended.
            st.snapshot();
            persist::read(&mut floats, layout, st, tokens.len() - n, tokens.len())?;
        }
        if !floats.is_empty() {
            return Err(bad(format!("{} bytes after the last layer of the record at byte {at}", floats.len())));
        }
    }
    if v4.is_none() {
        v4 = h.v4.as_ref().map(|l| Box::new(V4State::new(Some(l.clone()))));
    }
    Ok(Session { caches, tokens, v4 })
}

/// `bytes` (a version 2 file, perhaps mangled) with its header's and every whole record's
/// checksum recomputed, so that a fuzzer reaches the checks behind the checksums; None if
/// it is not a version 2 file with a readable header.
pub fn reseal(bytes: &[u8]) -> Option<Vec<u8>> {
    let (version, hlen) = version_and_header_len(bytes).ok()?;
    let h = read_header(bytes).ok().filter(|_| version == 2)?;
    let head_end = PREFIX_LEN + hlen;
    let mut out = bytes.get(..head_end)?.to_vec();
    out.extend_from_slice(&checksum(&out).to_le_bytes());
    let mut rest = bytes.get(head_end + 8..).unwrap_or_default();
    let mut pos = 0usize;
    while rest.len() >= RECORD_HEAD {
        let n = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
        match h.record_len(pos, n).and_then(|l| usize::try_from(l).ok()).filter(|&l| l <= rest.len()) {
            Some(len) => {
                pos = pos.saturating_add(n);
                let body = &rest[..len - 8];
                out.extend_from_slice(body);
                out.extend_from_slice(&checksum(body).to_le_bytes());
                rest = &rest[len..];
            }
            None => break,
        }
    }
    out.extend_from_slice(rest);
    Some(out)
}

fn decode_v1(bytes: &[u8], fingerprint: &str, cfg: &ModelConfig) -> Result<Session> {
    let h = read_header(bytes)?;
    if bytes.len() < PREFIX_LEN + 8 {
        return Err(bad("truncated"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    let want = u64::from_le_bytes(sum.try_into().map_err(|_| bad("truncated"))?);
    if checksum(body) != want {
        return Err(corrupt("checksum mismatch (truncated or corrupt)"));
    }
    let n = h.tokens.len();
    let layers = check_header(&h, n, fingerprint, cfg)?;
    check_ids(&h.tokens, cfg)?;
    let mut floats = body.get(PREFIX_LEN + header_len(bytes)?..).ok_or_else(|| bad("truncated header"))?;
    let mut caches = Vec::with_capacity(h.layers);
    for (l, &(kw, vw)) in h.widths.iter().enumerate() {
        let st = layers[l].1;
        let k = take(&mut floats, n * kw)?;
        let v = take(&mut floats, n * vw)?;
        let mut c = LayerCache::default();
        if n > 0 {
            c.append(&k, &v, kw, vw);
        }
        if n > 0 && st != (0, 0) {
            let mut r = DeltaState::default();
            r.conv = take(&mut floats, st.0)?;
            r.s = take(&mut floats, st.1)?;
            r.pos = n;
            c.recurrent = Some(Box::new(r));
        }
        caches.push(c);
    }
    if !floats.is_empty() {
        return Err(bad(format!("{} bytes after the last layer", floats.len())));
    }
    Ok(Session { caches, tokens: h.tokens, v4: None })
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
        Session { caches, tokens: (0..n as u32).map(|i| i * 3 % c.vocab as u32).collect(), v4: None }
    }

    /// A version 1 file, as colibri wrote them before version 2.
    fn encode_v1(s: &Session, fingerprint: &str) -> Vec<u8> {
        let mut h = header_of(s, fingerprint).unwrap();
        h.tokens = s.tokens.clone();
        let json = serde_json::to_vec(&h).unwrap();
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        for c in &s.caches {
            for x in c.k.iter().chain(&c.v) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    fn scan_bytes(b: &[u8], len: u64) -> Result<Scanned> {
        scan(
            &mut |at, buf| {
                let src = b.get(at as usize..at as usize + buf.len()).ok_or_else(|| bad("past the end"))?;
                buf.copy_from_slice(src);
                Ok(())
            },
            len,
            1 << 20,
        )
    }

    fn same(a: &Session, b: &Session) {
        assert_eq!(a.tokens, b.tokens);
        for (x, y) in a.caches.iter().zip(&b.caches) {
            assert_eq!((x.k.as_slice(), x.v.as_slice(), x.len()), (y.k.as_slice(), y.v.as_slice(), y.len()));
        }
    }

    #[test]
    fn a_file_round_trips_and_nothing_bad_is_trusted() {
        let c = cfg();
        let s = session(&c, 5);
        let bytes = encode(&s, "abc").unwrap();
        let head = PREFIX_LEN + header_len(&bytes).unwrap() + 8;
        assert_eq!(bytes.len(), head + RECORD_HEAD + s.bytes() + 8);
        same(&decode(&bytes, "abc", &c).unwrap(), &s);
        let scanned = scan_bytes(&bytes, bytes.len() as u64).unwrap();
        assert_eq!(
            (scanned.header.tokens.as_slice(), scanned.version, scanned.len),
            (&s.tokens[..], 2, bytes.len() as u64)
        );
        // Every single flipped byte is caught (header, ids, floats or a checksum itself).
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b, "abc", &c).is_err(), "byte {i} flipped was trusted");
        }
        for cut in [0, 3, 11, 12, 40, head - 1, head + 3, bytes.len() - 9, bytes.len() - 1] {
            assert!(decode(&bytes[..cut], "abc", &c).is_err(), "cut at {cut} was trusted");
            assert!(scan_bytes(&bytes[..cut], cut as u64).is_err(), "cut at {cut} scanned");
        }
        let e = decode(&bytes, "other", &c).err().expect("another model").to_string();
        assert!(e.contains("another model"), "{e}");
        let mut other = c.clone();
        other.n_layers += 1;
        assert!(decode(&bytes, "abc", &other).is_err());
        // An empty session is a valid (useless) file.
        let empty = Session { caches: vec![LayerCache::default(); c.n_layers], tokens: vec![], v4: None };
        assert!(decode(&encode(&empty, "abc").unwrap(), "abc", &c).unwrap().tokens.is_empty());
    }

    #[test]
    fn turns_are_appended_and_old_files_still_read() {
        let c = cfg();
        let (s3, s5) = (session(&c, 3), session(&c, 5));
        // session(5)'s first three positions are not session(3)'s: build 5 as 3 + 2 more.
        let mut s = s3.clone();
        for (l, lc) in s.caches.iter_mut().enumerate() {
            let w = c.cache_floats_per_layer() / 2;
            lc.append(&s5.caches[l].k[3 * w..], &s5.caches[l].v[3 * w..], w, w);
        }
        s.tokens.extend_from_slice(&s5.tokens[3..]);
        let mut file = encode(&s3, "abc").unwrap();
        let first = file.clone();
        file.extend(encode_record(&s, "abc", 3).unwrap());
        assert!(file.starts_with(&first), "a turn only appends");
        same(&decode(&file, "abc", &c).unwrap(), &s);
        let sc = scan_bytes(&file, file.len() as u64).unwrap();
        assert_eq!(sc.header.tokens, s.tokens);
        assert!(sc.header.same_shape(&header_of(&s, "abc").unwrap()));
        // A record cut short (a crash mid-append) or a file longer than its records say
        // (a sparse file behind a real header) is refused from its sizes alone.
        let cut = &file[..file.len() - 10];
        assert!(scan_bytes(cut, cut.len() as u64).is_err());
        let e = scan_bytes(&file, 3 << 30).unwrap_err().to_string();
        assert!(e.contains("no record") || e.contains("past the end"), "{e}");
        // Version 1 files read as before, and their length is checked against the header.
        let v1 = encode_v1(&s5, "abc");
        same(&decode(&v1, "abc", &c).unwrap(), &s5);
        let sc = scan_bytes(&v1, v1.len() as u64).unwrap();
        assert_eq!((sc.version, sc.header.tokens.len()), (1, 5));
        let e = scan_bytes(&v1, 3 << 30).unwrap_err().to_string();
        assert!(e.contains("header describes"), "{e}");
        // Resealing (what the fuzzer does) keeps a good file good.
        assert_eq!(reseal(&file).unwrap(), file);
    }

    /// A Gated DeltaNet conversation's file keeps the snapshot where its prompt ended (its
    /// record split there): read back, a next prompt that parts from the answer there goes
    /// back to it (4 positions kept, not 0) with the logits of feeding that prompt afresh;
    /// appended turns keep theirs too.
    #[test]
    fn a_prompts_end_snapshot_survives_the_file() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_next");
        let model = crate::Model::open_dir(&dir).unwrap();
        let last = crate::Logits::Last;
        let mut s = model.new_session();
        model.forward(&mut s, &[1, 2, 3, 4], last).unwrap();
        for t in [5, 6, 7] {
            model.forward(&mut s, &[t], last).unwrap();
        }
        let file = encode(&s, "abc").unwrap();
        let head = PREFIX_LEN + header_len(&file).unwrap() + 8;
        assert_eq!(&file[head..head + 8], b"TURN\x04\0\0\0", "the first record ends where the prompt did");
        assert_eq!(scan_bytes(&file, file.len() as u64).unwrap().header.tokens, vec![1, 2, 3, 4, 5, 6, 7]);
        let mut back = decode(&file, "abc", &model.cfg).unwrap();
        assert_eq!(back.cached_len(), 7);
        back.truncate(4);
        assert_eq!(back.cached_len(), 4, "back to the prompt's end, not the start");
        let got = model.forward(&mut back, &[9, 10], last).unwrap();
        let mut fresh = model.new_session();
        let want = model.forward(&mut fresh, &[1, 2, 3, 4, 9, 10], last).unwrap();
        assert_eq!(got, want);
        // A second turn appended: its prompt's end survives as well.
        let held = s.tokens.len();
        model.forward(&mut s, &[8, 11, 12], last).unwrap();
        model.forward(&mut s, &[13], last).unwrap();
        model.forward(&mut s, &[14], last).unwrap();
        let mut two = file.clone();
        two.extend(encode_record(&s, "abc", held).unwrap());
        let mut back = decode(&two, "abc", &model.cfg).unwrap();
        assert_eq!(back.cached_len(), 12);
        back.truncate(11);
        assert_eq!(back.cached_len(), 10, "the second prompt's end");
    }
}
