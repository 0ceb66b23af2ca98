//! A program's lifecycle on the engine's shared state: creation, the end of
//! each request, release and termination (with the siblings it spawned and
//! the announcement subscribers get), and the status `GET /programs` shows.

use std::time::Instant;

use agentd_kv::ProgramId;
use agentd_scheduler::{Ended, Lifecycle, Phase, State};
use tracing::debug;

use crate::core::{Core, Req};
use crate::trace::Mark;
use crate::{EndReason, Event, FinishReason, KvWhereabouts, ProgramEnded, ProgramStatus, Usage};

impl Core {
    /// A new program's id, with its record opened in the program table.
    pub(crate) fn new_program(&mut self, name: Option<String>) -> ProgramId {
        let now = self.now();
        self.replicas.programs_mut().open(name, now)
    }

    /// Client API: release a program by name.
    pub fn release(&mut self, name: &str) -> bool {
        let Some(p) = self.replicas.programs().id_of(name) else {
            return false;
        };
        if let Some(life) = self.replicas.programs_mut().life_mut(p) {
            life.release = Some(EndReason::Released);
        }
        self.reap(p);
        true
    }

    /// Terminates `p` if it is marked for release and no batch holds it.
    pub(crate) fn reap(&mut self, p: ProgramId) {
        let marked = (self.replicas.programs().life(p)).is_some_and(|l| l.release.is_some());
        if !marked || self.in_step(p) {
            return;
        }
        if let Some(ended) = self.replicas.terminate(p) {
            self.ended(ended);
        }
    }

    /// What follows a program's termination (its KV already released): its
    /// request ends cancelled, its siblings are cancelled, a sibling's
    /// final request releases its parent, and a named program's end is
    /// announced.
    pub(crate) fn ended(&mut self, ended: Ended) {
        let Ended {
            program: p,
            steps,
            life,
        } = ended;
        if let Some(req) = self.requests.remove(&p) {
            let (reason, usage) = (FinishReason::Cancelled, usage_of(&req));
            self.outbox.push(&req.tx, Event::Finished { reason, usage });
            self.outbox
                .mark_owned(req.span, Mark::Finished { reason, usage });
        }
        let reason = life.release.unwrap_or(EndReason::Released);
        // Debug level: at info, every program's end formatted and wrote a
        // line to the log while holding the engine lock.
        debug!(program = %p, name = life.name.as_deref().unwrap_or("-"), steps, reason = reason.as_str(), "program released");
        // Releasing a program cancels its siblings (each is reaped now, or
        // after the step that holds it).
        for c in life.children {
            if let Some(child) = self.replicas.programs_mut().life_mut(c) {
                child.release.get_or_insert(EndReason::Released);
                child.parent = None;
            }
            self.reap(c);
        }
        if let Some(parent) = life.parent {
            if let Some(q) = self.replicas.programs_mut().life_mut(parent) {
                q.children.retain(|c| *c != p);
                if life.release_parent {
                    q.release = Some(EndReason::Final);
                }
            }
            if life.release_parent {
                self.reap(parent);
            }
        }
        if let Some(name) = life.name {
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
        let Some(req) = self.requests.remove(&p) else {
            return;
        };
        let usage = usage_of(&req);
        self.outbox.push(&req.tx, Event::Finished { reason, usage });
        self.outbox
            .mark_owned(req.span, Mark::Finished { reason, usage });
        self.counters.requests_finished += 1;
        self.counters
            .e2e_s
            .observe(req.arrived.elapsed().as_secs_f64());
        // Counts the request as a step of `p` (and of its parent, for a
        // sibling) in the program table.
        self.replicas.finish_request(p, now, req.tokens.len());
        if let Some(tool) = req.tool {
            self.replicas.note_tool(p, tool, now);
        }
        if req.final_request {
            if let Some(life) = self.replicas.programs_mut().life_mut(p) {
                life.release = Some(EndReason::Final);
                self.reap(p);
            }
        }
    }

    pub fn program_status(&self) -> Vec<ProgramStatus> {
        let table = self.replicas.programs();
        let mut v: Vec<ProgramStatus> = table
            .lives()
            .filter_map(|(p, life)| {
                let name = life.name.clone()?;
                let info = table.info(p);
                let home = self.replicas.home(p);
                let current = self.requests.get(&p);
                Some(ProgramStatus {
                    id: name,
                    // Reasoning while any of its requests is in flight.
                    phase: match info.as_ref().map(|i| i.phase) {
                        Some(Phase::Acting) if life.children.is_empty() => "acting",
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
                    context_tokens: current.map_or_else(
                        || info.as_ref().map_or(0, |i| i.context_tokens),
                        |r| r.tokens.len(),
                    ),
                    blocks_held: self.replicas.blocks_held(p),
                    kv: home.map_or_else(KvWhereabouts::default, |h| {
                        let w = self.replicas.kv(h).whereabouts(p);
                        KvWhereabouts {
                            device: w.device,
                            host: w.host,
                            lost: w.lost,
                        }
                    }),
                    steps: info.as_ref().map_or(0, |i| i.steps),
                    waiting_requests: usize::from(
                        current.is_some() && !self.replicas.is_running(p),
                    ),
                    parallel_requests: life.children.len(),
                    parent_program: life.parent_program.clone(),
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
