// moe_accumulate.wgsl — adds one expert's outputs into the MoE block output with the
// routing weights: OUT[dst_i, d] += Y[i, d] * w_i for the m positions routed to it.
// The host dispatches experts in ascending index order, as MoeBlock::forward adds them,
// and rounds each product before the add (opq), so the sums are the CPU's bits. A
// position appears at most once per expert, so one dispatch has no write conflicts.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P      uniform Params
//   1 OUT    storage rw    f32 [n, hidden]
//   2 Y      storage read  f32 [m, hidden]      the expert's outputs
//   3 ROUTE  storage read  u32 [route_offset + 2 * m]: (dst position, bitcast weight) pairs
// Workgroup: 64 threads, one per (i, d).
// Dispatch: ceil(m * hidden / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    m: u32,
    hidden: u32,
    route_offset: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(2) var<storage, read> Y: array<f32>;
@group(0) @binding(3) var<storage, read> ROUTE: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.m * P.hidden) {
        return;
    }
    let i = t / P.hidden;
    let d = t % P.hidden;
    let dst = ROUTE[P.route_offset + 2u * i];
    let w = bitcast<f32>(ROUTE[P.route_offset + 2u * i + 1u]);
    let o = dst * P.hidden + d;
    OUT[o] = OUT[o] + opq(Y[t] * w);
}
