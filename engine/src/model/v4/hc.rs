//! Manifold-constrained hyper-connections (mHC), in a fixed float order: every sum runs
//! in index order, so a backend that follows this order gives the same bits.

use crate::kernels::matmul;
use crate::math;

use super::HyperConnection;

/// The unweighted RMSNorm of each row of `x` (rows of `width`): x * (1 / sqrt(mean(x^2) + eps)).
pub fn unweighted_rmsnorm(x: &[f32], width: usize, eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(width) {
        let mut ss = 0.0f32;
        for v in row.iter() {
            ss += v * v;
        }
        let inv = 1.0 / (ss / width as f32 + eps).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    }
    out
}

/// The weights of one position: `post` (N) and `comb` (N, N; row j, column k: what
/// stream j gives stream k), from that position's mixes ((2 + N) N floats).
pub fn weights(
    hc: &HyperConnection,
    mix: &[f32],
    n_hc: usize,
    iters: usize,
    eps: f32,
    pre: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) {
    let (b, s) = (&hc.base, &hc.scale);
    for j in 0..n_hc {
        pre[j] = math::sigmoid(mix[j] * s[0] + b[j]) + eps;
        post[j] = 2.0 * math::sigmoid(mix[n_hc + j] * s[1] + b[n_hc + j]);
    }
    let at = 2 * n_hc;
    for j in 0..n_hc {
        let row = &mut comb[j * n_hc..(j + 1) * n_hc];
        for k in 0..n_hc {
            row[k] = mix[at + j * n_hc + k] * s[2] + b[at + j * n_hc + k];
        }
        math::softmax(row);
        row.iter_mut().for_each(|v| *v += eps);
    }
    normalise_columns(comb, n_hc, eps);
    for _ in 1..iters {
        for row in comb.chunks_exact_mut(n_hc) {
            let mut sum = 0.0f32;
            for v in row.iter() {
                sum += v;
            }
            row.iter_mut().for_each(|v| *v /= sum + eps);
        }
        normalise_columns(comb, n_hc, eps);
    }
}

fn normalise_columns(comb: &mut [f32], n_hc: usize, eps: f32) {
    for k in 0..n_hc {
        let mut sum = 0.0f32;
        for j in 0..n_hc {
            sum += comb[j * n_hc + k];
        }
        for j in 0..n_hc {
            comb[j * n_hc + k] /= sum + eps;
        }
    }
}

/// Before a block: for each of the n positions of the streams `x` (n, N, hidden), the
/// collapsed input sum_j pre_j x_j (n, hidden), and the `post` (n, N) and `comb`
/// (n, N, N) weights for [`expand`].
pub fn collapse(
    hc: &HyperConnection,
    x: &[f32],
    n: usize,
    n_hc: usize,
    hidden: usize,
    iters: usize,
    eps: f32,
    rms_eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let width = n_hc * hidden;
    let normed = unweighted_rmsnorm(&x[..n * width], width, rms_eps);
    let m = (2 + n_hc) * n_hc;
    let mut mix = vec![0.0f32; n * m];
    matmul(&hc.fn_, &normed, n, &mut mix);
    let mut out = vec![0.0f32; n * hidden];
    let (mut post, mut comb) = (vec![0.0f32; n * n_hc], vec![0.0f32; n * n_hc * n_hc]);
    let mut pre = vec![0.0f32; n_hc];
    for p in 0..n {
        weights(
            hc,
            &mix[p * m..(p + 1) * m],
            n_hc,
            iters,
            eps,
            &mut pre,
            &mut post[p * n_hc..(p + 1) * n_hc],
            &mut comb[p * n_hc * n_hc..(p + 1) * n_hc * n_hc],
        );
        mix_streams(&pre, &x[p * width..(p + 1) * width], hidden, &mut out[p * hidden..(p + 1) * hidden]);
    }
    (out, post, comb)
}

/// `out = sum_j w_j x_j` over the N streams of one position, in stream order.
fn mix_streams(w: &[f32], x: &[f32], hidden: usize, out: &mut [f32]) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for (j, wj) in w.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(&x[j * hidden..(j + 1) * hidden]) {
            *o += wj * v;
        }
    }
}

