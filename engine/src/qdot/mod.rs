//! Quantized dot products with integer inner loops (numerics: docs/kernels.md).
//!
//! For a weight row stored int8 or int4 with group G and an f32 activation row x:
//! - x is quantized once per matrix call, block b = columns [bG, min((b+1)G, cols)):
//!   amax = max |x_i|; d_b = amax / 127, q_i = clamp(round_ties_even(x_i * (127 / amax)),
//!   -127, 127) ([`ActQ::quantize`]);
//! - isum_b = sum q_i * w_i in i32: exact in any order and SIMD width;
//! - y = reduce8(acc) with acc[b mod 8] += (ws_b * d_b) * f32(isum_b), blocks in increasing
//!   order, every product rounded on its own (no FMA).
//!
//! [`dot_row_scalar`] is the reference; the SIMD paths (x86-64 AVX2 and AVX-512 VNNI,
//! aarch64 NEON with or without dotprod, wasm SIMD128) only change how the integer sums are
//! formed, so they give its bits by construction, as does the WGSL twin
//! (shaders/qmatmul.wgsl). `COLIBRI_SIMD=scalar` (or `avx2`, `avx512`, `neon`,
//! `neon+dotprod`) forces a path; tests run every available one.
//!
//! MXFP4 rows (gpt-oss's experts) have their own kernel in [`mxfp4`]: int16 activations in
//! two parts, the same fixed float combination.
//!
//! Q4K rows (tensor::DType::Q4K: GGUF Q4_K blocks kept) are int4 rows of group 32 whose
//! scales are Q4_K headers, value = A_b * u - B_b with u the stored nibble: activations as
//! for int4/g32 with [`ActQ::set_k4`], isum_b = sum u_i * q_i (the int4 kernels' sums
//! before their `- 8 sum q`), and acc[b mod 8] += (A_b * d_b) * f32(isum_b) - B_b * ds_b
//! with ds_b = d_b * f32(sum q) ([`dot_row_scalar`]). Every SIMD path's one-position
//! kernel takes them (x86 also its few-position one); wasm and NEON prepare them for many
//! positions ([`prepares_k4`]: their tiles with the Q4K step).

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_tile;
#[cfg(target_arch = "x86_64")]
mod tile;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[allow(dead_code)]
mod wasm;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm_few;
#[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
pub mod wasm_form;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm_int;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm_k;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm_rows;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm_tile;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_few;
#[cfg(target_arch = "x86_64")]
mod x86_rows;
#[cfg(target_arch = "x86_64")]
mod x86_runs;
#[cfg(target_arch = "x86_64")]
mod x86_wide;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_runs::float_prefetch;

/// Whether the CPU says "GenuineIntel" (x86-64; false elsewhere): where the kernels' speed
/// differs by vendor (prefetch distances, `coli bench-kernels --check`'s FP8 floor).
pub fn cpu_is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86_runs::is_intel();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

pub mod check;
pub mod mxfp4;

#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use half::f16;

use crate::math::reduce8;

/// Largest quantization group the integer kernels accept (defined with the stored types).
pub use crate::tensor::MAX_GROUP;

/// Values per SIMD chunk: groups that are a multiple of it take the fast paths, and int4
/// activations are stored per chunk in nibble order ([`ActQ::split`]).
pub const CHUNK: usize = 32;

/// Blocks whose max |x| is below 2^-64 count as zero: this keeps 127 / amax finite and
/// every later product a normal f32, which GPUs (that may flush subnormals) need to agree.
const TINY_BITS: u32 = 0x1f80_0000;

/// Which implementation computes the integer sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    Scalar,
    Avx2,
    Avx512,
    Neon,
    NeonDot,
    Simd128,
}

impl Simd {
    pub fn name(self) -> &'static str {
        match self {
            Simd::Scalar => "scalar",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
            Simd::Neon => "neon",
            Simd::NeonDot => "neon+dotprod",
            Simd::Simd128 if cfg!(target_feature = "relaxed-simd") => "simd128+relaxed",
            Simd::Simd128 => "simd128",
        }
    }

    /// Whether the one-position int4 kernel reads the pair layout ([`ActQ::pair`]) (AVX-512:
    /// for groups without the quad layout).
    pub fn pairs(self) -> bool {
        matches!(self, Simd::Avx2 | Simd::Avx512)
    }

    /// Whether the one-position int4 kernel reads the quad layout ([`ActQ::quad`]) for the
    /// groups it takes ([`ActQ::quad_group`]).
    pub fn quads(self) -> bool {
        matches!(self, Simd::Avx512)
    }

    /// Whether the one-position int8 kernel reads the activations' halves ([`ActQ::halves`]):
    /// wasm SIMD128 with relaxed SIMD.
    pub fn halves(self) -> bool {
        cfg!(target_feature = "relaxed-simd") && matches!(self, Simd::Simd128)
    }

    /// Every path this machine can run, the reference first.
    pub fn available() -> Vec<Simd> {
        #[allow(unused_mut)]
        let mut v = vec![Simd::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx2() {
                v.push(Simd::Avx2);
            }
            if x86::has_avx512() {
                v.push(Simd::Avx512);
            }
        }
        // NEON is part of aarch64's baseline; dotprod (sdot) is detected.
        #[cfg(target_arch = "aarch64")]
        {
            v.push(Simd::Neon);
            if neon::has_dotprod() {
                v.push(Simd::NeonDot);
            }
        }
        // wasm SIMD128 is decided when the module is built (+simd128 in .cargo/config.toml
        // and build-web.sh); the browser tests check its bits against the native path's.
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        v.push(Simd::Simd128);
        v
    }

    /// The path the kernels use: the last (fastest) available one, unless the environment
    /// variable `COLIBRI_SIMD` names another available path.
    pub fn active() -> Simd {
        static ACTIVE: OnceLock<Simd> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let avail = Simd::available();
            let best = *avail.last().unwrap_or(&Simd::Scalar);
            match std::env::var("COLIBRI_SIMD") {
                Ok(want) => avail.into_iter().find(|s| s.name() == want.trim()).unwrap_or(Simd::Scalar),
                Err(_) => best,
            }
        })
    }
}

