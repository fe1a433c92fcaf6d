// split_gate.wgsl — the query projection of a gated attention (qwen3_next) apart: QG holds
// per head the head_dim query values, then as many gate values; Q and G receive them
// (attention::split_gate on the CPU): Q[h * hd + j] = QG[2 * h * hd + j] and
// G[h * hd + j] = QG[2 * h * hd + hd + j] for every head row h < rows (positions x heads).
//
// Preludes: none.
// Bindings:
//   0 P   uniform Params
//   1 QG  storage read  f32 [rows * 2 * hd]
//   2 Q   storage rw    f32 [rows * hd]
//   3 G   storage rw    f32 [rows * hd]
// Workgroup: 64 threads, one per output element.
// Dispatch: ceil(rows * hd / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    len: u32,
    hd: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> QG: array<f32>;
@group(0) @binding(2) var<storage, read_write> Q: array<f32>;
@group(0) @binding(3) var<storage, read_write> G: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.len) {
        return;
    }
    let head = t / P.hd;
    let j = t % P.hd;
    Q[t] = QG[2u * head * P.hd + j];
    G[t] = QG[2u * head * P.hd + P.hd + j];
}
