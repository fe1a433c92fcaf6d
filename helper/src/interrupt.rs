//! Ctrl-C (SIGINT) as a request to stop the generation under way, not to end the process:
//! `coli chat` stops the answer and asks the next question; `coli generate` stops, prints
//! what was generated and exits with 130.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

/// Sets `flag` on every Ctrl-C (SIGINT) from now on, instead of ending the process: the
/// answer being generated (`coli chat`, `coli generate`) stops at its next token or
/// prompt chunk. (At `coli chat`'s terminal prompt rustyline reads Ctrl-C itself, as a key.)
///
/// Returns once the handler is installed. That order matters: rustyline puts its own SIGINT
/// handler in place for each line it reads and puts back the one it found when the line
/// ends. A handler installed while a line is being read (as a listener registered later on
/// another thread could be) would be replaced by the default one at the end of that line,
/// and the next Ctrl-C during an answer would end the process.
pub fn catch_ctrl_c(flag: Arc<AtomicBool>) -> Result<()> {
    let (ready, installed) = std::sync::mpsc::channel::<std::io::Result<()>>();
    std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        rt.block_on(async move {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                // Registers the process's handler now, before `ready` is sent.
                let mut interrupts = match signal(SignalKind::interrupt()) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                while interrupts.recv().await.is_some() {
                    flag.store(true, Ordering::SeqCst);
                }
            }
            #[cfg(not(unix))]
            {
                let _ = ready.send(Ok(()));
                while tokio::signal::ctrl_c().await.is_ok() {
                    flag.store(true, Ordering::SeqCst);
                }
            }
        });
    });
    match installed.recv() {
        Ok(r) => r.context("cannot catch Ctrl-C"),
        Err(_) => bail!("cannot catch Ctrl-C: the signal thread ended"),
    }
}
