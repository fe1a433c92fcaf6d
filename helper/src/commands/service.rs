//! `coli service install|uninstall|status`: run the helper in the background at login.
//!
//! Linux: a systemd user unit, `~/.config/systemd/user/colibri.service`, running
//! `coli serve ARGS` with Restart=on-failure; logs go to the journal
//! (`journalctl --user -u colibri`). macOS: a launchd agent,
//! `~/Library/LaunchAgents/dev.colibri.helper.plist`, logging to `~/Library/Logs/colibri/`.
//! The unit texts are pure functions of (program, arguments), tested below.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use crate::serve::ServeArgs;

pub const SYSTEMD_UNIT: &str = "colibri.service";
pub const LAUNCHD_LABEL: &str = "dev.colibri.helper";

#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub action: Action,
}

// Install carries the serve options; the enum is parsed once per process.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Action {
    /// Write the unit and start it now and at every login.
    Install {
        #[command(flatten)]
        serve: ServeArgs,
        /// Print the unit instead of installing it.
        #[arg(long)]
        dry_run: bool,
    },
    /// Stop the service and remove the unit.
    Uninstall,
    /// Whether the service is installed and running.
    Status,
}

/// The `coli serve` arguments that reproduce `a` (only what differs from the defaults).
pub fn serve_arguments(a: &ServeArgs) -> Vec<String> {
    let mut v = vec!["serve".to_string()];
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string();
    if let Some(h) = &a.host {
        v.extend(["--host".into(), h.clone()]);
    }
    if a.port != 7878 {
        v.extend(["--port".into(), a.port.to_string()]);
    }
    for m in &a.models {
        // A relative path would be read from the service's working directory: make it
        // absolute; a bare id (no such path here) stays an id.
        let s = if m.exists() { abs(m) } else { m.display().to_string() };
        v.extend(["--model".into(), s]);
    }
    if let Some(d) = &a.models_dir {
        v.extend(["--models-dir".into(), abs(d)]);
    }
    for o in &a.allow_origins {
        v.extend(["--allow-origin".into(), o.clone()]);
    }
    for h in &a.allow_hosts {
        v.extend(["--allow-host".into(), h.clone()]);
    }
    if a.max_queue != crate::serve::DEFAULT_MAX_QUEUE {
        v.extend(["--max-queue".into(), a.max_queue.to_string()]);
    }
    if let Some(p) = a.parallel {
        v.extend(["--parallel".into(), p.to_string()]);
    }
    if let Some(t) = a.threads {
        v.extend(["--threads".into(), t.to_string()]);
    }
    if let Some(r) = a.ram {
        v.extend(["--ram".into(), r.to_string()]);
    }
    if a.speculate > 0 {
        v.extend(["--speculate".into(), a.speculate.to_string()]);
    }
    if let Some(d) = &a.draft {
        let s = if d.exists() { abs(d) } else { d.display().to_string() };
        v.extend(["--draft".into(), s]);
    }
    v
}

