//! `coli generate --json-schema / --grammar / --regex` on a fixture (random weights) and
//! on the demo model: the text must match whatever the model prefers; a grammar the
//! library refuses is one line on stderr.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{json, Value};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("coli-structured-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn generate(model: &PathBuf, args: &[&str]) -> Output {
    coli().args(["generate", "--model"]).arg(model).args(["--prompt", "Plan:", "--json"]).args(args).output().unwrap()
}

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn json_schema_output_validates_on_a_fixture_and_the_demo() {
    let schema = json!({"type": "object", "properties": {
        "task": {"type": "string", "maxLength": 10},
        "priority": {"enum": ["low", "high"]},
        "hours": {"type": "integer", "minimum": 0, "maximum": 40}},
        "required": ["task", "priority", "hours"], "additionalProperties": false});
    let file = scratch("schema.json", &schema.to_string());
    let file = file.to_str().unwrap();
    let models = [root().join("tests/fixtures/qwen2_moe"), root().join("models/demo")];
    for model in &models {
        for seed in ["1", "2"] {
            let v = json_out(&generate(
                model,
                &["--json-schema", file, "--max-new-tokens", "80", "--temperature", "1", "--seed", seed],
            ));
            assert_eq!(v["finish_reason"], "stop", "{v}");
            let out: Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {v}"));
            assert!(out["task"].as_str().unwrap().chars().count() <= 10, "{out}");
            assert!(out["priority"] == "low" || out["priority"] == "high", "{out}");
            assert!((0..=40).contains(&out["hours"].as_i64().unwrap()), "{out}");
            assert_eq!(out.as_object().unwrap().len(), 3);
        }
    }
    // The budget runs out first: finish_reason length, and the text is a cut-off prefix.
    let v = json_out(&generate(&models[0], &["--json-schema", file, "--max-new-tokens", "3"]));
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["ids"].as_array().unwrap().len(), 3);
    assert!(serde_json::from_str::<Value>(v["text"].as_str().unwrap()).is_err());
}

#[test]
fn gbnf_and_regex_constrain_the_demo() {
    let demo = root().join("models/demo");
    let gbnf = scratch(
        "answer.gbnf",
        "# llama.cpp style\nroot ::= verdict \": \" num\nverdict ::= \"ok\" | \"fail\"\nnum ::= [1-9] [0-9]?\n",
    );
    let v = json_out(&generate(&demo, &["--grammar", gbnf.to_str().unwrap(), "--max-new-tokens", "20"]));
    let text = v["text"].as_str().unwrap();
    let (verdict, num) = text.split_once(": ").unwrap_or_else(|| panic!("{v}"));
    assert!(verdict == "ok" || verdict == "fail", "{text}");
    assert!(num.parse::<u32>().is_ok_and(|n| (1..=99).contains(&n)), "{text}");
    assert_eq!(v["finish_reason"], "stop");

    let v = json_out(&generate(&demo, &["--regex", "[A-Z][a-z]{2,5} [0-9]{3}", "--max-new-tokens", "20"]));
    let text = v["text"].as_str().unwrap();
    let (word, digits) = text.split_once(' ').unwrap_or_else(|| panic!("{v}"));
    assert!(word.len() >= 3 && word.len() <= 6 && word.chars().next().unwrap().is_ascii_uppercase(), "{text}");
    assert!(digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()), "{text}");
}

