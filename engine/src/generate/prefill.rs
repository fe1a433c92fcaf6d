//! Long prompts fed in chunks, so that a caller can stop between them: a 4,000-token
//! prompt is otherwise one forward pass that nothing interrupts (a client that went away,
//! a Ctrl-C), and the model stays busy, the next request waiting, until it ends.
//!
//! Chunking never changes a bit: every matmul row is one `math::dot` of a position's
//! input, attention reads the cache the earlier chunks wrote exactly as one pass would,
//! and the recurrent layers run token by token in either case (the engine's prefill ==
//! decode property; `tests::chunked_prefill_gives_the_same_bits` asserts it at
//! [`PREFILL_CHUNK`] on every family's fixture in `engine/tests/it/kv_reuse.rs`).

use crate::error::{Error, Result};
use crate::model::Logits;

/// Positions per forward pass of a prompt. Measured on the demo model (docs/benchmarks.md,
/// "Chunked prefill"): 64, 128 and 256 all prefill within noise of one whole pass there;
/// 256 keeps the most expert-weight reuse per pass on real MoE models (each routed
/// expert's rows are decoded once per pass for all its positions) while a cancellation
/// waits at most one chunk (85 ms on the demo model).
pub const PREFILL_CHUNK: usize = 256;

/// A forward pass after everything fed so far: `(ids, which)` -> the logits `which` asks for.
pub type Pass<'a> = dyn FnMut(&[u32], Logits) -> Result<Vec<f32>> + 'a;

/// Feeds `ids` through `forward(part, which)` (each part after everything fed before it)
/// in pieces of at most `chunk` positions, asking `go_on()` before each piece; returns the
/// logits `which` asks for, the same bits as one pass over `ids`. Err([`Error::Cancelled`])
/// when `go_on()` said no: the pieces fed until then stay in the caller's context (a
/// valid cache of a prefix of `ids`).
pub fn feed_chunked(
    forward: &mut Pass<'_>,
    ids: &[u32],
    which: Logits,
    chunk: usize,
    go_on: &mut dyn FnMut() -> bool,
) -> Result<Vec<f32>> {
    feed_pieces(forward, ids, which, chunk, &[], go_on)
}

/// [`feed_chunked`] whose pieces also end at `ends` (offsets into `ids`, ascending: where
/// a model whose state goes back only to snapshots should have one,
/// [`super::snapshot_cuts`]); the same bits.
pub fn feed_pieces(
    forward: &mut Pass<'_>,
    ids: &[u32],
    which: Logits,
    chunk: usize,
    ends: &[usize],
    go_on: &mut dyn FnMut() -> bool,
) -> Result<Vec<f32>> {
    if !go_on() {
        return Err(Error::Cancelled);
    }
    let chunk = chunk.max(1);
    if ids.len() <= chunk && !ends.iter().any(|&e| 0 < e && e < ids.len()) {
        return forward(ids, which);
    }
    let mut bounds = Vec::new();
    let mut at = 0;
    while at < ids.len() {
        let end = ends.iter().copied().find(|&e| e > at).unwrap_or(usize::MAX).min(at + chunk).min(ids.len());
        bounds.push((at, end));
        at = end;
    }
    let mut rows = Vec::new();
    let mut parts = bounds.iter().map(|&(a, b)| &ids[a..b]).peekable();
    while let Some(part) = parts.next() {
        let last = parts.peek().is_none();
        // An earlier piece's last row is not needed with Logits::Last: it is computed
        // (one lm_head row per piece) and dropped.
        let got = forward(part, which)?;
        match which {
            Logits::All => rows.extend_from_slice(&got),
            Logits::Last if last => rows = got,
            Logits::Last => {}
        }
        if !last && !go_on() {
            return Err(Error::Cancelled);
        }
    }
    Ok(rows)
}

