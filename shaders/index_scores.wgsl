// index_scores.wgsl — DeepSeek Sparse Attention's index scores (dsa::select), also
// DeepSeek-V4's lightning indexer's (v4::compress::select, the same sums): for every
// query i of the pass (position p = pos0 + i) and every key j < min((p + 1) / rate, keys)
// (DSA: rate 1, every position j <= p; V4: the compressed entries p may see),
//   S[i, j] = sum_h w_h * max(dot(q_h, k_j) * scale, 0)       h ascending, from 0.0
//   w_h     = IW[i, h] * head_scale                            (rounded)
// dot uses math::dot's 8-lane order; the keys are DSA's indexer keys in the layer's MLA
// cache rows (the pass's rows copied there first), or V4's indexer entries. DSA's host
// reads S back and keeps the index_topk best positions per query (dsa::choose); V4's
// top-k is v4_topk.wgsl.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P   uniform Params
//   1 IQ  storage read  f32 [n, heads, head_dim]     the indexer's rotated queries
//   2 IW  storage read  f32 [n, heads]               weights_proj's output
//   3 K   storage read  f32 [keys, row]              key rows, the key at k_offset
//   4 S   storage rw    f32 [n, s_stride]            scores (the keys j above written)
// Workgroup: 64 threads for one query, each taking j, j + 64, ...
// Dispatch: n workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    pos0: u32,
    heads: u32,
    head_dim: u32,
    row: u32,
    k_offset: u32,
    s_stride: u32,
    scale: f32,
    head_scale: f32,
    rate: u32,
    keys: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> IQ: array<f32>;
@group(0) @binding(2) var<storage, read> IW: array<f32>;
@group(0) @binding(3) var<storage, read> K: array<f32>;
@group(0) @binding(4) var<storage, read_write> S: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = wg.x + wg.y * P.groups_x;
    if (i >= P.n) {
        return;
    }
    let p = P.pos0 + i;
    let hd = P.head_dim;
    let count = min((p + 1u) / P.rate, P.keys);
    for (var j = li; j < count; j = j + 64u) {
        let kb = j * P.row + P.k_offset;
        var score = 0.0;
        for (var h = 0u; h < P.heads; h = h + 1u) {
            let qb = (i * P.heads + h) * hd;
            var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            for (var d = 0u; d < hd; d = d + 1u) {
                acc[d & 7u] = acc[d & 7u] + opq(IQ[qb + d] * K[kb + d]);
            }
            let s = reduce8(acc) * P.scale;
            let w = IW[i * P.heads + h] * P.head_scale;
            score = score + opq(w * max(s, 0.0));
        }
        S[i * P.s_stride + j] = score;
    }
}
