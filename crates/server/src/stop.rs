//! Stop strings, matched on the detokenised text as it streams.
//!
//! The engine knows token ids, not text, so the server finds stop strings
//! itself: it holds back the last `longest stop - 1` bytes (a stop string may
//! be split across tokens), and on a match returns the text before it; the
//! caller then drops the engine stream, which cancels the request.

/// What a pushed piece of text settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text that can be sent (possibly empty: all of it is held back).
    Ready(String),
    /// A stop string matched: the text before it; nothing follows.
    Stopped(String),
}

#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Bytes kept back so that a stop string split across pushes is seen whole.
    hold: usize,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let hold = stops
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        StopMatcher {
            stops,
            hold,
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Ready(text.to_string());
        }
        self.pending.push_str(text);
        // Earliest match wins, whichever stop string it is.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            self.pending.truncate(at);
            return StopOutcome::Stopped(std::mem::take(&mut self.pending));
        }
        let mut cut = self.pending.len().saturating_sub(self.hold);
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        let ready: String = self.pending.drain(..cut).collect();
        StopOutcome::Ready(ready)
    }

    /// The end of generation: whatever is held back is sent.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for c in chunks {
            match m.push(c) {
                StopOutcome::Ready(s) => out.push_str(&s),
                StopOutcome::Stopped(s) => {
                    out.push_str(&s);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn split_across_chunks() {
        assert_eq!(
            run(&["STOP"], &["ab", "cS", "TO", "Pxyz"]),
            ("abc".into(), true)
        );
        assert_eq!(
            run(&["STOP"], &["ab", "cST", "O"]),
            ("abcSTO".into(), false)
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["b", "xyz"], &["axy", "zb"]), ("a".into(), true));
    }

    #[test]
    fn holds_back_on_char_boundaries() {
        let mut m = StopMatcher::new(vec!["éé".into()]);
        // "aé" then "é": the hold of 3 bytes must not cut inside 'é'.
        assert_eq!(m.push("aé"), StopOutcome::Ready(String::new()));
        assert_eq!(m.push("é!"), StopOutcome::Stopped("a".into()));
        let mut m = StopMatcher::new(vec!["zz".into()]);
        assert_eq!(m.push("ééé"), StopOutcome::Ready("éé".into()));
        assert_eq!(m.finish(), "é");
    }
}
