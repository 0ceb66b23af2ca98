//! The request-level baseline, reproducing vLLM v1's behaviour so the same
//! engine can measure what program-level scheduling gains:
//!
//! * a finished request drops its KV references at once: full blocks become
//!   evictable cached blocks (LRU), the rest is freed;
//! * FCFS admission per replica while the prompt's blocks fit in free plus
//!   evictable blocks (no look-ahead, no watermark);
//! * when blocks run out mid-step the *newest* running request is preempted
//!   (recompute) and put back at the front of the queue;
//! * a program's requests are routed to the replica it last ran on (KV-affinity
//!   "sticky" routing, as an affinity router in front of vLLM replicas does);
//!   a new program goes to the replica with the fewest requests.

use std::collections::VecDeque;

use tracing::debug;

use crate::program::{Program, ProgramTable};
use crate::{
    Decision, Memory, Phase, Policy, PolicyStats, ProgramId, Route, SchedulerConfig, State,
};

pub struct RequestScheduler {
    cfg: SchedulerConfig,
    programs: ProgramTable,
    /// FCFS queue per replica.
    queues: Vec<VecDeque<ProgramId>>,
    /// Running requests per replica, in admission order (newest last).
    running: Vec<Vec<ProgramId>>,
    stats: PolicyStats,
}

impl RequestScheduler {
    pub fn new(cfg: SchedulerConfig, num_replicas: usize) -> Self {
        let n = num_replicas.max(1);
        Self {
            cfg,
            programs: ProgramTable::default(),
            queues: vec![VecDeque::new(); n],
            running: vec![Vec::new(); n],
            stats: PolicyStats::default(),
        }
    }

    fn least_loaded(&self) -> usize {
        (0..self.queues.len())
            .min_by_key(|&r| (self.queues[r].len() + self.running[r].len(), r))
            .unwrap_or(0)
    }

    fn stop_running(&mut self, p: ProgramId) {
        if let Some(r) = self.programs.get(&p).and_then(|q| q.replica) {
            self.running[r].retain(|q| *q != p);
        }
    }
}

impl Policy for RequestScheduler {
    fn on_request(
        &mut self,
        p: ProgramId,
        now: f64,
        context_tokens: usize,
        _mem: &dyn Memory,
    ) -> Route {
        let home = self.programs.get(&p).and_then(|q| q.replica);
        let r = home.unwrap_or_else(|| self.least_loaded());
        let prog = self
            .programs
            .get_or_insert(p, || Program::new(now, context_tokens));
        prog.context_tokens = context_tokens;
        prog.last_activity = now;
        prog.phase = Phase::Reasoning;
        if prog.in_flight == 0 {
            prog.request_at = now;
        }
        prog.in_flight += 1;
        prog.replica = Some(r);
        if prog.state == State::Active {
            // A parallel request of a running program joins it.
            return Route::Run { replica: r };
        }
        if !prog.waiting {
            prog.waiting = true;
            self.queues[r].push_back(p);
        }
        Route::Queued
    }

    fn on_request_finished(&mut self, p: ProgramId, now: f64, context_tokens: usize) -> bool {
        if let Some(prog) = self.programs.get_mut(&p) {
            prog.in_flight = prog.in_flight.saturating_sub(1);
            prog.context_tokens = context_tokens;
            prog.steps += 1;
            prog.last_activity = now;
            if prog.in_flight == 0 {
                prog.phase = Phase::Acting;
                prog.acting_since = now;
                prog.state = State::Paused;
            }
        }
        if self.programs.get(&p).is_some_and(|q| q.in_flight == 0) {
            self.stop_running(p);
            // Cancelled while it waited: it leaves the queue unadmitted.
            for q in &mut self.queues {
                q.retain(|x| *x != p);
            }
            return true;
        }
        false
    }

    fn on_terminate(&mut self, p: ProgramId) {
        self.stop_running(p);
        for q in &mut self.queues {
            q.retain(|x| *x != p);
        }
        self.programs.remove(&p);
    }

    fn expire(&mut self, _now: f64) -> Vec<ProgramId> {
        // vLLM has no notion of a program's lifetime.
        Vec::new()
    }

    fn schedule(&mut self, replica: usize, _now: f64, mem: &dyn Memory) -> Decision {
        let mut out = Decision::default();
        let mut available = mem.available(replica);
        while self.running[replica].len() < self.cfg.max_running {
            let Some(&p) = self.queues[replica].front() else {
                break;
            };
            let Some(prog) = self.programs.get(&p) else {
                self.queues[replica].pop_front();
                continue;
            };
            // Blocks taken from free + evictable: everything not already
            // referenced (cache hits on evictable blocks take them out too).
            let need = mem
                .blocks_for(prog.context_tokens)
                .saturating_sub(mem.shared_prefix(replica, p));
            if need > available {
                break;
            }
            available -= need;
            self.queues[replica].pop_front();
            let restore = prog.admitted_once;
            let Some(prog) = self.programs.get_mut(&p) else {
                continue;
            };
            prog.admitted_once = true;
            prog.waiting = false;
            prog.state = State::Active;
            if restore {
                self.stats.restores += 1;
            } else {
                self.stats.admissions += 1;
            }
            self.running[replica].push(p);
            out.admit.push((p, replica));
        }
        out
    }

    fn preempt(
        &mut self,
        replica: usize,
        _now: f64,
        mem: &dyn Memory,
        _protect: ProgramId,
    ) -> Option<ProgramId> {
        // vLLM preempts the newest running request, even the one asking.
        let victim = self.running[replica].pop()?;
        debug!(replica, program = %victim, "blocks exhausted: preempt newest (recompute)");
        if let Some(prog) = self.programs.get_mut(&victim) {
            let held_tokens = mem.blocks_held(replica, victim) * mem.block_size();
            prog.context_tokens = prog.context_tokens.max(held_tokens);
            prog.state = State::Paused;
            prog.waiting = true;
        }
        self.queues[replica].push_front(victim);
        Some(victim)
    }

    fn keeps_kv_between_requests(&self) -> bool {
        false
    }

    fn stats(&self) -> PolicyStats {
        self.stats
    }

    fn num_waiting(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    fn programs(&self) -> &ProgramTable {
        &self.programs
    }

    fn programs_mut(&mut self) -> &mut ProgramTable {
        &mut self.programs
    }
}