#[test]
fn a_grammar_the_library_refuses_is_one_line() {
    let demo = root().join("models/demo");
    let bad_lark = scratch("bad.lark", "start: missing_rule\n");
    let bad_schema = scratch("bad.json", "{\"type\": \"frobnicate\"}");
    let not_json = scratch("not.json", "{type: object");
    for (flag, file, needle) in [
        ("--grammar", &bad_lark, "missing_rule"),
        ("--json-schema", &bad_schema, "frobnicate"),
        ("--json-schema", &not_json, "not JSON"),
    ] {
        let o = generate(&demo, &[flag, file.to_str().unwrap()]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.starts_with("error: ") && err.contains(needle), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = generate(&demo, &["--regex", "a", "--json-schema", bad_schema.to_str().unwrap()]);
    assert!(!o.status.success(), "one constraint at a time");
}

/// Issue 29 item 1 on the CLI: `coli generate --json-schema` with a 1,000-link `$ref`
/// chain or a 10,000-property object overflowed the compiling thread's stack (SIGABRT).
/// Each is now one line naming the limit, exit 1 (not a signal), as are a 3,000-rule
/// GBNF chain and a schema nested past the JSON parser's 128 levels.
#[test]
fn schemas_and_grammars_past_the_limits_are_one_line_not_a_crash() {
    use std::os::unix::process::ExitStatusExt;
    let demo = root().join("models/demo");
    let mut defs = serde_json::Map::new();
    for i in 0..1000 {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert("d1000".into(), json!({"type": "string"}));
    let chain = json!({"$defs": defs, "$ref": "#/$defs/d0"}).to_string();
    let props: serde_json::Map<String, Value> =
        (0..10_000).map(|i| (format!("property_{i}"), json!({"type": "string"}))).collect();
    let wide = json!({"type": "object", "properties": props}).to_string();
    let mut nested = json!({"type": "string"});
    for _ in 0..200 {
        nested = json!({"type": "array", "items": nested});
    }
    let mut rules = String::from("root ::= r0\n");
    for i in 0..3000 {
        rules.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
    }
    rules.push_str("r3000 ::= \"y\"\n");
    let files = [
        ("--json-schema", scratch("chain.json", &chain), "deeper than 64 levels"),
        ("--json-schema", scratch("wide.json", &wide), "10000 properties, over the limit of 1000"),
        ("--json-schema", scratch("nested.json", &nested.to_string()), "deeper than 128 levels"),
        ("--grammar", scratch("chain.gbnf", &rules), "deeper than 64 levels"),
    ];
    for (flag, file, needle) in files {
        let o = generate(&demo, &[flag, file.to_str().unwrap(), "--max-new-tokens", "4"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.signal(), None, "{}: killed by a signal: {err}", file.display());
        assert_eq!(o.status.code(), Some(1), "{}: {err}", file.display());
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.starts_with("error: ") && err.contains(needle), "{}: {err}", file.display());
    }
}

#[test]
fn speculation_changes_passes_not_tokens() {
    // qwen3_next: a rejected draft rewinds the recurrent state to the verify pass's start
    // and feeds the accepted tokens again (Session::truncate), the same tokens still.
    let models =
        [root().join("tests/fixtures/qwen3_moe"), root().join("models/demo"), root().join("tests/fixtures/qwen3_next")];
    let prompt = "one two three four one two three four one two three four one two";
    for model in &models {
        for sampling in [["--temperature", "0"], ["--temperature", "1"]] {
            let base = ["--prompt", prompt, "--max-new-tokens", "40", "--ignore-eos", "--seed", "3", "--json"];
            let run = |extra: &[&str]| {
                let o = coli()
                    .args(["generate", "--model"])
                    .arg(model)
                    .args(base)
                    .args(sampling)
                    .args(extra)
                    .output()
                    .unwrap();
                json_out(&o)
            };
            let plain = run(&[]);
            let fast = run(&["--speculate", "5"]);
            assert_eq!(plain["ids"], fast["ids"], "{model:?} {sampling:?}");
            assert_eq!(plain["text"], fast["text"]);
            let s = &fast["speculation"];
            let produced = s["produced"].as_u64().unwrap();
            assert_eq!(produced as usize, fast["ids"].as_array().unwrap().len());
            assert!(s["forwards"].as_u64().unwrap() <= produced, "{s}");
            assert!(s["accepted"].as_u64().unwrap() <= s["drafted"].as_u64().unwrap(), "{s}");
            assert!(plain.get("speculation").is_none());
        }
    }
    // Under a constraint too: each drawn token is masked after the accepted drafts.
    let schema = scratch(
        "spec-schema.json",
        r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "u": {"enum": ["apples", "pears"]}}, "required": ["n", "u"], "additionalProperties": false}"#,
    );
    let run = |extra: &[&str]| {
        let args =
            ["--json-schema", schema.to_str().unwrap(), "--temperature", "1", "--seed", "9", "--max-new-tokens", "40"];
        json_out(&generate(&models[0], &[&args[..], extra].concat()))
    };
    let (plain, fast) = (run(&[]), run(&["--speculate", "4"]));
    assert_eq!(plain["ids"], fast["ids"]);
    assert_eq!(fast["finish_reason"], "stop");
    assert!(fast["speculation"]["drafted"].as_u64().unwrap() > 0, "{fast}");
}
