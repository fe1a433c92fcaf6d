// gate_mul.wgsl — an elementwise output gate, in place: X[i] = X[i] * act(G[i]), with
//   act = 0: sigmoid (math::sigmoid, qwen3_next's attention output gate:
//            attn_output * torch.sigmoid(gate));
//   act = 1: silu (math::silu, Gated DeltaNet's gated RMSNorm: normed * silu(z)).
// sigmoid/silu use det_exp and a correctly rounded division (det_sigmoid, det_silu).
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P  uniform Params
//   1 X  storage rw    f32 [len]
//   2 G  storage read  f32 [len]   gate logits
// Workgroup: 64 threads, one per element.
// Dispatch: ceil(len / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    len: u32,
    act: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.len) {
        return;
    }
    if (P.act == 0u) {
        X[t] = X[t] * det_sigmoid(G[t]);
    } else {
        X[t] = X[t] * det_silu(G[t]);
    }
}
