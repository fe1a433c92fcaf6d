//! colibri.json: a manifest that parses has every range inside its data file, and its
//! dense region can be checked against zero bytes without a panic.
#![no_main]
use colibri_engine::format::dense_store;
use colibri_engine::model::open::Container;
use colibri_engine::tensor::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Inputs rarely carry a matching manifest_xxh3: the unsealed parse reaches validation.
    let _ = colibri_engine::format::manifest::Manifest::parse_unsealed(data);
    if let Ok(c) = Container::parse(data, "fuzz") {
        let m = &c.manifest;
        let _ = m.byte_totals();
        if m.dense.length <= 1 << 20 {
            let _ = dense_store(m, &Bytes::from_vec(vec![0; m.dense.length as usize]), "fuzz");
        }
    }
});
