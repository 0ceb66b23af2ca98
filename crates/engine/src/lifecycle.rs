//! A program's lifecycle on the engine's shared state: creation, the end of
//! each request, release and termination (with the siblings it spawned and
//! the announcement subscribers get), and the status `GET /programs` shows.

use std::time::Instant;

use agentd_kv::ProgramId;
use agentd_scheduler::{Lifecycle, Phase, Policy, State};
use tracing::debug;

use crate::core::{Core, Prog, Req};
use crate::trace::Mark;
use crate::{EndReason, Event, FinishReason, KvWhereabouts, ProgramEnded, ProgramStatus, Usage};

impl Core {
    pub(crate) fn new_program(&mut self, name: Option<String>) -> ProgramId {
        let p = ProgramId(self.next_program);
        self.next_program += 1;
        self.programs.insert(
            p,
            Prog {
                name,
                current: None,
                children: Vec::new(),
                parent: None,
                release_parent: false,
                release_pending: false,
                end_reason: None,
                steps: 0,
                parent_program: None,
                paused: None,
            },
        );
        p
    }

    /// Client API: release a program by name.
    pub fn release(&mut self, name: &str) -> bool {
        let Some(&p) = self.names.get(name) else {
            return false;
        };
        if let Some(prog) = self.programs.get_mut(&p) {
            prog.release_pending = true;
            prog.end_reason = Some(EndReason::Released);
        }
        self.reap(p);
        true
    }

    /// Terminates `p` if it is marked for release and no batch holds it.
    pub(crate) fn reap(&mut self, p: ProgramId) {
        let pending = self.programs.get(&p).is_some_and(|q| q.release_pending);
        if !pending || self.in_step(p) {
            return;
        }
        let Some(mut prog) = self.programs.remove(&p) else {
            return;
        };
        if let Some(req) = prog.current.take() {
            let (reason, usage) = (FinishReason::Cancelled, usage_of(&req));
            self.outbox.push(&req.tx, Event::Finished { reason, usage });
            self.outbox
                .mark_owned(req.span, Mark::Finished { reason, usage });
        }
        self.replicas.terminate(p);
        if let Some(name) = &prog.name {
            self.names.remove(name);
        }
        let reason = prog.end_reason.unwrap_or(EndReason::Released);
        // Debug level: at info, every program's end formatted and wrote a
        // line to the log while holding the engine lock.
        debug!(program = %p, name = prog.name.as_deref().unwrap_or("-"), steps = prog.steps, reason = reason.as_str(), "program released");
        // Releasing a program cancels its siblings (each is reaped now, or
        // after the step that holds it).
        for c in prog.children {
            if let Some(child) = self.programs.get_mut(&c) {
                child.release_pending = true;
                child.parent = None;
            }
            self.reap(c);
        }
        if let Some(parent) = prog.parent {
            if let Some(q) = self.programs.get_mut(&parent) {
                q.children.retain(|c| *c != p);
                if prog.release_parent {
                    q.release_pending = true;
                    q.end_reason = Some(EndReason::Final);
                }
            }
            if prog.release_parent {
                self.reap(parent);
            }
        }
        if let Some(name) = prog.name {
            self.announce_end(ProgramEnded {
                id: name,
                reason,
                at: Instant::now(),
            });
        }
    }

    /// Tells every live subscriber that a named program ended; subscribers
    /// that went away are forgotten.
    pub(crate) fn announce_end(&mut self, ended: ProgramEnded) {
        self.ended_subscribers
            .retain(|tx| tx.send(ended.clone()).is_ok());
        debug!(program = %ended.id, subscribers = self.ended_subscribers.len(), "program end announced");
    }

    /// Ends `p`'s current request and starts its next one, if queued.
    pub(crate) fn finish(&mut self, p: ProgramId, reason: FinishReason) {
        let now = self.now();
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        let Some(req) = prog.current.take() else {
            return;
        };
        prog.steps += 1;
        if let Some(parent) = prog.parent.and_then(|q| self.programs.get_mut(&q)) {
            parent.steps += 1;
        }
        let usage = usage_of(&req);
        self.outbox.push(&req.tx, Event::Finished { reason, usage });
        self.outbox
            .mark_owned(req.span, Mark::Finished { reason, usage });
        self.counters.requests_finished += 1;
        self.counters
            .e2e_s
            .observe(req.arrived.elapsed().as_secs_f64());
        self.replicas.finish_request(p, now, req.tokens.len());
        if let Some(tool) = req.tool {
            self.replicas.note_tool(p, tool, now);
        }
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        if req.final_request {
            prog.release_pending = true;
            prog.end_reason = Some(EndReason::Final);
            self.reap(p);
        }
    }

    pub fn program_status(&self) -> Vec<ProgramStatus> {
        let mut v: Vec<ProgramStatus> = self
            .programs
            .iter()
            .filter_map(|(p, prog)| {
                let info = self.replicas.policy.program(*p);
                let home = self.replicas.home(*p);
                let name = prog.name.clone()?;
                Some(ProgramStatus {
                    id: name,
                    // Reasoning while any of its requests is in flight.
                    phase: match info.as_ref().map(|i| i.phase) {
                        Some(Phase::Acting) if prog.children.is_empty() => "acting",
                        _ => "reasoning",
                    },
                    state: match info.as_ref().map(|i| i.state) {
                        Some(State::Active) => "active",
                        Some(State::Terminated) => "terminated",
                        _ => "paused",
                    },
                    lifecycle: info
                        .as_ref()
                        .map_or(Lifecycle::Idle, |i| i.lifecycle)
                        .as_str(),
                    replica: home,
                    context_tokens: prog.current.as_ref().map_or_else(
                        || info.as_ref().map_or(0, |i| i.context_tokens),
                        |r| r.tokens.len(),
                    ),
                    blocks_held: self.replicas.blocks_held(*p),
                    kv: home.map_or_else(KvWhereabouts::default, |h| {
                        let w = self.replicas.kv(h).whereabouts(*p);
                        KvWhereabouts {
                            device: w.device,
                            host: w.host,
                            lost: w.lost,
                        }
                    }),
                    steps: prog.steps,
                    waiting_requests: usize::from(
                        prog.current.is_some() && !self.replicas.is_running(*p),
                    ),
                    parallel_requests: prog.children.len(),
                    parent_program: prog.parent_program.clone(),
                    park: info.as_ref().and_then(|i| i.park).map(|k| k.as_str()),
                })
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }
}

fn usage_of(req: &Req) -> Usage {
    Usage {
        prompt_tokens: req.prompt_len,
        completion_tokens: req.tokens.len() - req.prompt_len,
        cached_tokens: req.cached_tokens.unwrap_or(0),
    }
}
