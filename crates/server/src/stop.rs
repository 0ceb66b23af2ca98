//! Stop strings, matched on the detokenised text as it streams.
//!
//! The engine knows token ids, not text, so the server finds stop strings
//! itself: it holds back the last `longest stop - 1` bytes (a stop string may
//! be split across tokens), and on a match returns the text before it (or
//! through it, with vLLM's `include_stop_str_in_output`); the caller then
//! drops the engine stream, which cancels the request.

/// What a pushed piece of text settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text that can be sent (possibly empty: all of it is held back).
    Ready(String),
    /// A stop string matched: the text before it (and the stop string
    /// itself when included); nothing follows.
    Stopped(String),
}

/// What ended a generation that finished with `stop`: SGLang's
/// `finish_reason.matched` and vLLM's `stop_reason` both say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matched {
    /// The model's end-of-sequence token.
    Eos(u32),
    /// One of the request's `stop_token_ids`.
    Token(u32),
    /// One of the request's stop strings.
    Text(String),
    /// Nothing known (e.g. the output ended otherwise).
    Nothing,
}

/// What stopped an output of `ids` whose returned text is `text`: the stop
/// token it ended with (EOS first, as vLLM checks it first), else the stop
/// string found where the text ends (included in it) or in the rest of the
/// output, `full()` being the whole output's text (the rest is cut off).
pub fn matched(
    ids: &[u32],
    text: &str,
    sampling: &crate::sampling::Sampling,
    eos: &[u32],
    full: impl FnOnce() -> String,
) -> Matched {
    let params = &sampling.params;
    if let Some(&last) = ids.last() {
        if !params.ignore_eos && eos.contains(&last) {
            return Matched::Eos(last);
        }
        if params.stop_token_ids.contains(&last) {
            return Matched::Token(last);
        }
    }
    let stops = &sampling.stop;
    if let Some(s) = stops.iter().find(|s| text.ends_with(s.as_str())) {
        return Matched::Text(s.clone());
    }
    let full = full();
    let rest = full.get(text.len()..).unwrap_or("");
    stops
        .iter()
        .filter_map(|s| rest.find(s.as_str()).map(|at| (at, s)))
        .min()
        .map_or(Matched::Nothing, |(_, s)| Matched::Text(s.clone()))
}

#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Whether the matched stop string stays in the output.
    include: bool,
    /// Bytes kept back so that a stop string split across pushes is seen whole.
    hold: usize,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>, include: bool) -> Self {
        let hold = stops
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        StopMatcher {
            stops,
            include,
            hold,
            pending: String::new(),
        }
    }

    /// Adds `text`; when `check` is false (vLLM's `min_tokens` not reached
    /// yet) no stop string is looked for. A match must end inside `text`
    /// (vLLM's window): text pushed unchecked never ends one later.
    pub fn push(&mut self, text: &str, check: bool) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Ready(text.to_string());
        }
        let old = self.pending.len();
        self.pending.push_str(text);
        // Earliest match wins, whichever stop string it is.
        let hit = check
            .then(|| {
                self.stops
                    .iter()
                    .filter_map(|s| self.find_ending_after(s, old))
                    .min()
            })
            .flatten();
        if let Some((at, len)) = hit {
            self.pending
                .truncate(if self.include { at + len } else { at });
            return StopOutcome::Stopped(std::mem::take(&mut self.pending));
        }
        let mut cut = self.pending.len().saturating_sub(self.hold);
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        let ready: String = self.pending.drain(..cut).collect();
        StopOutcome::Ready(ready)
    }

    /// `(start, len)` of the first `s` in the pending text that ends past
    /// byte `old`.
    fn find_ending_after(&self, s: &str, old: usize) -> Option<(usize, usize)> {
        let mut from = old.saturating_sub(s.len().saturating_sub(1));
        // A match starts on a character boundary: round up.
        while !self.pending.is_char_boundary(from) {
            from += 1;
        }
        let at = self.pending.get(from..)?.find(s)?;
        Some((from + at, s.len()))
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
        run_with(stops, chunks, false, 0)
    }

    /// Pushes `chunks`, the first `unchecked` without looking for stops.
    fn run_with(
        stops: &[&str],
        chunks: &[&str],
        include: bool,
        unchecked: usize,
    ) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect(), include);
        let mut out = String::new();
        for (i, c) in chunks.iter().enumerate() {
            match m.push(c, i >= unchecked) {
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
        let mut m = StopMatcher::new(vec!["éé".into()], false);
        // "aé" then "é": the hold of 3 bytes must not cut inside 'é'.
        assert_eq!(m.push("aé", true), StopOutcome::Ready(String::new()));
        assert_eq!(m.push("é!", true), StopOutcome::Stopped("a".into()));
        let mut m = StopMatcher::new(vec!["zz".into()], false);
        assert_eq!(m.push("ééé", true), StopOutcome::Ready("éé".into()));
        assert_eq!(m.finish(), "é");
    }

    #[test]
    fn included_stop_strings_stay_in_the_text() {
        assert_eq!(
            run_with(&["STOP"], &["ab", "cS", "TO", "Pxyz"], true, 0),
            ("abcSTOP".into(), true)
        );
        assert_eq!(
            run_with(&["b", "xyz"], &["axy", "zb"], true, 0),
            ("axyz".into(), true)
        );
    }

    #[test]
    fn unchecked_text_never_ends_a_stop_string() {
        // "e" in the first two (min_tokens) pushes does not stop; the next does.
        assert_eq!(
            run_with(&["e"], &["he", "ee", "xe", "e"], false, 2),
            ("heeex".into(), true)
        );
        // A stop straddling the boundary ends in checked text: it counts.
        assert_eq!(
            run_with(&["STOP"], &["aST", "OP"], false, 1),
            ("a".into(), true)
        );
        // One wholly inside unchecked text does not, even once held back.
        assert_eq!(
            run_with(&["xyz", "b"], &["axyzc", "d"], false, 1),
            ("axyzcd".into(), false)
        );
    }
}