/// [`feed_chunked`] over a forward pass that returns the last position's logits only.
pub fn feed_chunked_last(
    forward: &mut dyn FnMut(&[u32]) -> Result<Vec<f32>>,
    ids: &[u32],
    chunk: usize,
    go_on: &mut dyn FnMut() -> bool,
) -> Result<Vec<f32>> {
    feed_chunked(&mut |part, _| forward(part), ids, Logits::Last, chunk, go_on)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy backend whose logits depend on everything fed so far (a running sum), and
    /// the sizes of the passes it was asked for.
    type Passes = std::rc::Rc<std::cell::RefCell<Vec<usize>>>;

    fn toy() -> (impl FnMut(&[u32], Logits) -> Result<Vec<f32>>, Passes) {
        let passes = Passes::default();
        let seen = passes.clone();
        let mut sum = 0u32;
        let f = move |ids: &[u32], which: Logits| {
            seen.borrow_mut().push(ids.len());
            let mut rows = Vec::new();
            for &id in ids {
                sum = sum.wrapping_mul(31).wrapping_add(id);
                rows.extend_from_slice(&[sum as f32, (sum % 7) as f32]);
            }
            Ok(match which {
                Logits::All => rows,
                Logits::Last => rows[rows.len() - 2..].to_vec(),
            })
        };
        (f, passes)
    }

    #[test]
    fn chunks_give_what_one_pass_gives() {
        let ids: Vec<u32> = (0..1000).map(|i| i * 7 % 101).collect();
        for which in [Logits::Last, Logits::All] {
            let (mut whole, _) = toy();
            let want = whole(&ids, which).unwrap();
            for chunk in [1, 3, 64, 999, 1000, 5000] {
                let (mut f, passes) = toy();
                let got = feed_chunked(&mut f, &ids, which, chunk, &mut || true).unwrap();
                assert_eq!(got, want, "chunk {chunk}");
                assert_eq!(passes.borrow().len(), ids.len().div_ceil(chunk));
                assert!(passes.borrow().iter().all(|&n| n <= chunk));
            }
        }
    }

    #[test]
    fn pieces_end_at_the_ends_too_and_give_what_one_pass_gives() {
        let ids: Vec<u32> = (0..600).map(|i| i * 7 % 101).collect();
        for which in [Logits::Last, Logits::All] {
            let (mut whole, _) = toy();
            let want = whole(&ids, which).unwrap();
            for (ends, sizes) in [
                (vec![100, 599], vec![100, 256, 243, 1]),
                (vec![0, 256, 600, 700], vec![256, 256, 88]),
                (vec![5], vec![5, 256, 256, 83]),
            ] {
                let (mut f, passes) = toy();
                assert_eq!(feed_pieces(&mut f, &ids, which, 256, &ends, &mut || true).unwrap(), want, "{ends:?}");
                assert_eq!(*passes.borrow(), sizes, "{ends:?}");
            }
            let (mut f, passes) = toy();
            assert_eq!(
                feed_pieces(&mut f, &ids[..10], which, 256, &[9], &mut || true).unwrap(),
                toy().0(&ids[..10], which).unwrap()
            );
            assert_eq!(*passes.borrow(), vec![9, 1]);
        }
    }

    #[test]
    fn go_on_is_asked_before_every_chunk() {
        let ids = vec![1u32; 100];
        let (mut f, passes) = toy();
        let mut asked = 0;
        let e = feed_chunked(&mut f, &ids, Logits::Last, 10, &mut || {
            asked += 1;
            asked <= 3
        })
        .unwrap_err();
        assert!(matches!(e, Error::Cancelled), "{e}");
        // Three chunks fed, the fourth refused.
        assert_eq!(*passes.borrow(), vec![10, 10, 10]);
        // A caller that already stopped feeds nothing.
        let (mut f, passes) = toy();
        assert!(matches!(feed_chunked(&mut f, &[1, 2], Logits::Last, 10, &mut || false), Err(Error::Cancelled)));
        assert!(passes.borrow().is_empty());
    }
}
