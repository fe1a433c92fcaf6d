//! Several sequences in one forward pass (Model::forward_batch, continuous batching) give
//! each sequence the logits it gets alone, bit for bit, on every fixture family: plain and
//! sliding-window attention with sinks, MLA, DSA's indexer, Gated DeltaNet's recurrence,
//! shared experts with and without their gate, MXFP4 and FP8 weights. A sequence joins
//! mid-way with its whole prompt while the others decode (the rows of a prefill and of
//! decode steps in one pass), and a MoE layer reports each expert once per pass. A sequence
//! that records its final-normed states (an MTP drafter's) gets `forward_hidden`'s bits.
//! DeepSeek-V4 runs each sequence over its own compressed state: the same bits through
//! windows, compression boundaries and a state that restarts after a cut.

use std::collections::HashMap;
use std::path::PathBuf;

use colibri_engine::{Logits, Model};

const FAMILIES: &[&str] = &[
    "olmoe",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v3",
    "deepseek_v3_noqlora",
    "deepseek_v3_fp8",
    "deepseek_v32",
    "glm_moe_dsa",
    "glm4_moe",
    "gpt_oss",
    "gpt_oss_mxfp4",
    "qwen3_next",
    "qwen3_5_moe",
];

fn open(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
    Model::open_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: logit count");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!("{what}: logit {i} is {} in the batch, {} alone", got[i], want[i]);
    }
}

