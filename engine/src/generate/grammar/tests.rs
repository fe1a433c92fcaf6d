//! The token mask with a real tokenizer (the fixtures' byte-level BPE, 401 ids) and real
//! llguidance, driven by logits from a seeded random stream instead of a model: whatever
//! the logits say, the output must match the grammar.

use super::*;
use crate::generate::{GenerateOptions, Generator, StopReason};
use crate::sampler::{Rng, SamplerConfig};
use crate::tokenizer::DecodeStream;
use serde_json::json;

fn tokenizer() -> Tokenizer {
    let dir = std::path::PathBuf::from(format!("{}/../tests/fixtures/qwen2_moe", env!("CARGO_MANIFEST_DIR")));
    Tokenizer::from_dir(&dir).unwrap()
}

/// `<|im_end|>`, the fixtures' eos.
const EOS: u32 = 400;

/// Generates under `grammar` from random logits (a different row each step); returns the
/// text, the ids and why it ended.
fn run(tok: &Tokenizer, grammar: &Grammar, seed: u64, max_new_tokens: usize) -> (String, Vec<u32>, StopReason) {
    let opts = GenerateOptions {
        max_new_tokens,
        sampler: SamplerConfig { temperature: 1.0, seed, ..SamplerConfig::default() },
        stop_ids: vec![EOS],
        logprobs: None,
    };
    let c = Constraint::new(tok, grammar).unwrap();
    let mut g =
        Generator::new(&[], &[1], 4096, &opts).unwrap().with_constraint(c).with_text(DecodeStream::default(), vec![]);
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut text = String::new();
    while g.input().is_some() {
        // Random logits in [-4, 4), and the eos made likely, so the mask has to hold it back.
        let mut row: Vec<f32> = (0..401).map(|_| (rng.next_f64() * 8.0 - 4.0) as f32).collect();
        row[EOS as usize] = 6.0;
        g.accept(&row, Some(tok)).unwrap();
        text.push_str(&g.take_text());
    }
    (text, g.produced().to_vec(), g.finished().unwrap())
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "member": {"type": "boolean"},
            "tier": {"enum": ["gold", "silver"]}
        },
        "required": ["name", "age", "member", "tier"],
        "additionalProperties": false
    })
}

