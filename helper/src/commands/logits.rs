//! `coli logits`: teacher-forced logits for every position, as raw little-endian f32
//! [n_ids, vocab].

use anyhow::{Context, Result};
use clap::Args;
use colibri_engine::Logits;

use crate::backend::forward_fn;
use crate::flags::{parse_ids, ModelArgs};
use crate::load::open;

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids, e.g. 5,17,3.
    #[arg(long)]
    pub ids: String,
    /// Output file: raw little-endian f32, row-major [n_ids, vocab].
    #[arg(long)]
    pub out: std::path::PathBuf,
}

pub fn logits(a: LogitsArgs) -> Result<()> {
    crate::flags::init_threads(a.model.threads)?;
    crate::flags::on_pool(|| logits_inner(a))
}

fn logits_inner(a: LogitsArgs) -> Result<()> {
    let ids = parse_ids(&a.ids)?;
    let loaded = open(&a.model, false)?;
    let mut forward = forward_fn(&loaded.model, a.model.compute())?;
    let logits = forward(&ids, Logits::All)?;
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&a.out, bytes).with_context(|| format!("{}: cannot write", a.out.display()))?;
    drop(forward);
    crate::load::save_usage(&loaded);
    Ok(())
}
