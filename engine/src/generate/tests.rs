//! The generation loop against a scripted model: logits chosen per step, so the budget,
//! context limit, stop ids and stop strings are checked without weights.

use super::*;

/// The ids a scripted forward pass was fed.
type Fed = std::rc::Rc<std::cell::RefCell<Vec<u32>>>;

/// A forward pass whose argmax is `script[n]` at the n-th call; records what was fed.
fn scripted(script: Vec<u32>, vocab: usize) -> (impl FnMut(&[u32]) -> Result<Vec<f32>>, Fed) {
    let fed = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let f2 = fed.clone();
    let mut step = 0;
    let forward = move |ids: &[u32]| {
        f2.borrow_mut().extend_from_slice(ids);
        let mut row = vec![0.0f32; vocab];
        row[script[step.min(script.len() - 1)] as usize] = 1.0;
        step += 1;
        Ok(row)
    };
    (forward, fed)
}

fn opts(max_new_tokens: usize, stop_ids: Vec<u32>) -> GenerateOptions {
    GenerateOptions { max_new_tokens, sampler: SamplerConfig::default(), stop_ids, logprobs: None }
}

#[test]
fn the_context_limit_allows_exactly_what_fits() {
    // 8 positions, 3 history + 3 prompt: tokens 1 and 2 come from positions 5 and 6
    // (0-based), token 3 would need position 7's logits from feeding token 2 at 6... the
    // k-th token needs used + k - 1 positions: 6 + 3 - 1 = 8 fits, a 4th does not.
    let limit = 8;
    let (mut fwd, fed) = scripted(vec![4, 5, 6, 7, 8], 10);
    let (out, why) = generate_with(&mut fwd, &[1, 1, 1], &[2, 2, 2], limit, &opts(100, vec![]), &mut |_| true).unwrap();
    assert_eq!(out, [4, 5, 6]);
    assert_eq!(why, StopReason::Length);
    // Everything fed fits in the context: 3 history + the prompt + two fed tokens = 8.
    assert_eq!(3 + fed.borrow().len(), limit);
    // A prompt that fills the context still gives one token; one more does not fit.
    let (mut fwd, _) = scripted(vec![4], 10);
    let (out, _) = generate_with(&mut fwd, &[], &[1; 8], limit, &opts(5, vec![]), &mut |_| true).unwrap();
    assert_eq!(out, [4]);
    let (mut fwd, _) = scripted(vec![4], 10);
    let e = generate_with(&mut fwd, &[1], &[1; 8], limit, &opts(5, vec![]), &mut |_| true).unwrap_err();
    assert!(matches!(e, Error::ContextOverflow { len: 9, limit: 8 }), "{e}");
    assert_eq!(context_room(6, 8), Some(3));
    assert_eq!(context_room(9, 8), None);
}

#[test]
fn budget_stop_ids_and_cancel() {
    let (mut fwd, fed) = scripted(vec![4, 5, 6, 7], 10);
    let (out, why) = generate_with(&mut fwd, &[], &[1], 100, &opts(2, vec![]), &mut |_| true).unwrap();
    assert_eq!((out.as_slice(), why), (&[4, 5][..], StopReason::Length));
    assert_eq!(*fed.borrow(), [1, 4], "the last token is never fed");
    let (mut fwd, _) = scripted(vec![4, 5, 6, 7], 10);
    let (out, why) = generate_with(&mut fwd, &[], &[1], 100, &opts(9, vec![6]), &mut |_| true).unwrap();
    assert_eq!((out.as_slice(), why), (&[4, 5, 6][..], StopReason::Stop));
    let (mut fwd, _) = scripted(vec![4, 5, 6, 7], 10);
    let (out, why) = generate_with(&mut fwd, &[], &[1], 100, &opts(9, vec![]), &mut |id| id != 5).unwrap();
    assert_eq!((out.as_slice(), why), (&[4, 5][..], StopReason::Cancelled));
    let (mut fwd, fed) = scripted(vec![4], 10);
    let (out, why) = generate_with(&mut fwd, &[], &[1], 100, &opts(0, vec![]), &mut |_| true).unwrap();
    assert!(out.is_empty() && why == StopReason::Length && fed.borrow().is_empty());
    let e = generate_with(&mut fwd, &[], &[], 100, &opts(3, vec![]), &mut |_| true).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)));
}

#[test]
fn the_repetition_penalty_sees_history_prompt_and_output() {
    // Logits favour 3 then 2; with a strong penalty, ids already seen lose.
    let cfg = SamplerConfig { repetition_penalty: 100.0, ..SamplerConfig::default() };
    let o = GenerateOptions { max_new_tokens: 2, sampler: cfg, stop_ids: vec![], logprobs: None };
    let mut g = Generator::new(&[3], &[0], 100, &o).unwrap();
    let row = [0.0f32, 0.5, 1.0, 2.0];
    assert_eq!(g.input(), Some(&[0u32][..]));
    assert_eq!(g.accept(&row, None).unwrap(), 2, "3 is in the history");
    assert_eq!(g.accept(&row, None).unwrap(), 1, "2 was produced");
    assert_eq!(g.finished(), Some(StopReason::Length));
    assert!(g.input().is_none() && g.accept(&row, None).is_err());
}