/// One batched pass over the `active` sessions with `ids`; asserts that each (layer, expert)
/// ran once (the batch's union) and returns the logits and the routed positions counted.
fn batch_step(
    model: &Model,
    sessions: &mut [colibri_engine::model::Session],
    active: &[usize],
    ids: &[&[u32]],
    what: &str,
) -> (Vec<Vec<f32>>, usize) {
    let mut uses: HashMap<(usize, usize), usize> = HashMap::new();
    let mut positions = 0;
    let mut refs: Vec<&mut colibri_engine::model::Session> =
        sessions.iter_mut().enumerate().filter(|(i, _)| active.contains(i)).map(|(_, s)| s).collect();
    let logits = model
        .forward_batch_with(&mut refs, ids, &mut |l, e, count| {
            *uses.entry((l, e)).or_default() += 1;
            positions += count;
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Some((key, n)) = uses.iter().find(|(_, &n)| n > 1) {
        panic!("{what}: expert {key:?} ran {n} times in one pass");
    }
    (logits, positions)
}

/// Sequence i's inputs, step by step: its prompt at the step it joins, then one token per
/// step.
fn schedule(v: u32) -> Vec<(usize, Vec<Vec<u32>>)> {
    let prompt = |len: u32, seed: u32| (0..len).map(|i| (i * 7919 + seed) % v).collect::<Vec<u32>>();
    let steps = |p: Vec<u32>, seed: u32, k: u32| {
        let mut s = vec![p];
        s.extend((0..k).map(|i| vec![(i * 104_729 + seed) % v]));
        s
    };
    vec![
        // (first step, inputs): two sequences start together with different prompt
        // lengths; a third joins at step 2 with a prompt while they decode.
        (0, steps(prompt(9, 13), 5, 4)),
        (0, steps(prompt(3, 101), 17, 4)),
        (2, steps(prompt(6, 7), 29, 2)),
    ]
}

#[test]
fn a_batch_gives_each_sequence_its_own_bits() {
    for &name in FAMILIES {
        let model = open(name);
        let plan = schedule(model.cfg.vocab as u32);
        // Alone: each sequence's logits after each of its inputs.
        let alone: Vec<Vec<Vec<f32>>> = plan
            .iter()
            .map(|(_, inputs)| {
                let mut s = model.new_session();
                inputs.iter().map(|ids| model.forward(&mut s, ids, Logits::Last).unwrap()).collect()
            })
            .collect();
        let mut sessions: Vec<_> = plan.iter().map(|_| model.new_session()).collect();
        let last_step = plan.iter().map(|(start, inputs)| start + inputs.len()).max().unwrap();
        for step in 0..last_step {
            let active: Vec<usize> =
                (0..plan.len()).filter(|&i| step >= plan[i].0 && step < plan[i].0 + plan[i].1.len()).collect();
            let ids: Vec<&[u32]> = active.iter().map(|&i| plan[i].1[step - plan[i].0].as_slice()).collect();
            let (logits, positions) = batch_step(&model, &mut sessions, &active, &ids, &format!("{name}, step {step}"));
            for (j, &i) in active.iter().enumerate() {
                same_bits(&format!("{name}, step {step}, sequence {i}"), &logits[j], &alone[i][step - plan[i].0]);
            }
            let rows: usize = ids.iter().map(|t| t.len()).sum();
            let moe_layers =
                model.layers.iter().filter(|l| matches!(l.ffn, colibri_engine::model::Ffn::Moe(_))).count();
            assert_eq!(positions, rows * moe_layers * model.cfg.router.top_k, "{name}, step {step}: routed positions");
        }
        for (i, s) in sessions.iter().enumerate() {
            let fed: usize = plan[i].1.iter().map(Vec::len).sum();
            assert_eq!(s.len(), fed, "{name}: sequence {i}'s session holds its tokens");
        }
    }
}

#[test]
fn bad_batches_are_clear_errors_and_leave_the_sessions_alone() {
    let model = open("olmoe");
    let (mut a, mut b) = (model.new_session(), model.new_session());
    model.forward(&mut a, &[1, 2, 3], Logits::Last).unwrap();
    let err = model.forward_batch(&mut [&mut a, &mut b], &[&[4], &[]]).unwrap_err().to_string();
    assert!(err.contains("no tokens"), "{err}");
    let err = model.forward_batch(&mut [&mut a], &[&[4], &[5]]).unwrap_err().to_string();
    assert!(err.contains("1 sessions, 2 logits choices and 2 state choices for 2 inputs"), "{err}");
    let too_big = model.cfg.vocab as u32;
    assert!(model.forward_batch(&mut [&mut a, &mut b], &[&[4], &[too_big]]).is_err());
    assert_eq!((a.len(), b.len()), (3, 0), "a refused batch feeds nothing");
    // The sessions still decode as before.
    let mut alone = model.new_session();
    model.forward(&mut alone, &[1, 2, 3], Logits::Last).unwrap();
    let want = model.forward(&mut alone, &[4], Logits::Last).unwrap();
    let got = model.forward_batch(&mut [&mut a], &[&[4]]).unwrap();
    same_bits("after a refused batch", &got[0], &want);
}

/// Each sequence gets the logits it asks for: none (a prompt's unfinished chunk), its last
/// row, or every row of its ids (speculation's verification, echo's prompt logprobs), the
/// bits `Model::forward` gives alone; a recurrent family feeds tokens again first and still
/// returns only its own ids' rows.
#[test]
fn a_batch_gives_each_sequence_the_rows_it_asks_for() {
    for &name in &["olmoe", "deepseek_v32", "qwen3_next", "deepseek_v4"] {
        let model = open(name);
        let v = model.cfg.vocab as u32;
        let prompts: Vec<Vec<u32>> =
            (0..3u32).map(|s| (0..5 + 3 * s).map(|i| (i * 7919 + 31 * s + 1) % v).collect()).collect();
        let which = [None, Some(Logits::Last), Some(Logits::All)];
        let mut alone = Vec::new();
        for (p, w) in prompts.iter().zip(&which) {
            let mut s = model.new_session();
            alone.push(match w {
                None => {
                    model.forward(&mut s, p, Logits::Last).unwrap();
                    Vec::new()
                }
                Some(w) => model.forward(&mut s, p, *w).unwrap(),
            });
        }
        let mut sessions: Vec<_> = prompts.iter().map(|_| model.new_session()).collect();
        let mut refs: Vec<_> = sessions.iter_mut().collect();
        let ids: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let got = model.forward_batch_rows(&mut refs, &ids, &which).unwrap();
        for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
            same_bits(&format!("{name} sequence {i}"), g, a);
        }
        assert_eq!(got[2].len(), prompts[2].len() * model.cfg.vocab, "{name}: every row of the third");
        // The sessions hold what was fed: a next token decodes as alone.
        let next = [3u32 % v];
        let mut s = model.new_session();
        model.forward(&mut s, &prompts[0], Logits::Last).unwrap();
        let want = model.forward(&mut s, &next, Logits::Last).unwrap();
        let mut one = [&mut sessions[0]];
        let got = model.forward_batch_rows(&mut one, &[&next], &[Some(Logits::Last)]).unwrap();
        same_bits(&format!("{name} after a rowless chunk"), &got[0], &want);
    }
}

/// The states an MTP drafter records, asked of some sequences of a batch: each gets
/// `Model::forward_hidden`'s logits and states bit for bit (its own ids' rows only, also
/// where a recurrent family feeds cut-back tokens again first), the others none.
#[test]
fn a_batch_gives_the_states_a_drafter_records() {
    for &name in &["deepseek_v3_mtp", "qwen3_next", "olmoe", "deepseek_v4"] {
        let model = open(name);
        let (v, h) = (model.cfg.vocab as u32, model.cfg.hidden);
        let prompts: Vec<Vec<u32>> =
            (0..3u32).map(|s| (0..6 + 2 * s).map(|i| (i * 7919 + 31 * s + 5) % v).collect()).collect();
        let steps: [(&[u32], Logits, bool); 3] =
            [(&[7 % v, 9 % v], Logits::All, true), (&[11 % v], Logits::Last, false), (&[13 % v], Logits::Last, true)];
        // Alone: the prompt, cut back by two (a recurrent state then feeds them again), the step.
        let mut alone = Vec::new();
        let mut sessions = Vec::new();
        for (p, (ids, w, _)) in prompts.iter().zip(&steps) {
            let mut s = model.new_session();
            model.forward(&mut s, p, Logits::Last).unwrap();
            s.truncate(p.len() - 2);
            alone.push(model.forward_hidden(&mut s, ids, *w).unwrap());
            let mut b = model.new_session();
            model.forward(&mut b, p, Logits::Last).unwrap();
            b.truncate(p.len() - 2);
            sessions.push(b);
        }
        let mut refs: Vec<_> = sessions.iter_mut().collect();
        let ids: Vec<&[u32]> = steps.iter().map(|s| s.0).collect();
        let which: Vec<Option<Logits>> = steps.iter().map(|s| Some(s.1)).collect();
        let hidden: Vec<bool> = steps.iter().map(|s| s.2).collect();
        let got = model.forward_batch_hidden(&mut refs, &ids, &which, &hidden).unwrap();
        for (i, ((logits, states), (want_l, want_s))) in got.iter().zip(&alone).enumerate() {
            same_bits(&format!("{name} sequence {i} logits"), logits, want_l);
            if hidden[i] {
                assert_eq!(states.len(), ids[i].len() * h, "{name} sequence {i}: its own ids' states");
                same_bits(&format!("{name} sequence {i} states"), states, want_s);
            } else {
                assert!(states.is_empty(), "{name} sequence {i} asked for no states");
            }
        }
    }
}

/// One DeepSeek-V4 sequence's plan: the step it joins, its inputs (a prompt, then one
/// token a step), and the input before which its session is cut back to a length (its
/// compressed state cannot go back: it restarts, and the kept tokens are fed again).
struct V4Plan {
    start: usize,
    inputs: Vec<Vec<u32>>,
    cut: Option<(usize, usize)>,
}

fn v4_plans(v: u32) -> Vec<V4Plan> {
    let prompt = |len: u32, seed: u32| (0..len).map(|i| (i * 7919 + seed) % v).collect::<Vec<u32>>();
    let steps = |p: Vec<u32>, seed: u32, k: u32| {
        let mut s = vec![p];
        s.extend((0..k).map(|i| vec![(i * 104_729 + seed) % v]));
        s
    };
    // The window keeps 5 keys; CSA compresses every 4 positions, HCA every 8: 40 + 12
    // positions cross the window many times over and several boundaries of both.
    vec![
        V4Plan { start: 0, inputs: steps(prompt(40, 13), 5, 12), cut: None },
        V4Plan { start: 0, inputs: steps(prompt(13, 101), 17, 12), cut: Some((6, 9)) },
        V4Plan { start: 3, inputs: steps(prompt(21, 7), 29, 9), cut: None },
        V4Plan { start: 1, inputs: steps(prompt(1, 3), 41, 12), cut: Some((11, 4)) },
    ]
}

/// DeepSeek-V4 in a batch: each sequence's rows run over its own state (window,
/// compressors, indexer), so every sequence gets the logits it gets alone, bit for bit,
/// through prompts of different lengths, decode steps past the window and over
/// compression boundaries, a sequence joining mid-way, and one cut back (its state
/// restarts and its kept tokens are fed again in the batch); the states end as alone.
#[test]
fn deepseek_v4_batches_each_sequence_over_its_own_state() {
    for name in ["deepseek_v4", "deepseek_v4_fp8"] {
        let model = open(name);
        let plans = v4_plans(model.cfg.vocab as u32);
        let mut alone_sessions: Vec<_> = plans.iter().map(|_| model.new_session()).collect();
        let alone: Vec<Vec<Vec<f32>>> = plans
            .iter()
            .zip(&mut alone_sessions)
            .map(|(p, s)| {
                let mut out = Vec::new();
                for (j, ids) in p.inputs.iter().enumerate() {
                    if let Some((_, len)) = p.cut.filter(|c| c.0 == j) {
                        s.truncate(len);
                    }
                    out.push(model.forward(s, ids, Logits::Last).unwrap());
                }
                out
            })
            .collect();
        let layers = model.v4.as_ref().unwrap().layers.len();
        let mut sessions: Vec<_> = plans.iter().map(|_| model.new_session()).collect();
        let last_step = plans.iter().map(|p| p.start + p.inputs.len()).max().unwrap();
        for step in 0..last_step {
            let active: Vec<usize> = (0..plans.len())
                .filter(|&i| step >= plans[i].start && step < plans[i].start + plans[i].inputs.len())
                .collect();
            let ids: Vec<&[u32]> = active.iter().map(|&i| plans[i].inputs[step - plans[i].start].as_slice()).collect();
            let mut rows = 0;
            for (&i, t) in active.iter().zip(&ids) {
                let s = &mut sessions[i];
                if let Some((_, len)) = plans[i].cut.filter(|c| c.0 == step - plans[i].start) {
                    s.truncate(len);
                    assert_eq!(s.cached_len(), 0, "{name}: sequence {i}'s state restarts");
                }
                rows += s.len() - s.cached_len() + t.len();
            }
            let (logits, positions) = batch_step(&model, &mut sessions, &active, &ids, &format!("{name}, step {step}"));
            for (j, &i) in active.iter().enumerate() {
                let want = &alone[i][step - plans[i].start];
                same_bits(&format!("{name}, step {step}, sequence {i}"), &logits[j], want);
            }
            assert_eq!(positions, rows * layers * model.cfg.router.top_k, "{name}, step {step}: routed positions");
        }
        for (i, (s, a)) in sessions.iter().zip(&alone_sessions).enumerate() {
            assert_eq!(s.tokens, a.tokens, "{name}: sequence {i}'s tokens");
            assert_eq!(s.v4, a.v4, "{name}: sequence {i}'s state is the one it keeps alone");
            assert_eq!(s.v4.as_ref().unwrap().pos, s.len(), "{name}: sequence {i}'s state holds every token");
        }
    }
}

/// The model's experts, failing once at the `n`-th `expert` call after [`FailOnce::arm`]
/// (a read that fails mid-pass: a helper gone, a truncated file).
struct FailOnce {
    inner: Box<dyn colibri_engine::experts::ExpertSource>,
    /// Calls left before the failure; usize::MAX: disarmed.
    left: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl colibri_engine::experts::ExpertSource for FailOnce {
    fn expert(
        &self,
        layer: usize,
        index: usize,
    ) -> colibri_engine::Result<std::sync::Arc<colibri_engine::experts::Expert>> {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.fetch_add(1, SeqCst);
        match self.left.load(SeqCst) {
            usize::MAX => {}
            0 => {
                self.left.store(usize::MAX, SeqCst);
                return Err(colibri_engine::Error::Invalid(format!(
                    "injected: expert ({layer}, {index}) could not be read"
                )));
            }
            n => self.left.store(n - 1, SeqCst),
        }
        self.inner.expert(layer, index)
    }

    fn prepare(&self, layer: usize, experts: &[usize]) -> colibri_engine::Result<()> {
        self.inner.prepare(layer, experts)
    }
}

/// A batched pass that fails mid-way (an expert read fails after some layers have updated
/// their caches and states) returns the error and leaves every session as it was: the next
/// pass gives each sequence the bits it gets alone. A recurrent state that had moved goes
/// back (and feeds again), a DeepSeek-V4 state restarts and feeds its tokens again.
#[test]
fn a_batch_failing_mid_pass_leaves_each_sequence_exact() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    for name in ["olmoe", "deepseek_v3", "qwen3_next", "deepseek_v4", "deepseek_v4_fp8"] {
        let reference = open(name);
        let mut model = open(name);
        let (left, calls) = (Arc::new(AtomicUsize::new(usize::MAX)), Arc::new(AtomicUsize::new(0)));
        model.experts = Box::new(FailOnce { inner: open(name).experts, left: left.clone(), calls: calls.clone() });
        let v = model.cfg.vocab as u32;
        let prompts: [Vec<u32>; 2] =
            [(0..20u32).map(|i| (i * 37 + 5) % v).collect(), (0..9u32).map(|i| (i * 53 + 11) % v).collect()];
        let (mut a, mut b) = (model.new_session(), model.new_session());
        model.forward_batch(&mut [&mut a, &mut b], &[&prompts[0], &prompts[1]]).unwrap();
        // A decode step, counting its expert calls; the next one fails half-way through them.
        calls.store(0, SeqCst);
        model.forward_batch(&mut [&mut a, &mut b], &[&[7], &[8]]).unwrap();
        let per_pass = calls.load(SeqCst);
        assert!(per_pass >= 4, "{name}: {per_pass} expert calls in a pass");
        left.store(per_pass / 2, SeqCst);
        let err = model.forward_batch(&mut [&mut a, &mut b], &[&[9], &[10]]).unwrap_err().to_string();
        assert!(err.contains("injected"), "{name}: {err}");
        assert_eq!((a.len(), b.len()), (21, 10), "{name}: the failed pass fed nothing");
        // The same step again, then one more: each sequence's bits alone.
        let mut got = model.forward_batch(&mut [&mut a, &mut b], &[&[9], &[10]]).unwrap();
        got.extend(model.forward_batch(&mut [&mut a, &mut b], &[&[11], &[12]]).unwrap());
        for (i, (p, next)) in prompts.iter().zip([[7, 9, 11], [8, 10, 12]]).enumerate() {
            let mut s = reference.new_session();
            reference.forward(&mut s, p, Logits::Last).unwrap();
            reference.forward(&mut s, &next[..1], Logits::Last).unwrap();
            let after = reference.forward(&mut s, &next[1..2], Logits::Last).unwrap();
            same_bits(&format!("{name} sequence {i} after the failed pass"), &got[i], &after);
            let more = reference.forward(&mut s, &next[2..], Logits::Last).unwrap();
            same_bits(&format!("{name} sequence {i} a step later"), &got[2 + i], &more);
        }
    }
}
