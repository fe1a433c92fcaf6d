// add.wgsl — Y[y_offset + i] += B[b_offset + i % period] for i < len: residual adds
// (period = len) and bias adds broadcast over positions (period = bias length).
//
// Preludes: none.
// Bindings:
//   0 P  uniform Params
//   1 Y  storage rw    f32 [y_offset + len]
//   2 B  storage read  f32 [b_offset + period]
// Workgroup: 64 threads, one per element.
// Dispatch: ceil(len / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    len: u32,
    period: u32,
    y_offset: u32,
    b_offset: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.len) {
        return;
    }
    Y[P.y_offset + t] = Y[P.y_offset + t] + B[P.b_offset + t % P.period];
}