/// One word of a systemd command line: quoted when needed, with `%` and `$` escaped
/// (systemd.service(5) "Command lines", systemd.unit(5) "Specifiers").
fn systemd_word(s: &str) -> String {
    let escaped = s.replace('%', "%%").replace('$', "$$");
    let plain = !escaped.is_empty() && escaped.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-:=+,@".contains(&b));
    if plain {
        return escaped;
    }
    let mut out = String::from("\"");
    for c in escaped.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The systemd user unit that runs `program args`.
pub fn systemd_unit(program: &Path, args: &[String]) -> String {
    let cmd: Vec<String> =
        std::iter::once(program.display().to_string()).chain(args.iter().cloned()).map(|w| systemd_word(&w)).collect();
    format!(
        "# Written by `coli service install`; remove with `coli service uninstall`.\n\
         [Unit]\n\
         Description=colibri helper (model files, web app and OpenAI API on localhost)\n\
         After=network.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={}\n\
         Restart=on-failure\n\
         RestartSec=2\n\
         Environment=RUST_LOG=info\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        cmd.join(" ")
    )
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
}

/// The launchd agent that runs `program args`, logging under `log_dir`.
pub fn launchd_plist(program: &Path, args: &[String], log_dir: &Path) -> String {
    let words: String = std::iter::once(program.display().to_string())
        .chain(args.iter().cloned())
        .map(|w| format!("        <string>{}</string>\n", xml(&w)))
        .collect();
    let log = |name: &str| xml(&log_dir.join(name).display().to_string());
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n\
         <dict>\n\
         \x20   <key>Label</key>\n\
         \x20   <string>{LAUNCHD_LABEL}</string>\n\
         \x20   <key>ProgramArguments</key>\n\
         \x20   <array>\n\
         {words}\
         \x20   </array>\n\
         \x20   <key>RunAtLoad</key>\n\
         \x20   <true/>\n\
         \x20   <key>KeepAlive</key>\n\
         \x20   <dict>\n\
         \x20       <key>SuccessfulExit</key>\n\
         \x20       <false/>\n\
         \x20   </dict>\n\
         \x20   <key>StandardOutPath</key>\n\
         \x20   <string>{}</string>\n\
         \x20   <key>StandardErrorPath</key>\n\
         \x20   <string>{}</string>\n\
         </dict>\n\
         </plist>\n",
        log("helper.log"),
        log("helper.err.log"),
    )
}

fn home() -> Result<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).context("HOME is not set")
}

/// Where the unit file goes on this system.
fn unit_path() -> Result<PathBuf> {
    if cfg!(target_os = "macos") {
        Ok(home()?.join("Library/LaunchAgents").join(format!("{LAUNCHD_LABEL}.plist")))
    } else {
        Ok(crate::paths::config_home().context("HOME is not set")?.join("systemd/user").join(SYSTEMD_UNIT))
    }
}

fn unit_text(a: &ServeArgs) -> Result<String> {
    let exe = std::env::current_exe().context("cannot find the coli executable")?;
    let args = serve_arguments(a);
    if cfg!(target_os = "macos") {
        Ok(launchd_plist(&exe, &args, &home()?.join("Library/Logs/colibri")))
    } else {
        Ok(systemd_unit(&exe, &args))
    }
}