/// Positions from which [`ActQ::quantize`] and [`ActQ::interleave`] share the positions
/// among the thread pool (each position is computed alone: the same bytes either way).
#[cfg(feature = "parallel")]
const PARALLEL_POSITIONS: usize = 16;

/// Activations of `n` positions quantized per block for one weight layout.
#[derive(Clone, Debug, Default)]
pub struct ActQ {
    pub n: usize,
    pub cols: usize,
    pub group: usize,
    pub blocks: usize,
    /// Each 32-value chunk of a block holds its even-indexed values, then its odd-indexed
    /// ones: the order of the low and high nibbles of 16 int4 bytes.
    pub split: bool,
    /// [n, blocks * group] int8 values, zero beyond `cols`.
    pub q: Vec<i8>,
    /// [n, dstride] block scales d_b, zero past the last block.
    pub d: Vec<f32>,
    /// [n, dstride] sum of the block's q (int4 stores w + 8: isum = sum (w+8) q - 8 sum).
    pub s: Vec<i32>,
    /// Empty, or after [`ActQ::interleave`]: `q` in the interleaved layout of the
    /// many-position kernel, [n, dstride * group] (lane j of each 32-byte vector holds four
    /// values of block j of a run of eight; zero past the last block).
    pub qi: Vec<i8>,
    /// Empty, or after [`ActQ::pair`] (int4, split): `q` in the pair layout of the x86
    /// one-position kernel, [n, dstride * group]: per run of eight blocks, for i < 4 and
    /// each chunk m, 64 bytes: the even values of chunk m of block i, those of block i + 4,
    /// then the odd values of both.
    pub qp: Vec<i8>,
    /// Empty, or after [`ActQ::quad`] (int4, split): `q` in the quad layout of the x86
    /// AVX-512 one-position kernel, [n, dstride * group]: per four chunks of 32 values (in
    /// column order, whatever the group), 128 bytes: the 16 even values of each of the four
    /// chunks, then their 16 odd values (the order of one 64-byte load of nibbles: low
    /// nibbles then high nibbles, one chunk per 128-bit lane).
    pub qz: Vec<i8>,
    /// Empty, or after [`ActQ::halves`]: per 16 values of `q`, 16 bytes of max(q, 0) then
    /// 16 of max(-q, 0) (both 0..=127), [n, 2 * blocks * group]: what the wasm relaxed-SIMD
    /// int8 one-position kernel multiplies every stored byte by, exactly.
    pub qh: Vec<i8>,
    /// The rows these activations meet are Q4K (int4 nibbles under Q4_K headers: group 32,
    /// split): set with `ds` by [`ActQ::set_k4`] after [`ActQ::quantize`], which clears both.
    pub k4: bool,
    /// With `k4`: the rows are Q5K (fifth bits after the nibbles; [`ActQ::set_k5`]).
    pub k5: bool,
    /// Q4K: [n, dstride] d_b * f32(s_b), each product rounded once (the term of the blocks'
    /// offsets B).
    pub ds: Vec<f32>,
}

impl ActQ {
    /// Entries per position in `d` and `s`: the blocks rounded up to 8 (SIMD loads).
    pub fn dstride(&self) -> usize {
        self.blocks.div_ceil(8) * 8
    }

    /// Whether int4 weights of this group use the nibble-ordered (split) layout.
    pub fn wants_split(int4: bool, group: usize) -> bool {
        int4 && group.is_multiple_of(CHUNK)
    }

