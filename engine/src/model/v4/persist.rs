//! DeepSeek-V4's state in a cache file's records (model::kv, docs/format.md): what a
//! record of positions p0..p1 holds per layer is a function of p0 and p1 alone, so a
//! reader checks every size before it reads a float:
//! - the compressed entries made in p0..p1: (p1 / rate - p0 / rate) rows of head_dim, and
//!   on CSA layers the indexer's as many rows of index_head_dim;
//! - the state after p1 that is replaced, not appended: the window's min(p1, window - 1)
//!   keys; the unfinished window's p1 % rate rows of kv then gate (projection width); on
//!   CSA layers the carried Ca halves (kv then gate, rate rows of dim) once p1 >= rate,
//!   and the same for the indexer.
//!
//! Written in that order, layer after layer, little-endian f32.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::config::{ModelConfig, V4Attn};

use super::{CompState, V4LayerState, V4State};

/// The sizes a cache file needs to lay out a V4 state (its header's `"v4"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct V4Layout {
    pub window: usize,
    pub head_dim: usize,
    pub index_dim: usize,
    /// Per layer: the compression rate (0: sliding only) and whether it is CSA.
    pub layers: Vec<(usize, bool)>,
}

/// One compressor's sizes: dim per entry, rate, overlapping windows.
#[derive(Clone, Copy)]
struct Comp {
    dim: usize,
    rate: usize,
    overlap: bool,
}

impl Comp {
    fn width(self) -> usize {
        if self.overlap {
            2 * self.dim
        } else {
            self.dim
        }
    }

    /// Floats of this compressor in a record of p0..p1 (None: overflow).
    fn floats(self, p0: usize, p1: usize) -> Option<usize> {
        let entries = (p1 / self.rate).checked_sub(p0 / self.rate)?.checked_mul(self.dim)?;
        let buf = (p1 % self.rate).checked_mul(self.width())?.checked_mul(2)?;
        let carry = if self.overlap && p1 >= self.rate { 2 * self.rate * self.dim } else { 0 };
        entries.checked_add(buf)?.checked_add(carry)
    }
}

impl V4Layout {
    pub fn of(c: &ModelConfig) -> Option<Self> {
        let v4 = c.v4.as_deref()?;
        Some(V4Layout {
            window: v4.window,
            head_dim: c.head_dim,
            index_dim: v4.index_head_dim,
            layers: v4.layers.iter().map(|&k| (v4.rate_of(k).unwrap_or(0), k == V4Attn::Csa)).collect(),
        })
    }

    /// Layer `l`'s compressors: its own and its indexer's.
    fn comps(&self, l: usize) -> (Option<Comp>, Option<Comp>) {
        match self.layers.get(l).copied() {
            Some((rate, csa)) if rate > 0 => (
                Some(Comp { dim: self.head_dim, rate, overlap: csa }),
                csa.then_some(Comp { dim: self.index_dim, rate, overlap: true }),
            ),
            _ => (None, None),
        }
    }

    /// The most floats a snapshot of a state of at most `n` positions holds (its windows:
    /// the sliding one and the compressors' unfinished ones; not the entries, which a
    /// snapshot counts instead of copying).
    pub fn snapshot_floats_bound(&self, n: usize) -> usize {
        let mut total = 0usize;
        for l in 0..self.layers.len() {
            total = total.saturating_add(n.min(self.window.saturating_sub(1)).saturating_mul(self.head_dim));
            let (a, b) = self.comps(l);
            for c in [a, b].into_iter().flatten() {
                let buf = n.min(c.rate - 1).saturating_mul(c.width()).saturating_mul(2);
                let carry = if c.overlap && n >= c.rate { 2 * c.rate * c.dim } else { 0 };
                total = total.saturating_add(buf).saturating_add(carry);
            }
        }
        total
    }

