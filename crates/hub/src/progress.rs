//! Byte progress bars (bytes, rate, ETA) for downloads and for loading
//! checkpoint shards. Drawn on stderr only when it is a terminal, as
//! indicatif does, and never when `HF_HUB_DISABLE_PROGRESS_BARS` is set (the
//! variable huggingface_hub reads); logs then say what happened instead.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte counter, drawn as a bar when a person is watching.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total` bytes labelled `label` (e.g. "Downloading").
    pub fn bytes(label: &str, total: u64) -> Self {
        let target = if env_true("HF_HUB_DISABLE_PROGRESS_BARS") {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(label.to_owned());
        Progress { bar }
    }

    /// Whether the bar is drawn (stderr is a terminal): callers log the
    /// steps themselves when it is not.
    pub fn is_visible(&self) -> bool {
        !self.bar.is_hidden()
    }

    pub fn inc(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    /// What is being worked on (e.g. the file name).
    pub fn set_message(&self, msg: &str) {
        self.bar.set_message(msg.to_owned());
    }

    /// Leaves the finished bar on the terminal.
    pub fn finish(&self) {
        self.bar.finish();
    }

    /// Removes the bar (on failure: the error says what happened).
    pub fn abandon(&self) {
        self.bar.abandon();
    }
}

/// huggingface_hub's truthy values: 1, ON, YES, TRUE (any case).
pub fn env_true(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}
