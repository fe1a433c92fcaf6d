//! Unit tests of the tokenizer wrapper, the chat template and the streaming decoder.
//! Expected template outputs were rendered with transformers 5.24 / Jinja2 3.1.6.

use super::*;
use serde_json::json;

/// GPT-2's byte -> printable char table, in GPT-2's id order.
fn byte_chars() -> Vec<(u8, char)> {
    let mut bs: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.iter().zip(&cs).map(|(&b, &c)| (b as u8, char::from_u32(c).unwrap())).collect()
}

/// A byte-level BPE whose base tokens are single bytes (ids 0..256), merges "he" (256)
/// and "ll" (257), added tokens 258.. and a post-processor that prepends "<s>".
fn tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for (id, (_, c)) in byte_chars().iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    vocab.insert("he".into(), json!(256));
    vocab.insert("ll".into(), json!(257));
    let added = ["<s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool>"];
    let added: Vec<_> = added
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": 258 + i, "content": t, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": *t != "<tool>"})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": byte_level, "decoder": byte_level,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [258], "tokens": ["<s>"]}}},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": [["h", "e"], ["l", "l"]]}
    })
    .to_string()
}

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

fn tok_with(config: serde_json::Value) -> Tokenizer {
    Tokenizer::from_bytes(tokenizer_json().as_bytes(), Some(config.to_string().as_bytes())).unwrap()
}

