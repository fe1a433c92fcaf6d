//! config.json: any bytes give a config within the engine's limits or an error.
#![no_main]
use colibri_engine::model::config::{limits, ModelConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ModelConfig::from_json_bytes(data) {
        assert!(c.n_layers >= 1 && c.n_layers <= limits::MAX_LAYERS);
        assert!(c.hidden <= limits::MAX_HIDDEN && c.vocab <= limits::MAX_VOCAB);
        assert!(c.router.top_k >= 1 && c.router.top_k <= c.router.n_experts);
        assert_eq!(c.moe_layers.len(), c.n_layers);
        assert_eq!(c.sliding_window.len(), c.n_layers);
        let _ = c.check_input(&[0, 1, 2], 0);
    }
});