#[test]
fn json_schema_output_validates_for_any_logits() {
    let tok = tokenizer();
    let g = Grammar::json_schema(person_schema());
    for seed in 0..12 {
        let (text, ids, why) = run(&tok, &g, seed, 200);
        assert_eq!(why, StopReason::Stop, "seed {seed}: {text}");
        assert!(!ids.contains(&EOS), "the grammar ends the output itself: {ids:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.keys().collect::<Vec<_>>(), ["name", "age", "member", "tier"], "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{text}");
        assert!(o["member"].is_boolean(), "{text}");
        assert!(["gold", "silver"].contains(&o["tier"].as_str().unwrap()), "{text}");
        assert!(text.starts_with("{\"name\": \""), "colibri's JSON style: {text}");
    }
}

#[test]
fn gbnf_regex_and_lark_constrain_the_same_way() {
    let tok = tokenizer();
    let gbnf = Grammar::from_text("root ::= answer \".\"\nanswer ::= \"yes\" | \"no\" | [0-9]{1,3}\n");
    assert!(matches!(gbnf, Grammar::Gbnf(_)));
    let lark = Grammar::from_text("start: answer \".\"\nanswer: \"yes\" | \"no\" | /[0-9]{1,3}/\n");
    assert!(matches!(lark, Grammar::Lark(_)));
    let regex = Grammar::Regex("(yes|no|[0-9]{1,3})\\.".into());
    let ok = |t: &str| {
        let body = t.strip_suffix('.').unwrap_or("?");
        body == "yes"
            || body == "no"
            || (!body.is_empty() && body.len() <= 3 && body.bytes().all(|b| b.is_ascii_digit()))
    };
    for g in [&gbnf, &lark, &regex] {
        for seed in 0..8 {
            let (text, _, why) = run(&tok, g, seed, 50);
            assert!(ok(&text), "{g:?} seed {seed}: {text:?}");
            assert_eq!(why, StopReason::Stop);
        }
    }
}

#[test]
fn the_stop_id_waits_until_the_grammar_may_end() {
    // `a+`: after one "a" the output may end (the eos, favoured, then wins), never before.
    let tok = tokenizer();
    for seed in 0..6 {
        let (text, ids, why) = run(&tok, &Grammar::Regex("a+".into()), seed, 50);
        assert_eq!((text.as_str(), why), ("a", StopReason::Stop), "seed {seed}");
        assert_eq!(ids.last(), Some(&EOS));
    }
}

#[test]
fn a_budget_that_runs_out_says_length() {
    let tok = tokenizer();
    let (text, ids, why) = run(&tok, &Grammar::json_schema(person_schema()), 3, 4);
    assert_eq!((ids.len(), why), (4, StopReason::Length));
    assert!(serde_json::from_str::<Value>(&text).is_err(), "a cut object is not valid JSON: {text}");
    assert!(text.starts_with("{\""), "{text}");
}

#[test]
fn json_object_and_greedy_choice_among_allowed_tokens() {
    let tok = tokenizer();
    let (text, _, why) = run(&tok, &Grammar::JsonObject, 5, 300);
    if why == StopReason::Stop {
        assert!(serde_json::from_str::<Value>(&text).unwrap().is_object(), "{text}");
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
    // Greedy: the most likely allowed token, whatever the unconstrained favourite.
    let mut c = Constraint::new(&tok, &Grammar::Regex("b".into())).unwrap();
    let mut row = vec![0.0f32; 401];
    let b = tok.token_to_id("b").unwrap();
    row[tok.token_to_id("a").unwrap() as usize] = 9.0;
    row[b as usize] = -3.0;
    let masked = c.mask(&row, &[EOS]).unwrap();
    assert_eq!(crate::math::argmax(masked), b as usize);
    assert_eq!(masked.iter().filter(|x| x.is_finite()).count(), 1, "only `b` spells the grammar's start");
}

#[test]
fn grammars_the_library_refuses_give_its_message() {
    let tok = tokenizer();
    let e = |g: Grammar| Constraint::new(&tok, &g).err().expect("refused").to_string();
    assert!(e(Grammar::Lark("start: missing_rule".into())).contains("missing_rule"), "names the rule");
    assert!(e(Grammar::Regex("(unclosed".into())).starts_with("grammar: "));
    let bad_type = e(Grammar::json_schema(json!({"type": "frobnicate"})));
    assert!(bad_type.contains("frobnicate"), "{bad_type}");
    assert!(e(Grammar::Gbnf("root ::= [z-a]".into())).contains("GBNF line 1"));
}

/// A Lark grammar that compiles (its first mask is computed) but fails at its first
/// token: after "a", `b`'s `n` alternatives are all predicted at once, one Earley row
/// past llguidance's `max_items_in_row` (2,000) when `n` > 2,000. The one way found to
/// make a constraint fail mid-generation, deterministically (an output that can only end
/// completes the grammar instead: [`Constraint::is_complete`]).
pub fn fails_after_its_first_token(n: usize) -> String {
    let alts: Vec<String> = (0..n).map(|i| format!("b{i}")).collect();
    let mut lark = format!("start: \"a\" b\nb: {}\n", alts.join(" | "));
    for i in 0..n {
        lark.push_str(&format!("b{i}: \"x\" \"{i}\"\n"));
    }
    lark
}

/// A grammar that fails mid-generation gives an error naming the grammar and llguidance's
/// reason (its parser state dump left out), never a token outside the grammar.
#[test]
fn a_grammar_that_fails_mid_generation_is_an_error() {
    let tok = tokenizer();
    let opts = GenerateOptions { max_new_tokens: 20, stop_ids: vec![EOS], ..GenerateOptions::default() };
    // 1,900 alternatives stay within the limit: "a", then "x" and a number.
    let c = Constraint::new(&tok, &Grammar::Lark(fails_after_its_first_token(1900))).unwrap();
    let mut g = Generator::new(&[], &[1], 4096, &opts).unwrap().with_constraint(c);
    while g.input().is_some() {
        g.accept(&[0.0f32; 401], Some(&tok)).unwrap();
    }
    assert!(tok.decode(g.produced(), true).unwrap().starts_with("ax"));
    let c = Constraint::new(&tok, &Grammar::Lark(fails_after_its_first_token(2100))).unwrap();
    let mut g = Generator::new(&[], &[1], 4096, &opts).unwrap().with_constraint(c);
    let e = g.accept(&[0.0f32; 401], Some(&tok)).unwrap_err();
    assert!(matches!(e, Error::Grammar(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("grammar: ") && msg.contains("max is 2000"), "{msg}");
    assert!(!msg.contains("<state>") && msg.len() < 300, "{msg}");
}

/// A compilation cancelled before it starts, or while llguidance builds the parser,
/// answers Cancelled instead of computing its first mask; one not cancelled compiles.
#[test]
fn a_cancelled_compilation_stops_before_its_first_mask() {
    let tok = tokenizer();
    let g = Grammar::json_schema(person_schema());
    let cancel = CompileCancel::default();
    assert!(Constraint::new_cancellable(&tok, &g, Some(&cancel)).is_ok());
    cancel.cancel();
    let e = Constraint::new_cancellable(&tok, &g, Some(&cancel)).err().unwrap();
    assert!(matches!(e, Error::Cancelled), "{e}");
}
