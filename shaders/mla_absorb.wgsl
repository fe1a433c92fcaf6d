// mla_absorb.wgsl — MLA's absorbed queries (mla::attention): for every position i and
// head h, the query row the latent attention scores against the cache rows [latent,
// rotary key]:
//   QC[i, h, c]     = sum_{d < dn} Q[i, h, d] * kv_b[h * (dn + dv) + d, c]   for c < r
//                     (W_uk_h^T q_nope_h: d ascending, from 0.0, each product rounded
//                     before the add (opq), as the CPU's loop)
//   QC[i, h, r + e] = Q[i, h, dn + e]                                        for e < dr
//                     (the rotated query part, copied)
// kv_b's rows are decoded exactly (weights.wgsl's wval), whatever their stored type.
//
// Preludes: common/arith.wgsl, common/weights.wgsl (W, DTYPE, GROUP, wval).
// Bindings:
//   0 P   uniform Params
//   1 W   storage read  u32 kv_b_proj [n_heads * (dn + dv), r], one row block (weights.wgsl)
//   2 Q   storage read  f32 [n, n_heads, dn + dr]   queries, rotary part rotated
//   3 QC  storage rw    f32 [n, n_heads, r + dr]
// Workgroup: 64 threads, one per output value.
// Dispatch: ceil(n * n_heads * (r + dr) / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    n_heads: u32,
    dn: u32,
    dr: u32,
    r: u32,
    head_rows: u32, // dn + dv: kv_b rows per head
    row_words: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> Q: array<f32>;
@group(0) @binding(3) var<storage, read_write> QC: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    let width = P.r + P.dr;
    if (t >= P.n * P.n_heads * width) {
        return;
    }
    let c = t % width;
    let ih = t / width; // i * n_heads + h
    let h = ih % P.n_heads;
    let qb = ih * (P.dn + P.dr);
    if (c >= P.r) {
        QC[t] = Q[qb + P.dn + (c - P.r)];
        return;
    }
    var acc = 0.0;
    for (var d = 0u; d < P.dn; d = d + 1u) {
        acc = acc + opq(Q[qb + d] * wval(h * P.head_rows + d, c, P.r, P.row_words));
    }
    QC[t] = acc;
}
