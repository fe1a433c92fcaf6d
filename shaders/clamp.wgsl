// clamp.wgsl — X[i] = clamp(X[i], -c, c) in place (olmoe's clip_qkv; f32::clamp on the CPU).
//
// Preludes: none.
// Bindings:
//   0 P  uniform Params
//   1 X  storage rw  f32 [len]
// Workgroup: 64 threads, one per element.
// Dispatch: ceil(len / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    len: u32,
    c: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.len) {
        return;
    }
    X[t] = min(max(X[t], -P.c), P.c);
}
