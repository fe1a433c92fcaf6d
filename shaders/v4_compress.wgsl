// v4_compress.wgsl — DeepSeek-V4's compressed key/value entries of whole windows, before
// their RMSNorm and RoPE (v4::compress::feed): for window w and channel ch, over the
// window's slots s (with OVERLAP first the previous window's Ca halves, then its own Cb
// halves; else its own rows)
//   g_s = gate[row][half + ch] + ape[slot row][half + ch]   (-inf for a Ca slot without a
//         previous window, whose kv is 0)
//   entry[ch] = sum_s kv_s * softmax(g)_s
// as math::softmax computes it (the max from -inf ignoring NaN, det_exp of v - max summed
// in slot order, correctly rounded division; an all -inf column gives zero weights) and
// the sum in slot order with every product rounded before it is added (opq).
//
// The rows: KV and GATE hold rows of `width` floats (2 * dim with OVERLAP, else dim):
// window w's own rows are first + w * rate .. + rate; the rows before `first` are the
// previous window's (has_prev; OVERLAP only). With PREV_BIASED their Ca gates already hold
// the position bias (a state read back from a cache file, which keeps them so, as the CPU
// does): added once, not again.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P     uniform Params
//   1 KV    storage read  f32 [rows, width]   kv projections
//   2 GATE  storage read  f32 [rows, width]   gate projections (without the position bias)
//   3 APE   storage read  f32 [rate, width]   the position bias
//   4 OUT   storage rw    f32 [out_offset + windows * dim]   the entries
// Workgroup: 64 threads, one per (window, channel).
// Dispatch: ceil(windows * dim / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    windows: u32,
    dim: u32,
    rate: u32,
    overlap: u32,
    first: u32,
    has_prev: u32,
    out_offset: u32,
    prev_biased: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> KV: array<f32>;
@group(0) @binding(2) var<storage, read> GATE: array<f32>;
@group(0) @binding(3) var<storage, read> APE: array<f32>;
@group(0) @binding(4) var<storage, read_write> OUT: array<f32>;

// Slot s of window w at channel ch: (kv, gate + bias).
fn slot(w: u32, ch: u32, s: u32) -> vec2<f32> {
    let r = P.rate;
    let d = P.dim;
    if (P.overlap == 0u) {
        let at = (P.first + w * r + s) * d + ch;
        return vec2<f32>(KV[at], GATE[at] + APE[s * d + ch]);
    }
    let width = 2u * d;
    if (s < r) {
        // Ca: channel ch of the previous window's row s.
        if (w == 0u && P.has_prev == 0u) {
            return vec2<f32>(0.0, f32_bits(0xff800000u));
        }
        let at = (P.first + w * r - r + s) * width + ch;
        if (w == 0u && P.prev_biased != 0u) {
            return vec2<f32>(KV[at], GATE[at]);
        }
        return vec2<f32>(KV[at], GATE[at] + APE[s * width + ch]);
    }
    // Cb: channel d + ch of this window's row s - r.
    let j = s - r;
    let at = (P.first + w * r + j) * width + d + ch;
    return vec2<f32>(KV[at], GATE[at] + APE[j * width + d + ch]);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.windows * P.dim) {
        return;
    }
    let w = t / P.dim;
    let ch = t % P.dim;
    var slots = P.rate;
    if (P.overlap != 0u) {
        slots = 2u * P.rate;
    }
    let neg_inf = f32_bits(0xff800000u);
    var m = neg_inf;
    for (var s = 0u; s < slots; s++) {
        let g = slot(w, ch, s).y;
        if (g > m) {
            m = g;
        }
    }
    var acc = 0.0;
    if (m == neg_inf) {
        // Every slot masked: zero weights (math::softmax), kv * 0 summed.
        for (var s = 0u; s < slots; s++) {
            acc = acc + opq(slot(w, ch, s).x * 0.0);
        }
        OUT[P.out_offset + t] = acc;
        return;
    }
    var sum = 0.0;
    for (var s = 0u; s < slots; s++) {
        sum = sum + det_exp(slot(w, ch, s).y - m);
    }
    // math::softmax adds the (absent) sink's exp(-inf) = +0 here: no change to sum >= 1.
    for (var s = 0u; s < slots; s++) {
        let v = slot(w, ch, s);
        acc = acc + opq(v.x * div_cr(det_exp(v.y - m), sum));
    }
    OUT[P.out_offset + t] = acc;
}
