// deltanet_conv.wgsl — Gated DeltaNet's depthwise causal conv1d (kernel K, no bias) and
// SiLU, in place over n positions, carrying the conv window across calls, as
// DeltaNetWeights::conv_silu computes it (engine/src/model/deltanet.rs):
//   acc = sum_j CW[ch, j] * in_j, in = [the K - 1 previous inputs (WIN), X[t, ch]],
//   summed in ascending j from 0.0, each product rounded before it is added (opq);
//   X[t, ch] = silu(acc) (det_silu); then the window drops its oldest input and
//   appends X[t, ch]'s input.
// Each channel is independent and runs its positions in order in one thread.
//
// Preludes: common/arith.wgsl.
// Bindings:
//   0 P    uniform Params
//   1 X    storage rw    f32 [n, channels]        conv input q|k|v, becomes silu(conv)
//   2 CW   storage read  f32 [channels, kernel]   taps, oldest input first
//   3 WIN  storage rw    f32 [kernel - 1, channels] the last inputs, oldest first
// Workgroup: 64 threads, one per channel.
// Dispatch: ceil(channels / 64) workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    channels: u32,
    kernel: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> CW: array<f32>;
@group(0) @binding(3) var<storage, read_write> WIN: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let ch = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (ch >= P.channels || P.kernel == 0u) {
        return;
    }
    let cd = P.channels;
    let h = P.kernel - 1u;
    let w0 = ch * P.kernel;
    for (var t = 0u; t < P.n; t = t + 1u) {
        let x = X[t * cd + ch];
        var acc = 0.0;
        for (var j = 0u; j < h; j = j + 1u) {
            acc = acc + opq(CW[w0 + j] * WIN[j * cd + ch]);
        }
        acc = acc + opq(CW[w0 + h] * x);
        if (h > 0u) {
            for (var j = 0u; j + 1u < h; j = j + 1u) {
                WIN[j * cd + ch] = WIN[(j + 1u) * cd + ch];
            }
            WIN[(h - 1u) * cd + ch] = x;
        }
        X[t * cd + ch] = det_silu(acc);
    }
}
