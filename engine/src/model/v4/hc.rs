//! Manifold-constrained hyper-connections (mHC), in a fixed float order: every sum runs
//! in index order, so a backend that follows this order gives the same bits.

use crate::math;

/// The weights of one position: `post` (N) and `comb` (N, N; row j, column k: what
/// stream j gives stream k), from that position's mixes ((2 + N) N floats).
#[allow(clippy::too_many_arguments)]
pub fn weights(
    base: &[f32],
    scale: &[f32],
    mix: &[f32],
    n_hc: usize,
    iters: usize,
    eps: f32,
    pre: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) {
    let (b, s) = (base, scale);
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

/// `out = sum_j w_j x_j` over the N streams of one position, in stream order.
pub fn mix_streams(w: &[f32], x: &[f32], hidden: usize, out: &mut [f32]) {
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

/// The hyper-head's weights of one position: pre_j = sigmoid(mix_j * scale + base_j) + eps.
pub fn head_pre(mix: &[f32], base: &[f32], scale: f32, eps: f32, pre: &mut [f32]) {
    for (j, p) in pre.iter_mut().enumerate() {
        *p = math::sigmoid(mix[j] * scale + base[j]) + eps;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sinkhorn-Knopp leaves comb doubly stochastic (to the float error of its eps).
    #[test]
    fn comb_is_doubly_stochastic() {
        let n_hc = 4;
        let m = (2 + n_hc) * n_hc;
        let base: Vec<f32> = (0..m).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let scale = [1.0, 0.5, 2.0];
        let mix: Vec<f32> = (0..m).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0).collect();
        let (mut pre, mut post, mut comb) = (vec![0.0; n_hc], vec![0.0; n_hc], vec![0.0; n_hc * n_hc]);
        // The last step normalises the columns; the rows converge with the iterations.
        for (iters, row_tol) in [(20, 2e-2), (200, 1e-4)] {
            weights(&base, &scale, &mix, n_hc, iters, 1e-6, &mut pre, &mut post, &mut comb);
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
