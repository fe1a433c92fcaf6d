//! Stop strings (OpenAI `stop`): text is held back while it could still be the start of
//! a stop string, and generation ends at the first complete one, which is not emitted.

pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet emitted.
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: String::new() }
    }

    /// Adds generated text; returns the text that is now safe to emit, and whether a stop
    /// string was completed (everything from it on is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.pending), false);
        }
        let first = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min();
        if let Some(at) = first {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let tail = &self.pending[i..];
                if tail.len() < s.len() && s.starts_with(tail) {
                    keep = keep.max(tail.len());
                    break;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// The text still held back (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (o, stop) = m.push(p);
            out.push_str(&o);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_holds_back_prefixes() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["END"], &["hello E", "N", "D world"]), ("hello ".into(), true));
        assert_eq!(run(&["END"], &["hello E", "N", "x"]), ("hello ENx".into(), false));
        assert_eq!(run(&["\n\n", "stop"], &["a\n", "b", "\n", "\nc"]), ("a\nb".into(), true));
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
        assert_eq!(run(&["", "xy"], &["axy"]), ("a".into(), true));
        let mut m = StopMatcher::new(vec!["abc".into()]);
        assert_eq!(m.push("xab"), ("x".into(), false));
        assert_eq!(m.finish(), "ab");
    }
}
