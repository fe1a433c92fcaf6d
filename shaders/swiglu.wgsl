// swiglu.wgsl — the SwiGLU gate, in place, as kernels::Activation::apply computes it:
//   clamped = 0: G[i] = silu(G[i]) * U[i], silu(x) = x / (1 + e^-x) (math::silu: det_exp,
//                correctly rounded division);
//   clamped = 1 (gpt_oss): g = min(G[i], limit), u = clamp(U[i], -limit, limit),
//                G[i] = (u + 1) * (g * sigmoid(g * alpha)), each product rounded (opq).
//   clamped = 2 (deepseek_v4): G[i] = silu(min(G[i], limit)) * clamp(U[i], -limit, limit).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P  uniform Params
//   1 G  storage rw    f32 [len]   gate projection, becomes the expert's hidden activation
//   2 U  storage read  f32 [len]   up projection
// Workgroup: 64 threads, one per element.
// Dispatch: ceil(len / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    len: u32,
    clamped: u32,
    alpha: f32,
    limit: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> G: array<f32>;
@group(0) @binding(2) var<storage, read> U: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.len) {
        return;
    }
    if (P.clamped == 0u) {
        G[t] = det_silu(G[t]) * U[t];
        return;
    }
    // f32::min and f32::clamp: a NaN gate becomes the limit, a NaN up stays NaN.
    let g = select(P.limit, G[t], G[t] < P.limit);
    let u = select(select(U[t], P.limit, U[t] > P.limit), -P.limit, U[t] < -P.limit);
    if (P.clamped == 2u) {
        G[t] = det_silu(g) * u;
        return;
    }
    G[t] = opq(u + 1.0) * opq(g * det_sigmoid(opq(g * P.alpha)));
}
