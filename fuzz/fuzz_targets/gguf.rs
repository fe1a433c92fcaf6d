//! A GGUF file: the header parser keeps every count, string, array and tensor range
//! inside the bytes (no panic, no allocation beyond a small multiple of the input), and
//! what it accepts maps, tokenizes and converts without panicking; its header parses the
//! same from a prefix of the file.
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
    // Read from a prefix (as `coli convert` reads a GGUF, without mapping it), the header
    // is the whole file's, or more of the file is asked for; never an error of its own.
    let cut = data.get(..data.len() / 2).unwrap_or_default();
    match Gguf::parse_prefix(cut, data.len() as u64, "fuzz.gguf") {
        Ok(Some(h)) => assert!(h.tensors == g.tensors && h.metadata == g.metadata && h.data_start == g.data_start),
        Ok(None) => {}
        Err(e) => panic!("a prefix of a valid file refused: {e}"),
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
