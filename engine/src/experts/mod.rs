//! The expert supply: where a routed expert's bytes come from (the byte-source trait,
//! files, memory), the native reader pool, the in-memory tiers (pinned, LRU) and the
//! usage counts that choose the pins.

pub mod cache;
pub mod ram_tiers;
#[cfg(not(target_arch = "wasm32"))]
pub mod reader;
pub mod source;
pub mod usage;