    /// Floats of a record of positions p0..p1 over every layer (None: overflow or a
    /// layout that cannot be: a zero window, a record ending before it starts).
    pub fn record_floats(&self, p0: usize, p1: usize) -> Option<usize> {
        if self.window == 0 || p1 < p0 {
            return None;
        }
        let mut total = 0usize;
        for l in 0..self.layers.len() {
            total = total.checked_add(p1.min(self.window - 1).checked_mul(self.head_dim)?)?;
            let (a, b) = self.comps(l);
            for c in [a, b].into_iter().flatten() {
                total = total.checked_add(c.floats(p0, p1)?)?;
            }
        }
        Some(total)
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("KV cache file: {what}"))
}

fn put(out: &mut Vec<u8>, xs: &[f32]) {
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn take(floats: &mut &[u8], n: usize) -> Result<Vec<f32>> {
    let bytes = n.checked_mul(4).filter(|&b| b <= floats.len()).ok_or_else(|| bad("a record is cut short"))?;
    let (head, rest) = floats.split_at(bytes);
    *floats = rest;
    Ok(head.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn put_comp(out: &mut Vec<u8>, c: Comp, st: &CompState, p0: usize, p1: usize) -> Result<()> {
    let (e0, e1) = ((p0 / c.rate) * c.dim, (p1 / c.rate) * c.dim);
    let entries = st.entries.get(e0..e1).ok_or_else(|| bad("the state holds fewer entries than its positions"))?;
    put(out, entries);
    let buf = (p1 % c.rate) * c.width();
    if st.buf_kv.len() != buf || st.buf_gate.len() != buf {
        return Err(bad("the state's unfinished window does not match its positions"));
    }
    put(out, &st.buf_kv);
    put(out, &st.buf_gate);
    if c.overlap && p1 >= c.rate {
        let (k, g) = st.overlap.as_ref().ok_or_else(|| bad("the state lacks its carry"))?;
        put(out, k);
        put(out, g);
    }
    Ok(())
}

fn take_comp(floats: &mut &[u8], c: Comp, st: &mut CompState, p0: usize, p1: usize) -> Result<()> {
    if st.entries.len() != (p0 / c.rate) * c.dim {
        return Err(bad("records out of order"));
    }
    let entries = take(floats, (p1 / c.rate - p0 / c.rate) * c.dim)?;
    st.entries.extend(entries);
    let buf = (p1 % c.rate) * c.width();
    st.buf_kv = take(floats, buf)?;
    st.buf_gate = take(floats, buf)?;
    st.overlap = match c.overlap && p1 >= c.rate {
        true => Some((take(floats, c.rate * c.dim)?, take(floats, c.rate * c.dim)?)),
        false => None,
    };
    Ok(())
}

/// Appends the record floats of `s`'s positions p0..p1 (p1: the state's position).
pub fn write(out: &mut Vec<u8>, layout: &V4Layout, s: &V4State, p0: usize) -> Result<()> {
    let p1 = s.pos;
    let empty = V4LayerState::default();
    for l in 0..layout.layers.len() {
        let st = s.layers.get(l).unwrap_or(&empty);
        let window = p1.min(layout.window.saturating_sub(1)) * layout.head_dim;
        if st.window.len() != window {
            return Err(bad(format!("layer {l}'s window does not match its positions")));
        }
        put(out, &st.window);
        let (a, b) = layout.comps(l);
        if let Some(c) = a {
            put_comp(out, c, &st.comp, p0, p1)?;
        }
        if let Some(c) = b {
            put_comp(out, c, &st.index, p0, p1)?;
        }
    }
    Ok(())
}

/// Reads a record of positions p0..p1 into `s` (at p0), which is then at p1.
pub fn read(floats: &mut &[u8], layout: &V4Layout, s: &mut V4State, p0: usize, p1: usize) -> Result<()> {
    if s.pos != p0 {
        return Err(bad("records out of order"));
    }
    s.layers.resize_with(layout.layers.len(), Default::default);
    for (l, st) in s.layers.iter_mut().enumerate() {
        st.window = take(floats, p1.min(layout.window.saturating_sub(1)) * layout.head_dim)?;
        let (a, b) = layout.comps(l);
        if let Some(c) = a {
            take_comp(floats, c, &mut st.comp, p0, p1)?;
        }
        if let Some(c) = b {
            take_comp(floats, c, &mut st.index, p0, p1)?;
        }
    }
    s.pos = p1;
    Ok(())
}
