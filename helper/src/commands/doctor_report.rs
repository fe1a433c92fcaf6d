//! What `coli doctor` prints: one line per check (ok, warn or FAIL, the check's name and
//! its detail) and the count of failures, shared by the model checks (`doctor`) and the
//! machine's (`doctor_machine`).

use anyhow::Result;

/// The lines printed so far and how many failed.
pub(crate) struct Report {
    pub(crate) failed: usize,
}

impl Report {
    pub(crate) fn ok(&self, what: &str, detail: impl std::fmt::Display) {
        println!("ok    {what:<14} {detail}");
    }

    pub(crate) fn warn(&self, what: &str, detail: impl std::fmt::Display) {
        println!("warn  {what:<14} {detail}");
    }

    pub(crate) fn fail(&mut self, what: &str, detail: impl std::fmt::Display) {
        println!("FAIL  {what:<14} {detail}");
        self.failed += 1;
    }

    pub(crate) fn check<T>(&mut self, what: &str, r: Result<T>, detail: impl Fn(&T) -> String) -> Option<T> {
        match r {
            Ok(v) => {
                self.ok(what, detail(&v));
                Some(v)
            }
            Err(e) => {
                let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
                self.fail(what, chain.join(": "));
                None
            }
        }
    }
}
