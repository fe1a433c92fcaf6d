//! `coli serve` and `coli web`: start the HTTP server (crate::serve) on a runtime, print
//! where it listens, open the browser for `web`, and run until Ctrl-C / SIGTERM.

use std::net::SocketAddr;

use anyhow::{Context, Result};

use crate::flags::init_threads;
use crate::serve::{bind, init_logging, run, shutdown_signal, ServeArgs};

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn url_of(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() || addr.ip().is_loopback() {
        format!("http://127.0.0.1:{}", addr.port())
    } else {
        format!("http://{addr}")
    }
}

/// `coli serve` (`open_browser = false`) and `coli web` (true).
pub fn serve(a: ServeArgs, open_browser: bool) -> Result<()> {
    init_logging();
    init_threads(a.threads)?;
    let rt = runtime()?;
    rt.block_on(async {
        let bound = bind(&a).await?;
        // `/api/pull` pulls as `coli pull` does (the server may not import the commands).
        let _ = bound.state.puller.set(std::sync::Arc::new(|repo, gguf, models, progress| {
            crate::commands::pull::pull_for_api(repo, gguf, models, progress)
        }));
        let url = url_of(bound.addr);
        let n = bound.state.registry.list().len();
        // Written without println!: a reader that closed the pipe after the first line
        // (`coli serve | head -1`, a supervisor) must not stop the server.
        say(&format!("colibri is listening on {url}"));
        say(&format!("  {n} model(s); API: {url}/v1 (OpenAI), {url}/api (Ollama); Ctrl-C stops"));
        if open_browser {
            open_url(&url);
        }
        run(bound, shutdown_signal()).await
    })
}

fn open_url(url: &str) {
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    match std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(_) => say(&format!("opening {url} in your browser")),
        Err(_) => say(&format!("open {url} in your browser")),
    }
}

/// One line on stdout, flushed; a closed stdout is not an error for a server.
fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}
