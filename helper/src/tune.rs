//! `tune.json`: the settings `coli tune` measured best for one installed model on this
//! machine (expert reader threads, O_DIRECT), written next to the model's colibri.json and
//! used by every later run of that model where the command line does not choose
//! (load::open_dir through [`crate::load::CacheFlags::tuned`]; `coli plan` and
//! `coli doctor` show it).

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The file's name in the model directory.
pub const TUNE_FILE: &str = "tune.json";

/// One measurement of cold expert reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReadProbe {
    pub direct: bool,
    pub readers: usize,
    pub bytes_per_second: f64,
}

/// What `coli tune` found and chose.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tune {
    /// The expert reader threads later runs use.
    pub readers: usize,
    /// Whether later runs read experts with O_DIRECT (where no flag says otherwise; a
    /// memory cgroup that needs it still turns it on).
    pub direct: bool,
    /// Whether later runs use the router lookahead (where no flag says): on only where
    /// the teacher-forced decode with it was more than 5% faster than without.
    #[serde(default)]
    pub lookahead: bool,
    /// The best cold read bandwidth of experts (bytes/s): `coli plan`'s disk speed.
    pub read_bytes_per_second: f64,
    /// Every combination measured.
    pub probes: Vec<ReadProbe>,
    /// The CPU kernels' weight bytes per second in a decode step (probe::matvec_bandwidth):
    /// `coli plan`'s compute speed.
    #[serde(default)]
    pub kernel_bytes_per_second: f64,
    /// When (Unix seconds), on what CPU, under what memory limit.
    pub measured_at: u64,
    pub cpu: String,
    pub memory_limit: serde_json::Value,
    /// Decode tokens/s of the short teacher-forced run with the defaults and with these
    /// settings (None where it did not run).
    pub decode_before: Option<f64>,
    pub decode_after: Option<f64>,
    /// Decode tokens/s with the chosen reads, without and with the router lookahead.
    #[serde(default)]
    pub decode_lookahead_off: Option<f64>,
    #[serde(default)]
    pub decode_lookahead_on: Option<f64>,
}

impl Tune {
    /// The model's tune.json, if `coli tune` wrote one (a damaged file is ignored with a
    /// warning: the defaults are always safe).
    pub fn load(dir: &Path) -> Option<Tune> {
        let path = dir.join(TUNE_FILE);
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<Tune>(&bytes) {
            Ok(t) if t.readers <= crate::flags::MAX_READERS => Some(t),
            Ok(t) => {
                eprintln!("warning: {}: {} readers is out of range; ignored", path.display(), t.readers);
                None
            }
            Err(e) => {
                eprintln!("warning: {}: {e}; ignored (run `coli tune` again)", path.display());
                None
            }
        }
    }

    /// Writes it into `dir` (atomically: a half-written file is never read).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(TUNE_FILE);
        let tmp = dir.join(format!("{TUNE_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }
}
