// delta_rule.wgsl — Gated DeltaNet's recurrence over n positions in order, as
// deltanet::delta_step computes it for each value head h (key head g = h / ratio) with
// its state S_h (k_head_dim x v_head_dim):
//   S *= decay; mem = S^T k; delta = (v - mem) * beta; S += k delta^T; o = S^T q.
// Column j of S_h only meets column j: one thread owns it and runs every position, its
// sums over the key dimension in ascending order from 0.0, each product rounded before
// it is added (opq), exactly the CPU's loop.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P    uniform Params
//   1 MIX  storage read  f32 [n, conv_dim]: per position q (n_k_heads x k_head_dim,
//                              normalised and scaled), k (same, normalised), v
//                              (n_v_heads x v_head_dim)
//   2 GT   storage read  f32 [n, 2 * n_v_heads]: beta of every head, then decay
//   3 S    storage rw    f32 [n_v_heads, k_head_dim, v_head_dim]   the state
//   4 O    storage rw    f32 [n, n_v_heads * v_head_dim]           the heads' outputs
// Workgroup: 64 threads, one per state column.
// Dispatch: n_v_heads * col_groups workgroups (col_groups = ceil(v_head_dim / 64)),
//   split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    v_heads: u32,
    ratio: u32,
    dk: u32,
    dv: u32,
    key_dim: u32,
    conv_dim: u32,
    col_groups: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> MIX: array<f32>;
@group(0) @binding(2) var<storage, read> GT: array<f32>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let w = wg.x + wg.y * P.groups_x;
    let h = w / P.col_groups;
    let j = (w % P.col_groups) * 64u + li;
    if (h >= P.v_heads || j >= P.dv) {
        return;
    }
    let g = h / P.ratio;
    let vd = P.v_heads * P.dv;
    let s0 = h * P.dk * P.dv + j;
    for (var t = 0u; t < P.n; t = t + 1u) {
        let base = t * P.conv_dim;
        let q0 = base + g * P.dk;
        let k0 = base + P.key_dim + g * P.dk;
        let beta = GT[t * 2u * P.v_heads + h];
        let decay = GT[t * 2u * P.v_heads + P.v_heads + h];
        // mem = (S * decay)^T k
        var mem = 0.0;
        for (var i = 0u; i < P.dk; i = i + 1u) {
            let s = S[s0 + i * P.dv] * decay;
            S[s0 + i * P.dv] = s;
            mem = mem + opq(s * MIX[k0 + i]);
        }
        let delta = (MIX[base + 2u * P.key_dim + h * P.dv + j] - mem) * beta;
        // S += k delta^T; o = S^T q
        var o = 0.0;
        for (var i = 0u; i < P.dk; i = i + 1u) {
            let s = S[s0 + i * P.dv] + opq(MIX[k0 + i] * delta);
            S[s0 + i * P.dv] = s;
            o = o + opq(s * MIX[q0 + i]);
        }
        O[t * vd + h * P.dv + j] = o;
    }
}
