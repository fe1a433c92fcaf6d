//! A GGUF file: the header parser keeps every count, string, array and tensor range
//! inside the bytes (no panic, no allocation beyond a small multiple of the input), and
//! what it accepts maps, tokenizes and converts without panicking.
#![no_main]
use colibri_engine::format::gguf::Gguf;
use colibri_engine::format::gguf_import::{import, tensor};
use colibri_engine::tensor::{Bytes, DType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::parse(data, "fuzz.gguf") else { return };
    for t in &g.tensors {
        assert!(t.offset + t.size <= data.len() as u64);
    }
    let Ok(im) = import(&g) else { return };
    let file = [Bytes::from_vec(data.to_vec())];
    for p in im.tensors.iter().take(64) {
        if p.shape.iter().product::<usize>() <= 1 << 16 {
            let _ = tensor(&g, &file, p, None);
            let _ = tensor(&g, &file, p, Some(DType::Int4 { group: 32 }));
        }
    }
});
