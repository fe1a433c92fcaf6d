//! `coli chat` on a terminal, as a person uses it: the demo model under a pseudo-terminal
//! (line editing on), Ctrl-C typed while an answer streams. Ctrl-C must stop the answer and
//! keep the conversation every time; it once ended the process in about half the runs (the
//! line editor put back the default SIGINT handler when the process's own was installed
//! while the first line was being read), so the test starts the process 20 times.

#![cfg(target_os = "linux")]

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const RUNS: usize = 20;

/// A pseudo-terminal: the master side (ours) and the path of the terminal side (the child's).
fn open_pty() -> (File, PathBuf) {
    // SAFETY: plain libc calls on a descriptor this function owns; the name buffer is
    // large enough and NUL-terminated by ptsname_r.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let mut name = [0 as libc::c_char; 256];
        assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        let size = libc::winsize { ws_row: 40, ws_col: 200, ws_xpixel: 0, ws_ypixel: 0 };
        assert_eq!(libc::ioctl(fd, libc::TIOCSWINSZ, &size), 0);
        (File::from_raw_fd(fd), PathBuf::from(CStr::from_ptr(name.as_ptr()).to_str().unwrap()))
    }
}

/// Everything the terminal shows, read on a thread (it ends when the child has exited).
fn reader(mut master: File) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 || tx.send(String::from_utf8_lossy(&buf[..n]).into_owned()).is_err() {
                break;
            }
        }
    });
    rx
}

struct Session {
    child: Child,
    input: File,
    output: Receiver<String>,
    /// What the terminal showed so far.
    seen: String,
    run: usize,
    /// Messages the conversation holds (each answered or stopped question adds two).
    messages: usize,
    /// Answers stopped by ^C.
    stopped: usize,
}

impl Session {
    /// `coli chat --model demo` in its own session with the terminal as its controlling
    /// terminal, so that ^C typed on it is a SIGINT to the process.
    fn start(run: usize, home: &std::path::Path) -> Session {
        let (master, tty) = open_pty();
        let term = || OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOCTTY).open(&tty).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_coli"));
        // Long sampled answers (the end tokens banned), so that ^C lands while one streams.
        cmd.args(["chat", "--model", "demo", "--temperature", "20", "--seed", &run.to_string()])
            .args(["--logit-bias", "2045=-100,2046=-100,2047=-100", "--max-new-tokens", "600"])
            .env("TERM", "xterm")
            .env("COLI_HOME", home.join("coli"))
            .env("XDG_DATA_HOME", home.join("data"))
            .env("HOME", home)
            .stdin(term())
            .stdout(term())
            .stderr(term());
        // SAFETY: async-signal-safe calls only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let input = master.try_clone().unwrap();
        Session { child, input, output: reader(master), seen: String::new(), run, messages: 0, stopped: 0 }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Reads until `done(seen[from..])`; fails with what was shown if the process exits
    /// or a minute passes first.
    fn wait_for(&mut self, from: usize, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&self.seen[from..]) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(chunk) => self.seen.push_str(&chunk),
                Err(_) => {
                    if let Some(status) = self.child.try_wait().unwrap() {
                        while let Ok(chunk) = self.output.recv_timeout(Duration::from_millis(200)) {
                            self.seen.push_str(&chunk);
                        }
                        assert!(
                            done(&self.seen[from..]),
                            "run {}: coli chat exited ({status}) waiting for {what}; the terminal showed:\n{}",
                            self.run,
                            self.seen
                        );
                        return;
                    }
                    assert!(!left.is_zero(), "run {}: timed out waiting for {what}:\n{}", self.run, self.seen);
                }
            }
        }
    }

    fn wait_prompt(&mut self, from: usize) {
        self.wait_for(from, "the prompt", |s| s.contains("> "));
    }

    /// Waits for `text` after `from`; returns where it ends in what was shown.
    fn wait_text(&mut self, from: usize, text: &str) -> usize {
        self.wait_for(from, text, |s| s.contains(text));
        from + self.seen[from..].find(text).unwrap() + text.len()
    }

    fn send(&mut self, text: &str) {
        self.input.write_all(text.as_bytes()).unwrap();
        self.input.flush().unwrap();
    }

    /// Sends a question, types ^C once its answer is streaming, and returns where the
    /// output after the stopped answer begins (the next prompt follows). An answer of the
    /// demo model takes a fraction of a second: on a loaded machine the ^C can arrive after
    /// it ended (it then lands at the prompt, or between the answer and the prompt). Such
    /// an answer stays in the conversation like any other and the question is asked again.
    fn ask_and_interrupt(&mut self, question: &str) -> usize {
        for _ in 0..10 {
            let start = self.seen.len();
            self.send(&format!("{question}\r"));
            // The echoed question, then the answer's first bytes.
            self.wait_for(start, "the answer", |s| s.find(question).is_some_and(|i| s.len() > i + question.len() + 40));
            self.send("\x03");
            // A stopped answer ends with " [stopped]" before its "[N tokens, ...]" line.
            let end = self.wait_text(start, "tokens/s]");
            self.messages += 2;
            // A long earlier answer can make the conversation too long for the context:
            // then its oldest messages go, and chat says how many.
            if let Some(at) = self.seen[start..end].find("dropped the ") {
                let rest = &self.seen[start + at + "dropped the ".len()..end];
                let dropped: usize = rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap();
                self.messages -= dropped;
            }
            if self.seen[start..end].contains(" [stopped]") {
                let after = start + self.seen[start..].find(" [stopped]").unwrap() + " [stopped]".len();
                self.wait_prompt(end);
                assert!(self.alive(), "run {}: the process ended after ^C:\n{}", self.run, self.seen);
                self.stopped += 1;
                return after;
            }
            self.wait_prompt(end);
            assert!(self.alive(), "run {}: the process ended after a late ^C:\n{}", self.run, self.seen);
        }
        panic!("run {}: ten answers ended before their ^C arrived:\n{}", self.run, self.seen);
    }

    fn stats_say(&mut self, messages: usize) {
        let from = self.seen.len();
        self.send("/stats\r");
        let end = self.wait_text(from, &format!("conversation: {messages} messages"));
        self.wait_prompt(end);
    }
}

#[test]
fn ctrl_c_stops_only_the_answer_every_time() {
    let home = std::env::temp_dir().join(format!("coli-chat-pty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let t0 = Instant::now();
    for run in 0..RUNS {
        let mut s = Session::start(run, &home);
        s.wait_for(0, "the banner", |t| t.contains("/help lists the commands"));
        s.wait_prompt(0);
        s.ask_and_interrupt("What is 23 + 45?");
        // The stopped answer stays in the conversation, which goes on.
        s.stats_say(s.messages);
        s.ask_and_interrupt("What is 31 + 27?");
        s.stats_say(s.messages);
        s.send("/quit\r");
        let status = s.child.wait().unwrap();
        assert!(status.success(), "run {run}: {status:?}\n{}", s.seen);
        assert_eq!(s.seen.matches(" [stopped]").count(), s.stopped, "run {run}:\n{}", s.seen);
        assert_eq!(s.stopped, 2, "run {run}");
    }
    eprintln!("{RUNS} runs, 2 answers stopped in each, in {:.1} s", t0.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&home);
}