fn chatml() -> Tokenizer {
    tok_with(json!({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": null}))
}

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

fn render(template: &str, config: serde_json::Value, m: &[(&str, &str)], gen: bool) -> Result<String> {
    let mut config = config;
    config["chat_template"] = json!(template);
    tok_with(config).apply_chat_template(&msgs(m), gen)
}

#[test]
fn encode_decode_roundtrip() {
    let t = chatml();
    assert_eq!(t.vocab_size(), 263);
    let text = "Hello, world! héllo 日本語 🦀\n\tend";
    let ids = t.encode(text, false).unwrap();
    assert!(ids.contains(&257), "merge ll used: {ids:?}");
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    assert_eq!(t.decode(&ids, true).unwrap(), text);
    assert_eq!(t.encode("hello", false).unwrap(), vec![256, 257, t.token_to_id("o").unwrap()]);
    // Unknown ids are skipped, not a panic.
    assert_eq!(t.decode(&[256, 99_999], false).unwrap(), "he");
    assert_eq!(t.id_to_token(256).as_deref(), Some("he"));
}

#[test]
fn special_tokens() {
    let t = chatml();
    assert_eq!(t.token_to_id("<|im_end|>"), Some(260));
    assert_eq!(t.token_to_id("<nope>"), None);
    let with_bos = t.encode("hi", true).unwrap();
    assert_eq!(with_bos[0], 258);
    assert_eq!(&with_bos[1..], &t.encode("hi", false).unwrap()[..]);
    assert_eq!(t.decode(&with_bos, false).unwrap(), "<s>hi");
    assert_eq!(t.decode(&with_bos, true).unwrap(), "hi");
    let ids = t.encode("<|im_start|>user\nhi<tool><|im_end|>", false).unwrap();
    assert_eq!(ids[0], 259);
    assert_eq!(ids[ids.len() - 2..], [262, 260]);
    // Special tokens are skipped, a non-special added token stays.
    assert_eq!(t.decode(&ids, true).unwrap(), "user\nhi<tool>");
}

#[test]
fn decode_stream_holds_partial_characters() {
    let t = chatml();
    let text = "aé日🦀b";
    let ids = t.encode(text, false).unwrap();
    assert_eq!(ids.len(), text.len(), "one token per byte");
    let mut s = DecodeStream::new(false);
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(s.push(&t, id).unwrap());
    }
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(pieces.concat(), text);
    assert_eq!(pieces[1], "", "first byte of é is held");
    assert_eq!(pieces[2], "é");
    assert_eq!(s.finish(&t).unwrap(), "");
    assert_eq!(s.ids(), &ids[..]);

    // A character cut off at the end comes out as U+FFFD from finish().
    let mut s = DecodeStream::default();
    assert_eq!(s.push(&t, ids[0]).unwrap(), "a");
    assert_eq!(s.push(&t, ids[1]).unwrap(), "");
    assert_eq!(s.finish(&t).unwrap(), "\u{FFFD}");

    // Special tokens: skipped by default, printed with new(false).
    let mut s = DecodeStream::default();
    let out: String = [256, 260, 257].iter().map(|&id| s.push(&t, id).unwrap()).collect();
    assert_eq!(out, "hell");
    let mut s = DecodeStream::new(false);
    let out: String = [256, 260].iter().map(|&id| s.push(&t, id).unwrap()).collect();
    assert_eq!(out, "he<|im_end|>");

    // Context ids are decoded but not returned.
    let prompt = t.encode("<|im_start|>assistant\n", false).unwrap();
    let mut s = DecodeStream::with_context(true, &prompt);
    let out: String = t.encode("Oui 🙂", false).unwrap().iter().map(|&id| s.push(&t, id).unwrap()).collect();
    assert_eq!(out + &s.finish(&t).unwrap(), "Oui 🙂");
}

#[test]
fn chatml_renders_exactly() {
    let t = chatml();
    assert!(t.has_chat_template());
    let m = msgs(&[("system", "You are a helpful assistant."), ("user", "Salut ! ça va ?")]);
    let want =
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nSalut ! ça va ?<|im_end|>\n";
    assert_eq!(t.apply_chat_template(&m, false).unwrap(), want);
    assert_eq!(t.apply_chat_template(&m, true).unwrap(), format!("{want}<|im_start|>assistant\n"));
    let ids = t.encode_chat(&m, true).unwrap();
    assert_eq!(ids[0], 259);
    assert_eq!(ids.iter().filter(|&&i| i == 260).count(), 2);
}

const MIXTRAL: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'].strip() + eos_token }}{% endif %}{% endfor %}";

#[test]
fn python_string_methods_and_raise_exception() {
    let cfg = json!({"bos_token": {"content": "<s>", "special": true}, "eos_token": "</s>"});
    let m = [("user", "  Hi there \n"), ("assistant", " Hello! "), ("user", "Bye")];
    assert_eq!(
        render(MIXTRAL, cfg.clone(), &m, true).unwrap(),
        "<s>[INST] Hi there [/INST]Hello!</s>[INST] Bye [/INST]"
    );
    match render(MIXTRAL, cfg, &[("user", "a"), ("user", "b")], true) {
        Err(Error::Template(msg)) => {
            assert_eq!(msg, "Conversation roles must alternate user/assistant/user/assistant/...")
        }
        other => panic!("{other:?}"),
    }
}

const QWEN3_LIKE: &str = "{%- set ns = namespace(last_user=-1) %}\n{%- for message in messages %}\n    {%- if message.role == 'user' %}\n        {%- set ns.last_user = loop.index0 %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if message.role == 'assistant' and '</think>' in message.content %}\n        {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n        {%- set reasoning = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}\n    {%- else %}\n{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}\nlast={{ ns.last_user }} first={{ messages[0].content.startswith('You') }} rev={{ (messages|map(attribute='role')|list)[::-1]|join(',') }}\n";

#[test]
fn qwen3_style_template_matches_jinja2() {
    let m = [
        ("system", "You are Qwen."),
        ("user", "2+2?"),
        ("assistant", "<think>\nadd\n</think>\n\n4"),
        ("user", "thanks"),
    ];
    let want = "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\nlast=3 first=True rev=user,assistant,user,system";
    assert_eq!(render(QWEN3_LIKE, json!({}), &m, true).unwrap(), want);
}

#[test]
fn whitespace_control_and_python_printing() {
    let tpl = "{% for m in messages %}\n  {% if m.role == 'user' %}\n    U: {{ m.content }}\n  {% endif %}\n{% endfor %}\n{{ add_generation_prompt }} {{ none }} {{ x is defined }}\n";
    let got = render(tpl, json!({}), &[("user", "a"), ("system", "b")], false).unwrap();
    assert_eq!(got, "    U: a\nFalse None False");
}

#[test]
fn tojson_matches_transformers() {
    let tpl = r#"{% set d = {"name": "x<y & 'z'", "b": [1, 2.5, 1e20, 1e-5, 0.1, 100.0, -3, true, none], "é": "naïve 🦀 \"q\" \\ \n\t\x01", "a": {}} %}{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(ensure_ascii=True) }}|{{ d | tojson(sort_keys=True, separators=(',', ':')) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ messages | tojson }}"#;
    // minijinja has no \x escapes; put the control character in directly.
    let tpl = tpl.replace("\\x01", "\u{1}");
    let want = concat!(
        r#"{"name": "x<y & 'z'", "b": [1, 2.5, 1e+20, 1e-05, 0.1, 100.0, -3, true, null], "é": "naïve 🦀 \"q\" \\ \n\t\u0001", "a": {}}|"#,
        "{\n  \"name\": \"x<y & 'z'\",\n  \"b\": [\n    1,\n    2.5,\n    1e+20,\n    1e-05,\n    0.1,\n    100.0,\n    -3,\n    true,\n    null\n  ],\n  \"é\": \"naïve 🦀 \\\"q\\\" \\\\ \\n\\t\\u0001\",\n  \"a\": {}\n}|",
        r#"{"name": "x<y & 'z'", "b": [1, 2.5, 1e+20, 1e-05, 0.1, 100.0, -3, true, null], "\u00e9": "na\u00efve \ud83e\udd80 \"q\" \\ \n\t\u0001", "a": {}}|"#,
        r#"{"a":{},"b":[1,2.5,1e+20,1e-05,0.1,100.0,-3,true,null],"name":"x<y & 'z'","é":"naïve 🦀 \"q\" \\ \n\t\u0001"}|[]|{}|"#,
        r#"[{"role": "user", "content": "hi"}]"#
    );
    assert_eq!(render(&tpl, json!({}), &[("user", "hi")], false).unwrap(), want);
}

#[test]
fn strftime_now_and_special_token_context() {
    let tpl =
        "{{ strftime_now('%Y') | length }} {{ bos_token }} {{ pad_token }} {{ additional_special_tokens | join(',') }}";
    let cfg = json!({"bos_token": "<s>", "pad_token": {"content": "<|endoftext|>"}, "add_bos_token": true,
        "additional_special_tokens": ["<tool>", {"content": "<|im_start|>"}]});
    assert_eq!(render(tpl, cfg, &[], false).unwrap(), "4 <s> <|endoftext|> <tool>,<|im_start|>");
}

#[test]
fn eos_from_string_and_object_forms() {
    assert_eq!(tok_with(json!({"eos_token": "<|im_end|>"})).eos_token_ids(), vec![260]);
    let mut t = tok_with(json!({"eos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": true}}));
    assert_eq!(t.eos_token_ids(), vec![261]);
    assert_eq!(t.special_token("eos_token"), Some("<|endoftext|>"));
    t.add_eos_ids(&[260, 261, 260]);
    assert_eq!(t.eos_token_ids(), vec![261, 260]);
    // Not configured: <|im_end|> / <|endoftext|> are not guessed.
    assert!(tok_with(json!({})).eos_token_ids().is_empty());
    assert!(tok_with(json!({"eos_token": "<unknown>"})).eos_token_ids().is_empty());
    let t = Tokenizer::from_bytes(tokenizer_json().as_bytes(), None).unwrap();
    assert!(t.eos_token_ids().is_empty());
    assert!(!t.has_chat_template());
}

#[test]
fn chat_template_forms_and_errors() {
    let list = json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]});
    assert_eq!(tok_with(list).apply_chat_template(&msgs(&[("user", "x")]), false).unwrap(), "D1");
    let no_default = tok_with(json!({"chat_template": [{"name": "tool_use", "template": "T"}]}));
    assert!(!no_default.has_chat_template());
    assert!(matches!(no_default.apply_chat_template(&[], false), Err(Error::Template(m)) if m.contains("default")));
    let none = tok_with(json!({}));
    assert!(!none.has_chat_template());
    assert!(matches!(none.apply_chat_template(&[], true), Err(Error::Template(m)) if m.contains("no chat_template")));
    let broken = tok_with(json!({"chat_template": "{% for m in messages %}"}));
    assert!(broken.has_chat_template());
    assert!(matches!(broken.apply_chat_template(&[], true), Err(Error::Template(m)) if m.contains("cannot compile")));
    let bad_call = render("{{ messages[0].content.nosuchmethod() }}", json!({}), &[("user", "x")], false);
    assert!(matches!(bad_call, Err(Error::Template(_))), "{bad_call:?}");
    let mut t = tok_with(json!({}));
    t.set_chat_template("{{ bos_token }}!");
    assert_eq!(t.apply_chat_template(&[], false).unwrap(), "!");
}