/// A model whose logits at a position depend only on the token there (a fixed table),
/// with random-looking values so sampling has something to draw from.
fn table_row(id: u32, vocab: usize) -> Vec<f32> {
    (0..vocab)
        .map(|j| {
            (((id as usize * 31 + j * 17) % 23) as f32) * 0.25
                - if j == (id as usize * 3 + 1) % vocab { -9.0 } else { 0.0 }
        })
        .collect()
}

#[test]
fn speculation_gives_the_same_tokens_in_fewer_passes() {
    let vocab = 12;
    for temperature in [0.0, 1.0] {
        let cfg = SamplerConfig { temperature, seed: 5, ..SamplerConfig::default() };
        let o = GenerateOptions { max_new_tokens: 40, sampler: cfg, stop_ids: vec![], logprobs: None };
        let prompt = [1u32, 4, 1, 4, 1];
        let mut fwd = |ids: &[u32]| Ok(table_row(*ids.last().unwrap(), vocab));
        let (plain, _) = generate_with(&mut fwd, &[], &prompt, 100, &o, &mut |_| true).unwrap();

        let mut g = Generator::new(&[], &prompt, 100, &o).unwrap().with_speculation(4);
        let mut context: Vec<u32> = Vec::new();
        let mut passes = 0;
        while let Some(ids) = g.input() {
            let n = g.rows_needed();
            let before = context.len();
            context.extend_from_slice(ids);
            let rows: Vec<f32> = context[context.len() - n..].iter().flat_map(|&id| table_row(id, vocab)).collect();
            passes += 1;
            let kept = g.accept_rows(&rows, None).unwrap();
            context.truncate(before + kept);
        }
        assert_eq!(g.produced(), plain.as_slice(), "temperature {temperature}");
        let s = g.spec_stats();
        assert_eq!((s.forwards, s.produced), (passes, plain.len()));
        if temperature == 0.0 {
            assert!(s.accepted > 0 && passes < plain.len(), "greedy cycles repeat: {s:?}");
        }
        assert_eq!(context.len() + 1, prompt.len() + plain.len(), "everything but the last token is fed");
    }
}

/// Drafts from a drafter that knows the model ([`table_row`]'s argmax) or one that is
/// wrong for greedy decoding: the same tokens as plain decoding, greedy and sampled.
#[test]
fn drafts_from_a_drafter_give_the_same_tokens() {
    let vocab = 12;
    struct Table(usize, bool);
    impl Drafter for Table {
        fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
            let mut out = Vec::new();
            let mut last = *context.last().unwrap();
            for _ in 0..k {
                last = if self.1 { crate::math::argmax(&table_row(last, self.0)) as u32 } else { (last * 3 + 2) % 12 };
                out.push(last);
            }
            Ok(out)
        }
    }
    for temperature in [0.0, 1.0] {
        let cfg = SamplerConfig { temperature, seed: 9, ..SamplerConfig::default() };
        let o = GenerateOptions { max_new_tokens: 30, sampler: cfg, stop_ids: vec![], logprobs: None };
        let prompt = [2u32, 7, 3];
        let mut fwd = |ids: &[u32]| Ok(table_row(*ids.last().unwrap(), vocab));
        let (plain, _) = generate_with(&mut fwd, &[5], &prompt, 100, &o, &mut |_| true).unwrap();
        for knows in [true, false] {
            let mut context: Vec<u32> = vec![5];
            let mut forward = |keep: usize, ids: &[u32], which: Logits| {
                context.truncate(keep);
                context.extend_from_slice(ids);
                let rows = if which == Logits::All { ids } else { &ids[ids.len() - 1..] };
                Ok(rows.iter().flat_map(|&id| table_row(id, vocab)).collect())
            };
            let mut g = Generator::new(&[5], &prompt, 100, &o).unwrap().with_external_drafts(4);
            let mut seen = Vec::new();
            let why = drive_drafted(&mut forward, 1, &mut g, Some(&mut Table(vocab, knows)), &mut |id| {
                seen.push(id);
                true
            })
            .unwrap();
            assert_eq!((g.produced(), why), (plain.as_slice(), StopReason::Length), "t {temperature} knows {knows}");
            assert_eq!(seen, plain, "on_token sees every token once, in order");
            let s = g.spec_stats();
            assert_eq!(s.produced, plain.len());
            if knows && temperature == 0.0 {
                assert_eq!(s.accepted, s.drafted, "{s:?}");
                assert!(s.forwards <= plain.len().div_ceil(5) + 1, "{s:?}");
            }
            if !knows && temperature == 0.0 {
                // Its first draft is never the argmax (3 id + 1).
                assert_eq!((s.accepted, s.forwards), (0, plain.len()), "{s:?}");
            }
        }
    }
}
