//! POST /api/usage bodies and usage files: out-of-bounds triples are errors, counts saturate.
#![no_main]
use colibri_engine::experts::usage::{ExpertUsage, UsageReport};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<UsageReport>(data) {
        let mut u = ExpertUsage::new(4, 8);
        if u.merge_triples(&r.counts).is_ok() {
            let _ = u.hottest(4);
        } else {
            assert_eq!(u.total(), 0, "a bad report changes nothing");
        }
    }
    if let Ok(u) = ExpertUsage::from_json_bytes(data, 4, 8, None) {
        assert_eq!((u.n_layers(), u.n_experts()), (4, 8));
    }
});
