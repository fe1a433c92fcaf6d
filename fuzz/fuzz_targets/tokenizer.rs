//! tokenizer.json and tokenizer_config.json: the input is split at the first NUL into
//! the two files; a tokenizer that loads encodes and decodes without a panic.
#![no_main]
use colibri_engine::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (tok, cfg) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    if let Ok(t) = Tokenizer::from_bytes(tok, cfg) {
        if let Ok(ids) = t.encode("Hello, world! 日本", true) {
            let _ = t.decode(&ids, false);
        }
        let _ = t.decode(&[0, 1, 2, u32::MAX], true);
    }
});
