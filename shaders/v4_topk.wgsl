// v4_topk.wgsl — DeepSeek-V4's lightning indexer's choice (v4::compress::select) from the
// scores of index_scores.wgsl: for query i (position p = pos0 + i) of the vis =
// min((p + 1) / rate, keys) entries it may see, the topk with the highest score, ties to
// the lower entry (the CPU's sort: descending score, then ascending index; all of them
// when vis <= topk), listed in ascending entry order.
//
// A radix select, O(vis) per query: each score becomes a u32 key that orders as the
// float does (-0 as +0, as the CPU's comparison has them equal), and four passes over
// the keys, one byte each from the top, count the keys that share the bytes found so far
// in a 256-bin histogram; the bin where the count from the top reaches topk gives the
// next byte of T, the topk-th largest key. Entries with a key above T are kept, and of
// those equal to T the lowest-numbered ones until topk are kept.
//
// Bindings:
//   0 P     uniform Params
//   1 S     storage read  f32 [n, s_stride]        the scores (j < vis read)
//   2 FL    storage rw    u32 [n, s_stride]        scratch: 1 above T, 2 equal to T, 0 below
//   3 LIST  storage rw    u32 [n, topk + 1]        per query: the count, then the entries
// Workgroup: 256 threads for one query, each taking j, j + 256, ...; thread 0 chooses the
// bins and lists. Dispatch: n workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    pos0: u32,
    rate: u32,
    keys: u32,
    topk: u32,
    s_stride: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read_write> FL: array<u32>;
@group(0) @binding(3) var<storage, read_write> LIST: array<u32>;

const WG: u32 = 256u;

var<workgroup> hist: array<atomic<u32>, 256>;
// [the key's bytes found so far, how many of the keys equal to them are still to keep]
var<workgroup> found: vec2<u32>;

// The score as a key with the float's order: negative values' bits flipped, others with
// the sign bit set; both zeros give the key of +0.
fn key(v: f32) -> u32 {
    let b = select(bitcast<u32>(v), 0u, v == 0.0);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = wg.x + wg.y * P.groups_x;
    if (i >= P.n) {
        return;
    }
    let p = P.pos0 + i;
    let vis = min((p + 1u) / P.rate, P.keys);
    let sb = i * P.s_stride;
    let lb = i * (P.topk + 1u);
    if (vis <= P.topk) {
        if (li == 0u) {
            for (var j = 0u; j < vis; j = j + 1u) {
                LIST[lb + 1u + j] = j;
            }
            LIST[lb] = vis;
        }
        return;
    }
    if (li == 0u) {
        found = vec2<u32>(0u, P.topk);
    }
    for (var round = 0u; round < 4u; round = round + 1u) {
        let shift = 24u - 8u * round;
        // The bytes above this pass's: 0 on the first round (shift 32 is not a WGSL shift).
        let mask = select(0xffffffffu << (shift + 8u), 0u, round == 0u);
        atomicStore(&hist[li], 0u);
        let want = workgroupUniformLoad(&found);
        for (var j = li; j < vis; j = j + WG) {
            let k = key(S[sb + j]);
            if ((k & mask) == want.x) {
                atomicAdd(&hist[(k >> shift) & 255u], 1u);
            }
        }
        workgroupBarrier();
        if (li == 0u) {
            // From the top bin down: the bin holding the remaining count's last key.
            var left = want.y;
            var bin = 255u;
            loop {
                let c = atomicLoad(&hist[bin]);
                if (c >= left || bin == 0u) {
                    break;
                }
                left = left - c;
                bin = bin - 1u;
            }
            found = vec2<u32>(want.x | (bin << shift), left);
        }
        workgroupBarrier();
    }
    let t = workgroupUniformLoad(&found);
    for (var j = li; j < vis; j = j + WG) {
        let k = key(S[sb + j]);
        FL[sb + j] = select(select(0u, 2u, k == t.x), 1u, k > t.x);
    }
    storageBarrier();
    workgroupBarrier();
    if (li == 0u) {
        var c = 0u;
        var ties = t.y;
        for (var j = 0u; j < vis; j = j + 1u) {
            let f = FL[sb + j];
            if (f == 1u || (f == 2u && ties > 0u)) {
                if (f == 2u) {
                    ties = ties - 1u;
                }
                LIST[lb + 1u + c] = j;
                c = c + 1u;
            }
        }
        LIST[lb] = c;
    }
}
