// attention.wgsl — causal grouped-query attention of n new positions over the KV cache,
// one workgroup per (position i, head h), as attention::attention computes it:
//   s_j = dot(q, k_j) * scale             for the visible keys j in [lo, p], p = pos0 + i,
//                                         lo = p + 1 - window (clamped at 0) or 0;
//                                         with split > 0 (MLA, mla::attention):
//                                         (dot(q[..split], k_j[..split])
//                                          + dot(q[split..], k_j[split..])) * scale
//   s   = softmax(s)                       max subtracted, det_exp, sum in index order,
//                                         correctly rounded division; with sinks
//                                         (gpt_oss) the head's sink logit joins the max
//                                         and adds its term to the sum after the others
//                                         (math::softmax_with_sink)
//   out = sum_j s_j * v_j                  in index order, products rounded (opq)
// dot uses math::dot's 8-lane order; each sequential sum is done by one thread in the
// CPU's order, so the result is the CPU's bits. GQA: k_stride = v_stride = n_kv_heads *
// head_dim, v_dim = head_dim. MLA: one kv head whose key row is [latent, rotary key]
// (head_dim = kv_lora_rank + qk_rope_head_dim = k_stride) and whose value is the latent
// (v_dim = kv_lora_rank, v_stride = k_stride, V = K), context written head-major; with
// DSA the cache row also holds the indexer key (k_stride wider than head_dim) and a query
// with a selection attends to its sel_topk positions, in the order given, instead of [lo, p].
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 Q   storage read  f32 [n, n_heads * head_dim]      (rotated queries)
//   2 K   storage read  f32 [pos0 + n, k_stride]         key cache
//   3 V   storage read  f32 [pos0 + n, v_stride]         value cache
//   4 S   storage rw    f32 [n * n_heads, s_stride]      scratch for the scores
//   5 O   storage rw    f32 [n, n_heads * v_dim]         context ([n_heads, n, v_dim]
//                                                        when o_head_major = 1)
//   6 SK  storage read  f32 [n_heads]                    sink logits (read when sinks = 1)
//   7 SEL storage read  u32 [n, sel_topk]                DeepSeek Sparse Attention: the
//                                                        positions each query keeps,
//                                                        ascending (read when sel_topk > 0;
//                                                        a row starting 0xffffffff keeps
//                                                        every visible position)
// Workgroup: 64 threads. Dispatch: n * n_heads workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    pos0: u32,
    window: u32, // 0: no sliding window
    scale: f32,
    s_stride: u32,
    sinks: u32,
    split: u32, // 0: one dot product over head_dim
    k_stride: u32,
    v_dim: u32,
    v_stride: u32,
    o_head_major: u32,
    sel_topk: u32, // 0: no selection
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> K: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read_write> S: array<f32>;
@group(0) @binding(5) var<storage, read_write> O: array<f32>;
@group(0) @binding(6) var<storage, read> SK: array<f32>;
@group(0) @binding(7) var<storage, read> SEL: array<u32>;

var<workgroup> red: array<f32, 64>;
var<workgroup> total: f32;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let idx = wg.x + wg.y * P.groups_x;
    if (idx >= P.n * P.n_heads) {
        return;
    }
    let i = idx / P.n_heads;
    let h = idx % P.n_heads;
    let hd = P.head_dim;
    let qd = P.n_heads * hd;

    let kvh = h / (P.n_heads / P.n_kv_heads);
    let p = P.pos0 + i;
    var lo = 0u;
    if (P.window > 0u && p + 1u > P.window) {
        lo = p + 1u - P.window;
    }
    var len = p + 1u - lo;
    let selb = i * P.sel_topk;
    var sel = false;
    if (P.sel_topk > 0u) {
        sel = SEL[selb] != 0xffffffffu;
    }
    if (sel) {
        len = P.sel_topk;
    }
    let qb = i * qd + h * hd;
    var ob = i * P.n_heads * P.v_dim + h * P.v_dim;
    if (P.o_head_major != 0u) {
        ob = (h * P.n + i) * P.v_dim;
    }
    let sb = idx * P.s_stride;

    // Scores, and each thread's running max.
    var m = f32_bits(0xff800000u); // -inf
    for (var j = li; j < len; j = j + 64u) {
        var pos = lo + j;
        if (sel) {
            pos = SEL[selb + j];
        }
        let kb = pos * P.k_stride + kvh * hd;
        var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        var s = 0.0;
        if (P.split == 0u) {
            for (var d = 0u; d < hd; d = d + 1u) {
                acc[d & 7u] = acc[d & 7u] + opq(Q[qb + d] * K[kb + d]);
            }
            s = reduce8(acc) * P.scale;
        } else {
            var acc2 = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            for (var d = 0u; d < P.split; d = d + 1u) {
                acc[d & 7u] = acc[d & 7u] + opq(Q[qb + d] * K[kb + d]);
            }
            for (var d = P.split; d < hd; d = d + 1u) {
                acc2[(d - P.split) & 7u] = acc2[(d - P.split) & 7u] + opq(Q[qb + d] * K[kb + d]);
            }
            s = (reduce8(acc) + reduce8(acc2)) * P.scale;
        }
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
    if (P.sinks != 0u && SK[h] > mx) {
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
        if (P.sinks != 0u) {
            sum = sum + det_exp(SK[h] - mx);
        }
        total = sum;
    }
    workgroupBarrier();
    let sum = total;
    for (var j = li; j < len; j = j + 64u) {
        S[sb + j] = div_cr(S[sb + j], sum);
    }
    storageBarrier();
    for (var d = li; d < P.v_dim; d = d + 64u) {
        var acc = 0.0;
        for (var j = 0u; j < len; j = j + 1u) {
            var pos = lo + j;
            if (sel) {
                pos = SEL[selb + j];
            }
            acc = acc + opq(S[sb + j] * V[pos * P.v_stride + kvh * P.v_dim + d]);
        }
        O[ob + d] = acc;
    }
}
