//! A chat template from tokenizer_config.json: rendering ends (fuel) with text or an error.
#![no_main]
use colibri_engine::tokenizer::{ChatMessage, Tokenizer};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn base() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let json = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/olmoe/tokenizer.json"))
            .expect("the olmoe fixture's tokenizer.json");
        Tokenizer::from_bytes(&json, None).expect("the fixture loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let mut t = base().clone();
    t.set_chat_template(src);
    let msgs = [ChatMessage::new("system", "s"), ChatMessage::new("user", "hi"), ChatMessage::new("assistant", "ok")];
    let _ = t.apply_chat_template(&msgs, true);
});