#[test]
fn corrupt_inputs_are_errors_not_panics() {
    for bad in [&b""[..], b"{", b"\xff\xfe", b"{\"model\": 5}", b"[]", b"null"] {
        assert!(matches!(Tokenizer::from_bytes(bad, None), Err(Error::Tokenizer(_))), "{bad:?}");
    }
    let tj = tokenizer_json();
    assert!(matches!(Tokenizer::from_bytes(tj.as_bytes(), Some(b"{oops")), Err(Error::Json { .. })));
    assert!(matches!(Tokenizer::from_bytes(tj.as_bytes(), Some(b"[1]")), Err(Error::Tokenizer(_))));
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn from_dir_reads_files_and_names_paths() {
    let dir = std::env::temp_dir().join(format!("colibri-tok-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tok_path = dir.join("tokenizer.json");
    match Tokenizer::from_dir(&dir) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("tokenizer.json"), "{e}"),
        other => panic!("{other:?}"),
    }
    std::fs::write(&tok_path, "{\"not\": \"a tokenizer\"}").unwrap();
    match Tokenizer::from_dir(&dir) {
        Err(Error::Tokenizer(m)) => assert!(m.contains(&tok_path.display().to_string()), "{m}"),
        other => panic!("{other:?}"),
    }
    std::fs::write(&tok_path, tokenizer_json()).unwrap();
    let t = Tokenizer::from_dir(&dir).unwrap();
    assert!(!t.has_chat_template());
    let cfg = json!({"chat_template": "config", "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let t = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(t.apply_chat_template(&[], false).unwrap(), "config");
    assert_eq!(t.eos_token_ids(), vec![260]);
    std::fs::write(dir.join("chat_template.jinja"), "jinja file\n").unwrap();
    let t = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(t.apply_chat_template(&[], false).unwrap(), "jinja file");
    std::fs::write(dir.join("tokenizer_config.json"), "{oops").unwrap();
    match Tokenizer::from_dir(&dir) {
        Err(e @ Error::Json { .. }) => assert!(e.to_string().contains("tokenizer_config.json"), "{e}"),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shareable_across_threads() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<Tokenizer>();
    send_sync::<DecodeStream>();
    send_sync::<crate::sampler::Sampler>();
}

#[test]
fn runaway_templates_stop_with_an_error() {
    let started = std::time::Instant::now();
    // Nested loops: 10^10 iterations without fuel.
    let forever = "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i %}{% endfor %}{% endfor %}";
    let e = render(forever, json!({}), &[("user", "a")], false).unwrap_err().to_string();
    assert!(e.contains("fuel"), "{e}");
    // Recursion without end.
    let deep = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    assert!(render(deep, json!({}), &[("user", "a")], false).is_err());
    // Output that grows without bound: 100 MB strings, over and over.
    let big = "{% for i in range(1000) %}{{ 'x' * 100000000 }}{% endfor %}";
    let e = render(big, json!({}), &[("user", "a")], false).unwrap_err().to_string();
    assert!(e.contains("longer than"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "{:?}", started.elapsed());
    // A template source over the limit is refused when set, and reported when used.
    let mut t = Tokenizer::from_bytes(tokenizer_json().as_bytes(), None).unwrap();
    t.set_chat_template(&"x".repeat(MAX_TEMPLATE_BYTES + 1));
    let e = t.apply_chat_template(&[ChatMessage::new("user", "a")], true).unwrap_err().to_string();
    assert!(e.contains("at most"), "{e}");
}

/// Fuzzing found that a syntax error inside tokenizer.json's "decoder" object made the
/// tokenizers crate panic (fuzz/artifacts/tokenizer/crash-6326af87...); it is an error now.
#[test]
fn a_syntax_error_in_the_decoder_is_an_error_not_a_panic() {
    let good = tokenizer_json();
    assert!(good.contains("\"decoder\":{"));
    for bad in [
        good.replacen("\"decoder\":{", "\"decoder\":{\"t\u{1}\":1,", 1),
        good.replacen("\"decoder\":{", "\"decoder\":{\"type\": ", 1),
        good[..good.find("\"decoder\":{").unwrap() + 14].to_string(),
        // A lone surrogate escape (fuzz/artifacts/tokenizer/crash-cce3747a...).
        good.replacen("\"decoder\":{", "\"decoder\":{\"t\\udc00\":1,", 1),
    ] {
        let Err(e) = Tokenizer::from_bytes(bad.as_bytes(), None) else { panic!("accepted: {bad}") };
        assert!(e.to_string().contains("not a valid tokenizer.json"), "{e}");
    }
}
