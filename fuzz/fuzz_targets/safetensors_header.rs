//! A safetensors file: its header and every tensor's view stay inside the bytes.
#![no_main]
use colibri_engine::format::tensors::TensorStore;
use colibri_engine::tensor::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut s = TensorStore::default();
    if s.add_file("fuzz.safetensors", Bytes::from_vec(data.to_vec())).is_ok() {
        let names: Vec<String> = s.names().cloned().collect();
        for n in names {
            let t = s.get(&n).unwrap();
            assert!(t.bytes.len() <= data.len());
            if let [r, c] = t.shape[..] {
                if let Ok(m) = s.mat(&n, r, c) {
                    if r > 0 && c <= 1 << 16 {
                        let mut row = vec![0.0f32; c];
                        m.row_into(0, &mut row);
                    }
                }
            }
        }
    }
});
