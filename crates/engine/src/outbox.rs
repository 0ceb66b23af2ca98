//! Events for callers' streams, delivered after the engine lock is released.
//!
//! Sending on a request's channel wakes the task that reads it: a futex
//! wake per stream, and on a 2-core machine the woken runtime thread takes
//! the core the lock holder runs on. At 96 programs a commit sent ~100
//! events under the lock and was held 1–1.9 ms at p99 with only 0.1–0.4 ms
//! of its own CPU time (the rest descheduled). So sections only queue
//! events here, in order, and [`crate::worker::Held::end`] hands them out once
//! the lock is free. A stream's events stay in order: one section's events
//! go out in the order they were queued, and a request's later events are
//! queued by later sections.
//!
//! Trace events ([`crate::trace`]) wait here too: emitting one formats its
//! fields for every subscriber (a log line, an exported span event), work
//! that has no place under the lock. A disabled span queues nothing.

use tokio::sync::mpsc::UnboundedSender;
use tracing::Span;

use crate::trace::Mark;
use crate::Event;

#[derive(Default)]
pub(crate) struct Outbox {
    queued: Vec<(UnboundedSender<Event>, Event)>,
    marks: Vec<(Span, Mark)>,
}

impl Outbox {
    /// Queues `event` for `tx`'s reader.
    pub fn push(&mut self, tx: &UnboundedSender<Event>, event: Event) {
        self.queued.push((tx.clone(), event));
    }

    /// Queues `mark` for `span` (a handle clone: the span closes when its
    /// last handle goes, so a request's span closes here, outside the lock,
    /// after its `finished` mark).
    pub fn mark(&mut self, span: &Span, mark: Mark) {
        if !span.is_disabled() {
            self.marks.push((span.clone(), mark));
        }
    }

    /// [`Outbox::mark`] taking the span's handle.
    pub fn mark_owned(&mut self, span: Span, mark: Mark) {
        if !span.is_disabled() {
            self.marks.push((span, mark));
        }
    }

    /// Queues `other`'s events after this one's.
    pub fn append(&mut self, mut other: Outbox) {
        self.queued.append(&mut other.queued);
        self.marks.append(&mut other.marks);
    }

    /// Everything queued so far, to deliver outside the lock.
    pub fn take(&mut self) -> Outbox {
        std::mem::take(self)
    }

    /// Sends every queued event; a reader that went away loses its events
    /// (its request is cancelled by the stream's drop).
    /// Trace marks are emitted after the streams' events.
    pub fn deliver(self) {
        for (tx, event) in self.queued {
            let _ = tx.send(event);
        }
        for (span, mark) in self.marks {
            mark.emit(&span);
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::{FinishReason, TokenEvent, Usage};

    fn token(id: u32) -> Event {
        Event::Token(TokenEvent {
            token_id: id,
            logprob: None,
            top: Vec::new(),
            stop_token: false,
            prompt_logprobs: None,
        })
    }

    #[test]
    fn nothing_is_sent_before_delivery_and_each_stream_keeps_its_order() {
        let (a_tx, mut a) = mpsc::unbounded_channel();
        let (b_tx, mut b) = mpsc::unbounded_channel();
        let (gone_tx, gone) = mpsc::unbounded_channel();
        drop(gone);
        let mut out = Outbox::default();
        out.push(&a_tx, token(1));
        out.push(&b_tx, token(7));
        out.push(&gone_tx, token(9));
        out.push(&a_tx, token(2));
        out.push(
            &a_tx,
            Event::Finished {
                reason: FinishReason::Stop,
                usage: Usage::default(),
            },
        );
        assert!(a.try_recv().is_err(), "queued, not sent");
        out.take().deliver();
        let ids = |rx: &mut mpsc::UnboundedReceiver<Event>| {
            let mut v = Vec::new();
            while let Ok(e) = rx.try_recv() {
                v.push(match e {
                    Event::Token(t) => t.token_id as i64,
                    Event::Finished { .. } => -1,
                });
            }
            v
        };
        assert_eq!(ids(&mut a), vec![1, 2, -1]);
        assert_eq!(ids(&mut b), vec![7]);
        assert!(out.queued.is_empty());
    }
}