/// Runs a service-manager command, printing it; Ok(false) if the program is missing.
fn run_cmd(program: &str, args: &[&str]) -> Result<bool> {
    println!("$ {program} {}", args.join(" "));
    match Command::new(program).args(args).status() {
        Ok(s) if s.success() => Ok(true),
        Ok(s) => bail!("`{program} {}` failed ({s})", args.join(" ")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot run {program}")),
    }
}

#[cfg(unix)]
fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

#[cfg(not(unix))]
fn uid() -> u32 {
    0
}

pub fn run(a: ServiceArgs) -> Result<()> {
    let macos = cfg!(target_os = "macos");
    match a.action {
        Action::Install { serve, dry_run } => {
            if let Some(h) = &serve.host {
                if !crate::serve::security::is_loopback_host(h) {
                    eprintln!("warning: the service will listen on {h}, reachable from the network");
                }
            }
            let text = unit_text(&serve)?;
            let path = unit_path()?;
            if dry_run {
                println!("# {}", path.display());
                print!("{text}");
                return Ok(());
            }
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
            }
            if macos {
                std::fs::create_dir_all(home()?.join("Library/Logs/colibri"))?;
            }
            std::fs::write(&path, &text).with_context(|| format!("{}: cannot write", path.display()))?;
            println!("wrote {}", path.display());
            let started = if macos {
                let target = format!("gui/{}", uid());
                let p = path.display().to_string();
                // A previous agent must go first; failure here just means there was none.
                let _ = Command::new("launchctl").args(["bootout", &target, &p]).status();
                run_cmd("launchctl", &["bootstrap", &target, &p])?
            } else {
                run_cmd("systemctl", &["--user", "daemon-reload"])?
                    && run_cmd("systemctl", &["--user", "enable", "--now", SYSTEMD_UNIT])?
            };
            if started {
                println!("colibri runs in the background now and at every login: http://127.0.0.1:{}", serve.port);
                if !macos {
                    println!("logs: journalctl --user -u colibri");
                }
            } else {
                let tool = if macos { "launchctl" } else { "systemctl" };
                println!("{tool} is not available on this system: the unit file is written but nothing was started");
            }
            Ok(())
        }
        Action::Uninstall => {
            let path = unit_path()?;
            if macos {
                let _ = run_cmd("launchctl", &["bootout", &format!("gui/{}", uid()), &path.display().to_string()]);
            } else if path.exists() {
                let _ = run_cmd("systemctl", &["--user", "disable", "--now", SYSTEMD_UNIT]);
            }
            match std::fs::remove_file(&path) {
                Ok(()) => println!("removed {}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    println!("not installed ({} does not exist)", path.display())
                }
                Err(e) => return Err(e).with_context(|| format!("{}: cannot remove", path.display())),
            }
            if !macos {
                let _ = run_cmd("systemctl", &["--user", "daemon-reload"]);
            }
            Ok(())
        }
        Action::Status => {
            let path = unit_path()?;
            if !path.exists() {
                println!("not installed ({} does not exist); `coli service install` installs it", path.display());
                return Ok(());
            }
            println!("installed: {}", path.display());
            let ok = if macos {
                run_cmd("launchctl", &["print", &format!("gui/{}/{LAUNCHD_LABEL}", uid())])
            } else {
                run_cmd("systemctl", &["--user", "--no-pager", "status", SYSTEMD_UNIT])
            };
            match ok {
                Ok(true) => {}
                Ok(false) => println!("the service manager is not available on this system"),
                Err(e) => println!("{e:#}"),
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_unit_runs_serve_with_quoted_arguments() {
        let args = vec![
            "serve".into(),
            "--model".into(),
            "/m/my model".into(),
            "--allow-origin".into(),
            "https://a.example".into(),
            "100%$".into(),
        ];
        let unit = systemd_unit(Path::new("/usr/local/bin/coli"), &args);
        assert!(unit.contains("\nExecStart=/usr/local/bin/coli serve --model \"/m/my model\" --allow-origin https://a.example \"100%%$$\"\n"), "{unit}");
        assert!(unit.contains("\nRestart=on-failure\n"));
        assert!(unit.contains("[Install]\nWantedBy=default.target\n"));
        assert_eq!(systemd_word("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(systemd_word(""), "\"\"");
    }

    #[test]
    fn launchd_plist_escapes_and_logs_under_the_log_dir() {
        let p = launchd_plist(
            Path::new("/opt/coli"),
            &["serve".into(), "--model".into(), "a&b<c>".into()],
            Path::new("/Users/u/Library/Logs/colibri"),
        );
        assert!(p.contains("<string>dev.colibri.helper</string>"));
        assert!(p.contains("<string>/opt/coli</string>\n        <string>serve</string>\n        <string>--model</string>\n        <string>a&amp;b&lt;c&gt;</string>\n"), "{p}");
        assert!(
            p.contains("<key>StandardOutPath</key>\n    <string>/Users/u/Library/Logs/colibri/helper.log</string>"),
            "{p}"
        );
        assert!(p.contains(
            "<key>StandardErrorPath</key>\n    <string>/Users/u/Library/Logs/colibri/helper.err.log</string>"
        ));
        assert!(p.contains("<key>RunAtLoad</key>\n    <true/>"));
    }

    #[test]
    fn serve_arguments_keep_only_what_differs() {
        let a = ServeArgs { port: 7878, max_queue: crate::serve::DEFAULT_MAX_QUEUE, ..Default::default() };
        assert_eq!(serve_arguments(&a), ["serve"]);
        let b = ServeArgs {
            port: 9000,
            max_queue: crate::serve::DEFAULT_MAX_QUEUE,
            host: Some("0.0.0.0".into()),
            models: vec!["demo".into()],
            allow_origins: vec!["https://x.example".into()],
            ..Default::default()
        };
        assert_eq!(
            serve_arguments(&b),
            ["serve", "--host", "0.0.0.0", "--port", "9000", "--model", "demo", "--allow-origin", "https://x.example"]
        );
    }
}