    /// Quantizes `x` ([n, cols]) per block of `group` columns, reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize, group: usize, split: bool) {
        let blocks = cols.div_ceil(group.max(1));
        *self = ActQ {
            n,
            cols,
            group,
            blocks,
            split,
            q: std::mem::take(&mut self.q),
            d: std::mem::take(&mut self.d),
            s: std::mem::take(&mut self.s),
            qi: std::mem::take(&mut self.qi),
            qp: std::mem::take(&mut self.qp),
            qz: std::mem::take(&mut self.qz),
            qh: std::mem::take(&mut self.qh),
            k4: false,
            k5: false,
            ds: std::mem::take(&mut self.ds),
        };
        self.ds.clear();
        self.qi.clear();
        self.qp.clear();
        self.qz.clear();
        self.qh.clear();
        let (qs, ds) = (blocks * group, self.dstride());
        self.q.clear();
        self.q.resize(n * qs, 0);
        self.d.clear();
        self.d.resize(n * ds, 0.0);
        self.s.clear();
        self.s.resize(n * ds, 0);
        if qs == 0 {
            return;
        }
        let one = |p: usize, q: &mut [i8], d: &mut [f32], s: &mut [i32]| {
            let xr = &x[p * cols..(p + 1) * cols];
            for b in 0..blocks {
                let src = &xr[b * group..((b + 1) * group).min(cols)];
                (d[b], s[b]) = quantize_block(src, &mut q[b * group..(b + 1) * group], split);
            }
        };
        #[cfg(feature = "parallel")]
        if n >= PARALLEL_POSITIONS && rayon::current_num_threads() > 1 {
            use crate::par::{joined, OutPtr};
            let (q, d, s) = (OutPtr(self.q.as_mut_ptr()), OutPtr(self.d.as_mut_ptr()), OutPtr(self.s.as_mut_ptr()));
            // SAFETY: position p's rows of q, d and s belong to task p alone, and the vectors
            // (n * qs and n * ds long) are borrowed mutably until the region ends.
            if joined(n, &|p| unsafe { one(p, q.slice(p * qs, qs), d.slice(p * ds, ds), s.slice(p * ds, ds)) }) {
                return;
            }
            use rayon::prelude::*;
            let parts = self.q.par_chunks_mut(qs).zip(self.d.par_chunks_mut(ds)).zip(self.s.par_chunks_mut(ds));
            parts.enumerate().for_each(|(p, ((q, d), s))| one(p, q, d, s));
            return;
        }
        let parts = self.q.chunks_mut(qs).zip(self.d.chunks_mut(ds)).zip(self.s.chunks_mut(ds));
        parts.enumerate().for_each(|(p, ((q, d), s))| one(p, q, d, s));
    }

    /// Builds [`ActQ::qi`] (for groups that are a multiple of [`CHUNK`]; otherwise leaves
    /// it empty): for each run of eight blocks and each chunk m of their blocks, eight
    /// 32-byte vectors, lane j of vector k = values 4k..4k + 4 of chunk m of block j.
    pub fn interleave(&mut self) {
        self.qi.clear();
        let g = self.group;
        if g == 0 || !g.is_multiple_of(CHUNK) {
            return;
        }
        let (ds, qs, blocks) = (self.dstride(), self.blocks * g, self.blocks);
        if qs == 0 {
            return;
        }
        self.qi.resize(self.n * ds * g, 0);
        let one = |src: &[i8], dst: &mut [i8]| {
            for b0 in (0..blocks).step_by(8) {
                for m in 0..g / CHUNK {
                    let out = &mut dst[b0 * g + m * 8 * CHUNK..][..8 * CHUNK];
                    for j in 0..8.min(blocks - b0) {
                        let chunk = &src[(b0 + j) * g + m * CHUNK..][..CHUNK];
                        for k in 0..8 {
                            out[k * 32 + j * 4..k * 32 + j * 4 + 4].copy_from_slice(&chunk[k * 4..k * 4 + 4]);
                        }
                    }
                }
            }
        };
        #[cfg(feature = "parallel")]
        if self.n >= PARALLEL_POSITIONS && rayon::current_num_threads() > 1 {
            let (q, qi) = (&self.q, crate::par::OutPtr(self.qi.as_mut_ptr()));
            // SAFETY: position p's row of qi (ds * g long, n of them) belongs to task p
            // alone, and qi is borrowed mutably until the region ends.
            if crate::par::joined(self.n, &|p| one(&q[p * qs..(p + 1) * qs], unsafe { qi.slice(p * ds * g, ds * g) })) {
                return;
            }
            use rayon::prelude::*;
            self.q.par_chunks(qs).zip(self.qi.par_chunks_mut(ds * g)).for_each(|(src, dst)| one(src, dst));
            return;
        }
        self.q.chunks(qs).zip(self.qi.chunks_mut(ds * g)).for_each(|(src, dst)| one(src, dst));
    }

    /// Builds [`ActQ::qp`] for split (int4) activations whose group is a multiple of
    /// [`CHUNK`]; otherwise leaves it empty.
    pub fn pair(&mut self) {
        self.qp.clear();
        let g = self.group;
        if !self.split || g == 0 || !g.is_multiple_of(CHUNK) {
            return;
        }
        let (ds, qs, ch) = (self.dstride(), self.blocks * g, g / CHUNK);
        self.qp.resize(self.n * ds * g, 0);
        for p in 0..self.n {
            let (src, dst) = (&self.q[p * qs..(p + 1) * qs], &mut self.qp[p * ds * g..(p + 1) * ds * g]);
            for b0 in (0..self.blocks).step_by(8) {
                for i in 0..4 {
                    for m in 0..ch {
                        let out = &mut dst[b0 * g + (i * ch + m) * 64..][..64];
                        for (half, b) in [(0, b0 + i), (16, b0 + i + 4)] {
                            if b < self.blocks {
                                let chunk = &src[b * g + m * CHUNK..][..CHUNK];
                                out[half..half + 16].copy_from_slice(&chunk[..16]);
                                out[32 + half..32 + half + 16].copy_from_slice(&chunk[16..]);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Groups of the quad layout's kernel: 32, 64 and 128 (others read the pair layout).
    pub fn quad_group(group: usize) -> bool {
        matches!(group, 32 | 64 | 128)
    }

    /// Builds [`ActQ::qz`] for split (int4) activations whose group is a multiple of
    /// [`CHUNK`]; otherwise leaves it empty.
    pub fn quad(&mut self) {
        self.qz.clear();
        let g = self.group;
        if !self.split || g == 0 || !g.is_multiple_of(CHUNK) {
            return;
        }
        let (ds, qs) = (self.dstride(), self.blocks * g);
        self.qz.resize(self.n * ds * g, 0);
        let half = CHUNK / 2;
        for p in 0..self.n {
            let (src, dst) = (&self.q[p * qs..(p + 1) * qs], &mut self.qz[p * ds * g..(p + 1) * ds * g]);
            // Chunk c (32 values, split: 16 even then 16 odd) goes to group c / 4, lane c % 4.
            for (c, chunk) in src.chunks_exact(CHUNK).enumerate() {
                let out = &mut dst[(c / 4) * 4 * CHUNK..][..4 * CHUNK];
                let lane = (c % 4) * half;
                out[lane..lane + half].copy_from_slice(&chunk[..half]);
                out[4 * half + lane..4 * half + lane + half].copy_from_slice(&chunk[half..]);
            }
        }
    }

    /// Marks these activations as meeting Q4K rows (tensor::DType::Q4K; quantized with group
    /// 32, split) and makes [`ActQ::ds`].
    pub fn set_k4(&mut self) {
        self.k4 = true;
        self.ds.clear();
        self.ds.extend(self.d.iter().zip(&self.s).map(|(d, s)| d * *s as f32));
    }

    /// [`ActQ::set_k4`] for Q5K rows (tensor::DType::Q5K): the same activations and `ds`.
    pub fn set_k5(&mut self) {
        self.set_k4();
        self.k5 = true;
    }

    /// Q5K activations of the shape every Q5K kernel takes: split, group 32, whole runs of
    /// eight blocks (`cols` a multiple of 256), `ds` made (each path adds its layouts:
    /// `x86::k5_takes`, `neon::k5_takes`, `wasm::k5_takes`).
    pub fn k5_whole(&self) -> bool {
        self.k5
            && self.split
            && self.group == CHUNK
            && self.cols == self.blocks * CHUNK
            && self.blocks.is_multiple_of(8)
            && self.ds.len() == self.n * self.dstride()
    }

    /// Builds [`ActQ::qh`] from `q` (activations are -127..=127, so -q fits).
    pub fn halves(&mut self) {
        self.qh.clear();
        self.qh.reserve(2 * self.q.len());
        for seg in self.q.chunks(16) {
            self.qh.extend(seg.iter().map(|&v| v.max(0)));
            self.qh.extend(std::iter::repeat_n(0, 16 - seg.len()));
            self.qh.extend(seg.iter().map(|&v| v.saturating_neg().max(0)));
            self.qh.extend(std::iter::repeat_n(0, 16 - seg.len()));
        }
    }

    #[inline]
    pub fn qhrow(&self, p: usize) -> &[i8] {
        let qs = 2 * self.blocks * self.group;
        &self.qh[p * qs..(p + 1) * qs]
    }

    #[inline]
    pub fn qrow(&self, p: usize) -> &[i8] {
        let qs = self.blocks * self.group;
        &self.q[p * qs..(p + 1) * qs]
    }

    #[inline]
    pub fn drow(&self, p: usize) -> &[f32] {
        let ds = self.dstride();
        &self.d[p * ds..(p + 1) * ds]
    }

    #[inline]
    pub fn srow(&self, p: usize) -> &[i32] {
        let ds = self.dstride();
        &self.s[p * ds..(p + 1) * ds]
    }
}

/// Where value `i` of a block is stored in the split (nibble) order.
#[inline]
fn split_index(i: usize) -> usize {
    (i & !31) + ((i & 31) >> 1) + (i & 1) * 16
}

/// Quantizes one block into `dst` (zeroed first); returns (d_b, sum of q). A block holding
/// NaN or an infinity gets d_b = NaN, so every output of its position is NaN.
pub fn quantize_block(x: &[f32], dst: &mut [i8], split: bool) -> (f32, i32) {
    dst.iter_mut().for_each(|v| *v = 0);
    let amax_bits = x.iter().map(|v| v.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
    if amax_bits >= 0x7f80_0000 {
        return (f32::NAN, 0);
    }
    if amax_bits < TINY_BITS {
        return (0.0, 0);
    }
    let amax = f32::from_bits(amax_bits);
    let (inv, d) = (127.0 / amax, amax / 127.0);
    #[cfg(target_arch = "x86_64")]
    if x.len().is_multiple_of(8) && dst.len() >= x.len() && Simd::active().pairs() {
        // SAFETY: AVX2 reported (the AVX2 and AVX-512 paths; `COLIBRI_SIMD=scalar` keeps the
        // scalar loop); x and dst hold x.len() values, a multiple of 8.
        return (d, unsafe { x86_runs::quantize_avx2(x, inv, dst, split) });
    }
    (d, quantize_values(x, inv, dst, split))
}

/// Round half to even by adding and subtracting 1.5 * 2^23: for |y| < 2^22 the sum lies
/// where f32 steps are 1, so the (IEEE, ties-to-even) addition rounds y itself; exactly
/// round_ties_even(y), without the libm call it costs on baseline x86-64 and in wasm.
const MAGIC: f32 = 12_582_912.0;

/// [`quantize_block`]'s values: q = clamp(round_ties_even(x * inv), -127, 127) into `dst`
/// (split order when `split`); their sum. The reference of `x86_runs::quantize_avx2`.
pub fn quantize_values(x: &[f32], inv: f32, dst: &mut [i8], split: bool) -> i32 {
    let mut sum = 0i32;
    for (i, &v) in x.iter().enumerate() {
        let q = ((v * inv + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i32;
        dst[if split { split_index(i) } else { i }] = q as i8;
        sum += q;
    }
    sum
}

/// Rounds up to a multiple of 4 (the row layout's padding).
#[inline]
fn round4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// The f16 scale of block `b` of a stored row.
#[inline]
fn scale(row: &[u8], b: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([row[2 * b], row[2 * b + 1]])).to_f32()
}

/// The reference: one stored int4/int8 row (`dtype.row_bytes(cols)` bytes; Q4K when
/// `a.k4`) times position `p` of `a`, in the documented order.
pub fn dot_row_scalar(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    if a.k4 {
        return dot_row_q4k(row, a, p);
    }
    let (cols, g) = (a.cols, a.group);
    let vals = &row[round4(a.blocks * 2)..];
    let (q, d) = (a.qrow(p), a.drow(p));
    let mut acc = [0.0f32; 8];
    for b in 0..a.blocks {
        let c0 = b * g;
        let mut isum = 0i32;
        for c in c0..(c0 + g).min(cols) {
            let w = if int4 {
                let byte = vals[c >> 1];
                (if c & 1 == 0 { byte & 15 } else { byte >> 4 }) as i32 - 8
            } else {
                vals[c] as i8 as i32
            };
            let i = c - c0;
            isum += w * q[c0 + if a.split { split_index(i) } else { i }] as i32;
        }
        acc[b % 8] += (scale(row, b) * d[b]) * isum as f32;
    }
    reduce8(acc)
}

/// The reference for a Q4K or Q5K row (`a.k4`, `a.k5`: group 32): per block b (sub-block
/// j = b mod 8 of header b / 8), isum = sum u * q over its 32 values (u the stored nibble,
/// plus 16 times its fifth bit for Q5K), then acc[b mod 8] += (A_j * d_b) * f32(isum) -
/// B_j * ds_b, each operation rounded on its own. |isum| <= 31 * 127 * 32 < 2^24: exact.
fn dot_row_q4k(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let runs = a.blocks / 8;
    let vals = &row[runs * 16..];
    let high = &row[runs * 16 + a.cols / 2..];
    let (q, d, ds) = (a.qrow(p), a.drow(p), &a.ds[p * a.dstride()..(p + 1) * a.dstride()]);
    let mut acc = [0.0f32; 8];
    for r in 0..runs {
        let (am, bm) = crate::tensor::q4k_scales(&row[16 * r..16 * r + 16]);
        for j in 0..8 {
            let b = 8 * r + j;
            let mut isum = 0i32;
            for i in 0..CHUNK {
                let c = CHUNK * b + i;
                let byte = vals[c >> 1];
                let mut u = if c & 1 == 0 { byte & 15 } else { byte >> 4 };
                if a.k5 {
                    let (at, bit) = crate::tensor::q5k_bit(CHUNK * j + i);
                    u |= ((high[32 * r + at] >> bit) & 1) << 4;
                }
                isum += u as i32 * q[CHUNK * b + if a.split { split_index(i) } else { i }] as i32;
            }
            acc[j] += (am[j] * d[b]) * isum as f32 - bm[j] * ds[b];
        }
    }
    reduce8(acc)
}

/// The byte shuffle every SIMD path decodes a Q4K header with (tensor::q4k_scales): 32-bit
/// lane j (blocks 0-3 in the first 16 bytes, 4-7 in the next, each half indexing the same
/// 16 header bytes) gets header bytes 4 + 6j / 8 and the next (sc_j, at bit 6j of the
/// string) and, above them, the two 6 bytes on (m_j, at bit 48 + 6j: the same offset in
/// its byte); 0xff (past the header) reads as zero in `vpshufb`, `i8x16.swizzle` and
/// `tbl`. A right shift of lane j by [`K4_SHIFT`]`[j % 4]` then brings both to bit 0 of
/// their 16-bit halves.
#[allow(dead_code)]
const K4_INDEX: [u8; 32] = {
    let mut t = [0xffu8; 32];
    let mut j = 0;
    while j < 8 {
        let at = 4 + 6 * j / 8;
        t[4 * j] = at as u8;
        t[4 * j + 1] = at as u8 + 1;
        t[4 * j + 2] = at as u8 + 6;
        if at + 7 < 16 {
            t[4 * j + 3] = at as u8 + 7;
        }
        j += 1;
    }
    t
};

/// 6j mod 8 for the lanes of a half of [`K4_INDEX`].
#[allow(dead_code)]
const K4_SHIFT: [u32; 4] = [0, 6, 4, 2];

/// Whether `simd` has its own kernels for Q4K rows (the others run the reference).
fn k4_fast(simd: Simd) -> bool {
    matches!(simd, Simd::Avx2 | Simd::Avx512 | Simd::Simd128 | Simd::Neon | Simd::NeonDot)
}

/// Int4/int8 activations, or Q4K ones whose `ds` is whole (the SIMD kernels read it
/// unchecked; the reference would stop at a bounds check).
fn k4_ok(a: &ActQ) -> bool {
    !a.k4 || a.ds.len() == a.n * a.dstride()
}

/// Whether `simd` has its own kernels for Q5K rows with the layouts `a` holds (the others
/// run the reference): x86 on the pair layout (AVX2) or the quad layout (AVX-512); wasm
/// SIMD128 and NEON on any (one position reads `q`, their tiles the interleaved layout:
/// `wasm::k5_takes`, `neon::k5_takes`).
fn k5_fast(simd: Simd, a: &ActQ) -> bool {
    let _ = a;
    #[cfg(target_arch = "x86_64")]
    if matches!(simd, Simd::Avx2 | Simd::Avx512) {
        return x86::k5_takes(a, simd == Simd::Avx512);
    }
    #[cfg(target_arch = "aarch64")]
    if matches!(simd, Simd::Neon | Simd::NeonDot) {
        return neon::k5_takes(a);
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if simd == Simd::Simd128 {
        return wasm::k5_takes(a);
    }
    let _ = simd;
    false
}

/// Q5K activations that `simd`'s kernels do not take: every row goes to the reference.
fn k5_slow(simd: Simd, a: &ActQ) -> bool {
    a.k5 && !k5_fast(simd, a)
}

/// One row times one position with the chosen path. The fast paths need the group to
/// be a multiple of [`CHUNK`] (and int4 activations split); others use the reference.
#[inline]
pub fn dot_row(simd: Simd, int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    if !a.group.is_multiple_of(CHUNK) || a.split != int4 || (a.k4 && !k4_fast(simd)) || !k4_ok(a) || k5_slow(simd, a) {
        return dot_row_scalar(int4, row, a, p);
    }
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Simd::Avx2/Avx512 are only produced by Simd::available() after the CPU
        // reported the features; the row and activation shapes are checked by the callers
        // (row.len() == row_bytes(cols), a quantized for this group and cols).
        Simd::Avx2 => unsafe { x86::dot_row_avx2(int4, row, a, p) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Simd::Avx512 => unsafe { x86::dot_row_avx512(int4, row, a, p) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: without dotprod nothing beyond aarch64's baseline NEON is used.
        Simd::Neon => unsafe { neon::dot_row_neon(false, int4, row, a, p) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: Simd::NeonDot is only produced by Simd::available() after the CPU
        // reported dotprod.
        Simd::NeonDot => unsafe { neon::dot_row_neon(true, int4, row, a, p) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Simd::Simd128 => wasm_rows::dot_row_simd128(int4, row, a, p),
        _ => dot_row_scalar(int4, row, a, p),
    }
}

/// [`dot_row`] for consecutive stored rows of `rb` bytes each (`rows` holds `out.len()` of
/// them) times position 0 of `a`, into `out`: the same bits, the row loop inside the SIMD
/// function (one call and one set-up per matrix slice instead of per row).
pub fn dot_rows(simd: Simd, int4: bool, rows: &[u8], rb: usize, a: &ActQ, out: &mut [f32]) {
    if k5_slow(simd, a) {
        for (o, row) in out.iter_mut().zip(rows.chunks(rb.max(1))) {
            *o = dot_row_scalar(int4, row, a, 0);
        }
        return;
    }
    // dot_row's own condition for its SIMD paths (other groups take the reference).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if simd == Simd::Simd128 && a.group.is_multiple_of(CHUNK) && a.split == int4 && k4_ok(a) {
        return wasm_rows::dot_rows(int4, rows, rb, a, out);
    }
    let whole = rows.len() >= out.len() * rb;
    if whole && a.group.is_multiple_of(CHUNK) && a.split == int4 && k4_ok(a) {
        match simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in dot_row, for each of the rows (`rows` holds all of them).
            Simd::Avx2 => return unsafe { x86::dot_rows_avx2(int4, rows, rb, a, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Simd::Avx512 => return unsafe { x86::dot_rows_avx512(int4, rows, rb, a, out) },
            _ => {}
        }
    }
    for (o, row) in out.iter_mut().zip(rows.chunks(rb.max(1))) {
        *o = dot_row(simd, int4, row, a, 0);
    }
}

/// Whether Q4K and Q5K rows (`ActQ::k4`, `ActQ::k5`) are prepared too on `simd` from
/// [`prepare_min`] positions (their activations then interleaved): the wasm and NEON tiles
/// take them (`wasm_tile::dot_many_int4`, `neon_tile::dot_many`; Q5K's fifth bits go into the
/// prepared values); x86's does not (its few-position kernels run them).
pub fn prepares_k4(simd: Simd) -> bool {
    (simd == Simd::Simd128 && cfg!(all(target_arch = "wasm32", target_feature = "simd128")))
        || (matches!(simd, Simd::Neon | Simd::NeonDot) && cfg!(target_arch = "aarch64"))
}

/// Positions from which a row is first made ready (`tile::prepare`: its values unpacked
/// and interleaved once) and then applied to the positions four at a time. Below it the
/// x86 paths run `x86_few` (each run of the row loaded and unpacked once for up to 32
/// positions, read from L1 again for the next 32), which beat preparing at every count up
/// to 32 on the OLMoE shape (`coli bench --batch N --ram all` and short prefills, Xeon
/// with AVX-512 VNNI, both paths; docs/benchmarks.md "A few positions per row"): against
/// preparing from 9 (AVX-512) and 6 (AVX2), decode steps of 8 and 16 sequences 3-20% faster,
/// a 32-token prefill 8-15%; ties at 64 positions and more. AVX2 prepares only with
/// AVX-VNNI (below).
/// The other paths prepare from 3 (their one-position kernel per position is slower; not
/// measured against a few-position kernel, which they do not have).
pub fn prepare_min(simd: Simd) -> usize {
    match simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => x86_few::FEW + 1,
        // AVX2 prepares only with AVX-VNNI (tile's `vpdpbusd`): on the Xeon through
        // COLIBRI_SIMD=avx2 a 256-token prefill 85-86 -> 101-104 tok/s, qdot_bench at 64
        // positions int8/g128 +20-30%, int4/g32 +2-8% (docs/benchmarks.md "AVX-VNNI").
        // Without it, never: on a Zen 1 EPYC the few-position kernel beat the `vpmaddubsw`
        // prepared row at every count measured (a 128-token prefill of the default
        // conversion about 10% faster, `coli bench-kernels` at 64 positions 3-23%, a tie at
        // 256), and on the Xeon the two tied from 64 positions.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 if x86::has_avxvnni() => x86_few::FEW + 1,
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => usize::MAX,
        _ => 3,
    }
}

/// One row times positions `p0..p0 + out.len()`: `out[i]` has the bits of
/// `dot_row(simd, int4, row, a, p0 + i)`. With [`prepare_min`] or more positions and
/// interleaved activations ([`ActQ::interleave`]), the x86 paths prepare the row once into
/// `scratch` (int4 on AVX2 and AVX-512; int8 on AVX-512, whose `vpdpbusd` takes w + 128
/// without overflow) and run `tile::dot_many`; wasm SIMD128 does the same for int4
/// (`wasm_tile::prepare_int4`, `wasm_tile::dot_many_int4`) and aarch64 NEON for int4 and int8
/// (`neon_tile`: `sdot` on the interleaved halves); the integer block sums are the same,
/// so are the bits.
pub fn dot_row_many(simd: Simd, int4: bool, row: &[u8], a: &ActQ, p0: usize, out: &mut [f32], scratch: &mut Vec<u8>) {
    if k5_slow(simd, a) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = dot_row_scalar(int4, row, a, p0 + i);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if out.len() >= prepare_min(simd)
        && a.group.is_multiple_of(CHUNK)
        && a.split == int4
        && a.qi.len() == a.n * a.dstride() * a.group
        && p0 + out.len() <= a.n
        && !a.k4
        && (simd == Simd::Avx512 || (simd == Simd::Avx2 && x86::has_avxvnni()))
    {
        // SAFETY: Simd::Avx512 comes from Simd::available() after the CPU reported the
        // features, Simd::Avx2 likewise and has_avxvnni() checked AVX-VNNI; `row` is one
        // stored row for `a` (callers' contract, as for dot_row); `a` is interleaved (its
        // length checked above) and the positions are inside it; `scratch` is prepared
        // from this row before any position reads it.
        unsafe {
            tile::prepare(int4, row, a, scratch);
            tile::dot_many(simd == Simd::Avx512, int4, scratch, row, a, p0, out);
        }
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if out.len() >= prepare_min(simd)
        && matches!(simd, Simd::Neon | Simd::NeonDot)
        && neon_tile::fits(int4, row, a, p0, out.len())
    {
        neon_tile::prepare(int4, row, a, scratch);
        // SAFETY: Simd::NeonDot is only produced by Simd::available() after the CPU
        // reported dotprod; the shapes were checked by `fits`.
        unsafe { neon_tile::dot_many(simd == Simd::NeonDot, int4, scratch, row, a, p0, out) };
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if out.len() >= prepare_min(simd)
        && int4
        && k4_ok(a)
        && simd == Simd::Simd128
        && a.split
        && a.group.is_multiple_of(CHUNK)
        && a.qi.len() == a.n * a.dstride() * a.group
        && p0 + out.len() <= a.n
    {
        wasm_tile::prepare_int4(row, a, scratch);
        wasm_tile::dot_many_int4(scratch, row, a, p0, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(simd, Simd::Avx512 | Simd::Avx2)
        && out.len() >= 2
        && a.group.is_multiple_of(CHUNK)
        && a.split == int4
        && k4_ok(a)
        && p0 + out.len() <= a.n
    {
        // SAFETY: Simd::Avx2/Avx512 come from Simd::available() after the CPU reported the
        // features (and has_avxvnni() checked AVX-VNNI); `row` is one stored row for `a`
        // (callers' contract, as for dot_row); the positions are inside `a` (checked above).
        unsafe {
            if simd == Simd::Avx512 {
                x86_few::dot_row_few_avx512(int4, row, a, p0, out)
            } else if x86::has_avxvnni() {
                x86_few::dot_row_few_avxvnni(int4, row, a, p0, out)
            } else {
                x86_few::dot_row_few_avx2(int4, row, a, p0, out)
            }
        }
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if simd == Simd::Simd128 && !int4 && out.len() >= 2 && p0 + out.len() <= a.n {
        return wasm_few::dot_row_few_int8(row, a, p0, out);
    }
    let _ = &scratch;
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot_row(simd, int4, row, a, p0 + i);
    }
}

/// [`dot_row_many`] for consecutive rows of `rb` bytes, positions `0..n`: `out[k * n + i]`
/// has the bits of `dot_row(simd, int4, row k, a, i)`, n = out.len() / rows. Below
/// [`prepare_min`] positions the x86 paths run the group in one call of the few-position
/// kernel; everything else goes row by row.
pub fn dot_rows_many(simd: Simd, int4: bool, rows: &[u8], rb: usize, a: &ActQ, out: &mut [f32], scratch: &mut Vec<u8>) {
    let count = rows.len() / rb.max(1);
    if count == 0 {
        return;
    }
    let n = out.len() / count;
    #[cfg(target_arch = "x86_64")]
    if matches!(simd, Simd::Avx512 | Simd::Avx2)
        && n >= 2
        && n < prepare_min(simd)
        && out.len() == count * n
        && rows.len() == count * rb
        && !k5_slow(simd, a)
        && a.group.is_multiple_of(CHUNK)
        && a.split == int4
        && k4_ok(a)
        && n <= a.n
    {
        // SAFETY: Simd::Avx2/Avx512 come from Simd::available() after the CPU reported the
        // features (and has_avxvnni() checked AVX-VNNI); each of the `count` rows is one
        // stored row for `a` (callers' contract, as for dot_row); the positions are inside
        // `a` (checked above).
        unsafe {
            if simd == Simd::Avx512 {
                x86_few::dot_rows_few_avx512(int4, rows, rb, a, 0, out)
            } else if x86::has_avxvnni() {
                x86_few::dot_rows_few_avxvnni(int4, rows, rb, a, 0, out)
            } else {
                x86_few::dot_rows_few_avx2(int4, rows, rb, a, 0, out)
            }
        }
        return;
    }
    for (row, o) in rows.chunks_exact(rb.max(1)).zip(out.chunks_mut(n.max(1))) {
        dot_row_many(simd, int4, row, a, 0, o, scratch);
    }
}

/// Bytes `[at, at + N)` of `src`, zero-filled past its end (the last chunk of a row).
#[inline]
#[allow(dead_code)]
fn padded<const N: usize>(src: &[u8], at: usize) -> [u8; N] {
    let mut buf = [0u8; N];
    if at < src.len() {
        let k = (src.len() - at).min(N);
        buf[..k].copy_from_slice(&src[at..at + k]);
    }
    buf
}
