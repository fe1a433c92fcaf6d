//! `coli run NAME [CHAT OPTIONS]`: chat with a model, pulling it first when it is not
//! installed, as `ollama run` does. NAME is an installed id, a directory, `demo`, a hub
//! repository `OWNER/NAME[@REV]` or a name from `coli pull --list`. Before anything is
//! downloaded, `coli plan`'s sizes are checked against the memory this process may take
//! (MemAvailable, the cgroup's limit, COLI_MEM_LIMIT): a model whose dense weights do not
//! fit is refused (`--force` pulls it anyway), one whose experts only partly fit in the
//! cache is pulled with a warning that the rest will stream from disk.

use std::path::Path;

use anyhow::{bail, Result};
use clap::{Args, Parser};

use super::catalog;
use super::chat::{self, ChatArgs};
use super::info::human;
use super::plan;
use super::pull::{self, parse_repo, PullArgs};
use crate::paths::{models_dir, resolve_model};

#[derive(Args)]
pub struct RunArgs {
    /// An installed id, a model directory, `demo`, a hub repository OWNER/NAME[@REV], or a
    /// name from `coli pull --list`.
    pub model: String,
    /// Pull even when the check says the model cannot run on this machine.
    #[arg(long)]
    pub force: bool,
    /// Any option of `coli chat` (--system, --temperature, --ram, --max-new-tokens, ...).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "CHAT OPTIONS")]
    pub chat: Vec<String>,
}

/// `coli chat`'s own flags, parsed from what follows NAME.
#[derive(Parser)]
#[command(name = "coli run NAME", no_binary_name = true)]
struct ChatLine {
    #[command(flatten)]
    chat: ChatArgs,
}

pub fn run(a: RunArgs) -> Result<()> {
    let models = models_dir();
    let spec = catalog::resolve(&a.model);
    let model = match resolve_model(Path::new(spec), models.as_deref()) {
        Ok(_) => spec.to_string(),
        Err(e) => {
            if parse_repo(spec).is_err() {
                bail!("{e:#} (nor a hub repository OWNER/NAME; coli pull --list shows known models)");
            }
            check_fit(spec, a.force)?;
            eprintln!("{} is not installed: pulling it", a.model);
            let (repo, _) = parse_repo(spec)?;
            let repo = repo.to_string();
            pull::pull(PullArgs {
                repo: Some(spec.to_string()),
                list: false,
                quant: None,
                group_size: None,
                force: false,
                gguf: None,
            })?;
            repo
        }
    };
    let mut line = vec!["--model".to_string(), model];
    line.extend(a.chat);
    let parsed = ChatLine::try_parse_from(line).unwrap_or_else(|e| e.exit());
    chat::chat(parsed.chat)
}

/// Refuses (unless `force`) a model whose dense weights cannot be held here; warns when
/// its experts only partly fit in the cache.
fn check_fit(spec: &str, force: bool) -> Result<()> {
    let fit = plan::fit(spec, None)?;
    let sizes = format!("{} of dense weights, {} of experts", human(fit.resident), human(fit.streamed));
    if !fit.runs() {
        let free = fit.available.map_or("unknown".to_string(), human);
        let msg = format!("{spec} cannot run here: {sizes}, but only {free} of memory is free ({})", fit.limit);
        if !force {
            bail!("{msg}; coli plan {spec} says more, --force pulls it anyway");
        }
        eprintln!("warning: {msg}; pulling it anyway (--force)");
    } else if fit.cached < fit.streamed {
        eprintln!(
            "note: {spec}: {sizes}; the expert cache here holds {} of them, the rest is read from disk per token (coli plan {spec} estimates the speed)",
            human(fit.cached)
        );
    }
    Ok(())
}