/// After a block: the streams `x` (n, N, hidden) become x'_k = post_k y + sum_j comb_jk x_j,
/// `y` (n, hidden) the block's output.
pub fn expand(x: &mut [f32], y: &[f32], post: &[f32], comb: &[f32], n: usize, n_hc: usize, hidden: usize) {
    let width = n_hc * hidden;
    let mut acc = vec![0.0f32; hidden];
    let mut next = vec![0.0f32; width];
    for p in 0..n {
        let xs = &x[p * width..(p + 1) * width];
        let c = &comb[p * n_hc * n_hc..(p + 1) * n_hc * n_hc];
        for k in 0..n_hc {
            acc.iter_mut().for_each(|v| *v = 0.0);
            for j in 0..n_hc {
                let w = c[j * n_hc + k];
                for (a, v) in acc.iter_mut().zip(&xs[j * hidden..(j + 1) * hidden]) {
                    *a += w * v;
                }
            }
            let pk = post[p * n_hc + k];
            for ((o, a), yv) in next[k * hidden..(k + 1) * hidden].iter_mut().zip(&acc).zip(&y[p * hidden..]) {
                *o = pk * yv + a;
            }
        }
        x[p * width..(p + 1) * width].copy_from_slice(&next);
    }
}

/// The hyper-head: each position's streams collapsed with pre = sigmoid(mix * scale +
/// base) + eps (rows `first..n` of `x`), (n - first, hidden).
#[allow(clippy::too_many_arguments)]
pub fn head(
    fn_: &crate::tensor::Mat,
    base: &[f32],
    scale: f32,
    x: &[f32],
    first: usize,
    n: usize,
    n_hc: usize,
    hidden: usize,
    eps: f32,
    rms_eps: f32,
) -> Vec<f32> {
    let width = n_hc * hidden;
    let rows = n - first;
    let normed = unweighted_rmsnorm(&x[first * width..n * width], width, rms_eps);
    let mut mix = vec![0.0f32; rows * n_hc];
    matmul(fn_, &normed, rows, &mut mix);
    let mut out = vec![0.0f32; rows * hidden];
    let mut pre = vec![0.0f32; n_hc];
    for p in 0..rows {
        for j in 0..n_hc {
            pre[j] = math::sigmoid(mix[p * n_hc + j] * scale + base[j]) + eps;
        }
        let xs = &x[(first + p) * width..(first + p + 1) * width];
        mix_streams(&pre, xs, hidden, &mut out[p * hidden..(p + 1) * hidden]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Mat;

    /// Sinkhorn-Knopp leaves comb doubly stochastic (to the float error of its eps).
    #[test]
    fn comb_is_doubly_stochastic() {
        let n_hc = 4;
        let m = (2 + n_hc) * n_hc;
        let hc = HyperConnection {
            fn_: Mat::from_f32(m, 1, &vec![0.0; m]).unwrap(),
            base: (0..m).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect(),
            scale: vec![1.0, 0.5, 2.0],
        };
        let mix: Vec<f32> = (0..m).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0).collect();
        let (mut pre, mut post, mut comb) = (vec![0.0; n_hc], vec![0.0; n_hc], vec![0.0; n_hc * n_hc]);
        // The last step normalises the columns; the rows converge with the iterations.
        for (iters, row_tol) in [(20, 2e-2), (200, 1e-4)] {
            weights(&hc, &mix, n_hc, iters, 1e-6, &mut pre, &mut post, &mut comb);
            for k in 0..n_hc {
                let col: f32 = (0..n_hc).map(|j| comb[j * n_hc + k]).sum();
                let row: f32 = comb[k * n_hc..(k + 1) * n_hc].iter().sum();
                assert!((col - 1.0).abs() < 1e-5 && (row - 1.0).abs() < row_tol, "{iters}: {row} {col}");
            }
        }
        assert!(post.iter().all(|p| *p > 0.0 && *p < 2.0));
        assert!(pre.iter().all(|p| *p > 0.0 && *p < 1.0 + 1e-5));
    }
}
