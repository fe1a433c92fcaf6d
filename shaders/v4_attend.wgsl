// v4_attend.wgsl — DeepSeek-V4's attention (v4::attn::attend), one workgroup per
// (query i, head h), p = pos0 + i: the keys (keys are the values) are
//   the window: positions max(p + 1 - window, 0) ..= p, rows p - pos0 + held of WK (the
//               layer's last `held` keys, then the pass's);
//   then with rate > 0 the compressed entries of E that p may see, e < vis =
//               min((p + 1) / rate, entries): with sparse those of LIST's row i (the
//               indexer's choice, ascending), else all;
//   s_j = dot(q, k_j) * scale        math::dot's 8-lane order
//   s   = softmax with the head's sink (math::softmax_with_sink: the sink joins the max,
//         det_exp, the sum in key order with the sink's term last, correctly rounded
//         division)
//   out = sum_j s_j * k_j            in key order, products rounded (opq)
// attention.wgsl's arithmetic, over two key sources and a variable-length choice.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P     uniform Params
//   1 Q     storage read  f32 [n, heads, head_dim]
//   2 WK    storage read  f32 [held + n, head_dim]   window keys
//   3 E     storage read  f32 [entries, head_dim]     compressed entries
//   4 LIST  storage read  u32 [n, topk + 1]           per query: count, entries (sparse)
//   5 SK    storage read  f32 [heads]                 sink logits
//   6 S     storage rw    f32 [n * heads, s_stride]   scratch for the scores
//   7 O     storage rw    f32 [n, heads, head_dim]
// Workgroup: 64 threads. Dispatch: n * heads workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    heads: u32,
    head_dim: u32,
    pos0: u32,
    held: u32,
    window: u32,
    rate: u32, // 0: a sliding layer
    entries: u32,
    sparse: u32,
    topk: u32,
    scale: f32,
    s_stride: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> WK: array<f32>;
@group(0) @binding(3) var<storage, read> E: array<f32>;
@group(0) @binding(4) var<storage, read> LIST: array<u32>;
@group(0) @binding(5) var<storage, read> SK: array<f32>;
@group(0) @binding(6) var<storage, read_write> S: array<f32>;
@group(0) @binding(7) var<storage, read_write> O: array<f32>;

var<workgroup> red: array<f32, 64>;
var<workgroup> total: f32;

// Float d of key j of query i's list: the window's wl keys, then the entries.
fn key(i: u32, lo: u32, wl: u32, j: u32, d: u32) -> f32 {
    let hd = P.head_dim;
    if (j < wl) {
        return WK[(lo + j - P.pos0 + P.held) * hd + d];
    }
    var e = j - wl;
    if (P.sparse != 0u) {
        e = LIST[i * (P.topk + 1u) + 1u + e];
    }
    return E[e * hd + d];
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let idx = wg.x + wg.y * P.groups_x;
    if (idx >= P.n * P.heads) {
        return;
    }
    let i = idx / P.heads;
    let h = idx % P.heads;
    let hd = P.head_dim;
    let p = P.pos0 + i;
    var lo = 0u;
    if (p + 1u > P.window) {
        lo = p + 1u - P.window;
    }
    let wl = p + 1u - lo;
    var ne = 0u;
    if (P.rate > 0u) {
        let vis = min((p + 1u) / P.rate, P.entries);
        if (P.sparse != 0u) {
            // The choice's entries below vis (all of them: it chose among those).
            let c = LIST[i * (P.topk + 1u)];
            for (var k = 0u; k < c; k = k + 1u) {
                if (LIST[i * (P.topk + 1u) + 1u + k] < vis) {
                    ne = k + 1u;
                }
            }
        } else {
            ne = vis;
        }
    }
    let len = wl + ne;
    let qb = (i * P.heads + h) * hd;
    let sb = idx * P.s_stride;

    var m = f32_bits(0xff800000u); // -inf
    for (var j = li; j < len; j = j + 64u) {
        var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for (var d = 0u; d < hd; d = d + 1u) {
            acc[d & 7u] = acc[d & 7u] + opq(Q[qb + d] * key(i, lo, wl, j, d));
        }
        let s = reduce8(acc) * P.scale;
        S[sb + j] = s;
        m = max(m, s);
    }
    red[li] = m;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w >> 1u) {
        if (li < w) {
            red[li] = max(red[li], red[li + w]);
        }
        workgroupBarrier();
    }
    var mx = red[0];
    if (SK[h] > mx) {
        mx = SK[h];
    }
    for (var j = li; j < len; j = j + 64u) {
        S[sb + j] = det_exp(S[sb + j] - mx);
    }
    storageBarrier();
    if (li == 0u) {
        var sum = 0.0;
        for (var j = 0u; j < len; j = j + 1u) {
            sum = sum + S[sb + j];
        }
        sum = sum + det_exp(SK[h] - mx);
        total = sum;
    }
    workgroupBarrier();
    let sum = total;
    for (var j = li; j < len; j = j + 64u) {
        S[sb + j] = div_cr(S[sb + j], sum);
    }
    storageBarrier();
    for (var d = li; d < hd; d = d + 64u) {
        var acc = 0.0;
        for (var j = 0u; j < len; j = j + 1u) {
            acc = acc + opq(S[sb + j] * key(i, lo, wl, j, d));
        }
        O[qb + d] = acc;
    }
}
