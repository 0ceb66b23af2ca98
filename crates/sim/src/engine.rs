//! The simulated engine: program lifecycle and the event loop.
//!
//! Events are tool completions (a program's next request arrives) and replica
//! steps. A replica steps back to back while it has running sequences and goes
//! idle otherwise; any arrival or finished request wakes idle replicas so they
//! get a scheduling decision.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

use agentd_kv::{KvCache, ProgramId};
use agentd_scheduler::{
    build_policy, Contexts, GroupId, Park, PauseCause, Policy, ReplicaSet, Started, ToolId,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::metrics::{percentile, Metrics};
use crate::workload::{system_prompt, token_at, uniform, Workload};
use crate::{RunResult, SimConfig, SimError};

/// A program of the workload, with its full context (the engine's copy).
pub(crate) struct Prog {
    pub rng: ChaCha8Rng,
    pub context: Vec<u32>,
    /// Next index in this program's token stream.
    pub next_token: u64,
    pub turns_left: usize,
    pub gen_target: usize,
    pub generated: usize,
    pub request_arrived: f64,
    /// Longest prefix of `context` ever computed (for the ideal hit rate).
    pub ever_computed: usize,
    /// Requests finished so far (0 while the first one runs).
    pub turns_done: usize,
    /// The rollout group it belongs to (`Workload::group_size` > 1).
    pub group: Option<u64>,
}

/// A live rollout group: when it started and members still running.
pub(crate) struct GroupRun {
    pub started: f64,
    pub live: usize,
}

/// The simulated programs' contexts, lent to the core.
pub(crate) struct SimCtx<'a>(pub &'a HashMap<ProgramId, Prog>);

impl Contexts for SimCtx<'_> {
    fn context(&self, p: ProgramId) -> Option<&[u32]> {
        self.0.get(&p).map(|q| q.context.as_slice())
    }
    fn generated(&self, p: ProgramId) -> usize {
        self.0.get(&p).map_or(0, |q| q.generated)
    }
    fn group(&self, p: ProgramId) -> Option<(GroupId, Option<usize>)> {
        let g = self.0.get(&p)?.group?;
        Some((GroupId(g), None))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Event {
    /// Replica `r` finishes its step (or is kicked while idle) and plans the next.
    Step(usize),
    /// The tool of program `p` returns: its next request arrives.
    ToolDone(u64),
    /// A new program starts.
    Spawn,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct At(f64);
impl Eq for At {}
impl PartialOrd for At {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for At {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

pub(crate) struct Replica {
    /// A `Step` event is pending for this replica.
    pub busy: bool,
    /// Requests that completed in the step now executing.
    pub finishing: Vec<ProgramId>,
}

/// One simulation run.
pub struct Simulation {
    pub(crate) cfg: SimConfig,
    /// The engine's own core: KV caches, running sets, the policy.
    pub(crate) core: ReplicaSet,
    pub(crate) programs: HashMap<ProgramId, Prog>,
    pub(crate) replicas: Vec<Replica>,
    pub(crate) metrics: Metrics,
    pub(crate) now: f64,
    system: Vec<u32>,
    system_seen: bool,
    events: BinaryHeap<Reverse<(At, u64, Event)>>,
    event_seq: u64,
    next_program: u64,
    groups: HashMap<u64, GroupRun>,
    next_group: u64,
    /// Something happened that may let an idle replica run (arrival, finish,
    /// admission elsewhere).
    pub(crate) dirty: bool,
}

impl Simulation {
    pub fn new(cfg: SimConfig) -> Result<Self, SimError> {
        cfg.scheduler.validate().map_err(SimError::Config)?;
        if cfg.replicas == 0 || cfg.concurrency == 0 || cfg.block_size == 0 {
            return Err(SimError::Config(
                "replicas, concurrency and block size must be positive".into(),
            ));
        }
        if cfg.stationary_start && cfg.workload.group_size > 1 {
            return Err(SimError::Config(
                "a stationary start joins single programs mid-history, not rollout groups".into(),
            ));
        }
        let blocks = cfg.kv_tokens / cfg.block_size;
        if blocks * cfg.block_size < cfg.workload.max_context * 2 {
            return Err(SimError::Config(format!(
                "kv_tokens {} cannot hold two programs at the workload's max context {}",
                cfg.kv_tokens, cfg.workload.max_context
            )));
        }
        let core = ReplicaSet::new(
            build_policy(&cfg.scheduler, cfg.replicas),
            cfg.replicas,
            blocks,
            cfg.block_size,
            0,
            cfg.check_invariants,
        )
        .with_host_tier(cfg.host_kv_tokens / cfg.block_size)
        .with_step_balance(&cfg.scheduler);
        let replicas = (0..cfg.replicas)
            .map(|_| Replica {
                busy: false,
                finishing: Vec::new(),
            })
            .collect();
        Ok(Self {
            core,
            system: system_prompt(cfg.workload.system_tokens),
            metrics: Metrics::new(cfg.warmup_s),
            cfg,
            programs: HashMap::new(),
            replicas,
            now: 0.0,
            system_seen: false,
            events: BinaryHeap::new(),
            event_seq: 0,
            next_program: 0,
            groups: HashMap::new(),
            next_group: 0,
            dirty: false,
        })
    }

    pub(crate) fn push(&mut self, t: f64, e: Event) {
        self.events.push(Reverse((At(t), self.event_seq, e)));
        self.event_seq += 1;
    }

    /// Runs until the simulated duration and returns the measurements.
    pub fn run(mut self) -> Result<RunResult, SimError> {
        let wall = Instant::now();
        // Stagger the first programs (groups) over a few seconds, as agents start.
        let g = self.cfg.workload.group_size.max(1);
        for i in 0..self.cfg.concurrency.div_ceil(g) {
            self.push(i as f64 * 0.05 * g as f64, Event::Spawn);
        }
        while let Some(Reverse((At(t), _, e))) = self.events.pop() {
            if t > self.cfg.duration_s {
                break;
            }
            self.now = t;
            let usages: Vec<f64> = self.core.kvs().iter().map(KvCache::usage).collect();
            self.metrics.sample_usage(t, &usages);
            match e {
                Event::Spawn => self.spawn_group(),
                Event::ToolDone(id) => self.next_turn(ProgramId(id)),
                Event::Step(r) => {
                    self.finish_step(r);
                    self.step(r)?;
                }
            }
            self.wake_idle();
        }
        Ok(self.result(wall.elapsed().as_secs_f64()))
    }

    fn wake_idle(&mut self) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        for r in 0..self.replicas.len() {
            if !self.replicas[r].busy {
                self.replicas[r].busy = true;
                self.push(self.now, Event::Step(r));
            }
        }
    }

    /// Starts a new program, or a rollout group of them, with their first
    /// requests.
    fn spawn_group(&mut self) {
        let size = self.cfg.workload.group_size;
        if size <= 1 {
            return self.spawn(None);
        }
        let g = self.next_group;
        self.next_group += 1;
        self.groups.insert(
            g,
            GroupRun {
                started: self.now,
                live: size,
            },
        );
        for _ in 0..size {
            self.spawn(Some(g));
        }
    }

    /// Starts a new program (a member of `group`) with its first request.
    fn spawn(&mut self, group: Option<u64>) {
        let id = ProgramId(self.next_program);
        self.next_program += 1;
        let mut rng =
            ChaCha8Rng::seed_from_u64(self.cfg.seed ^ id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let w = &self.cfg.workload;
        let turns_left = uniform(&mut rng, w.steps);
        let task = uniform(&mut rng, w.task_tokens);
        let mut prog = Prog {
            rng,
            context: self.system.clone(),
            next_token: 0,
            turns_left,
            gen_target: 0,
            generated: 0,
            request_arrived: self.now,
            ever_computed: 0,
            turns_done: 0,
            group,
        };
        match group {
            // The members' common task: the group's own token stream.
            Some(g) => {
                let task = uniform(&mut group_rng(self.cfg.seed, g), w.task_tokens);
                for i in 0..task as u64 {
                    prog.context.push(token_at(GROUP_STREAMS + g, i));
                }
            }
            None => append_tokens(&mut prog, id, task),
        }
        // `new` refuses a stationary start with groups: `group` is None here.
        if self.cfg.stationary_start && id.0 < self.cfg.concurrency as u64 {
            join_mid_history(&mut prog, id, w);
        }
        self.programs.insert(id, prog);
        self.request(id);
    }

    /// A tool returned: append its output and send the next request, or end
    /// the program when its next prompt would not fit the model's window.
    fn next_turn(&mut self, p: ProgramId) {
        let w = self.cfg.workload.clone();
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        let n = w.tool_tokens.sample(&mut prog.rng) as usize;
        if prog.turns_left == 0 || w.ends_before(prog.context.len(), n) {
            let group = self.programs.get(&p).and_then(|q| q.group);
            self.terminate(p);
            self.metrics.programs_completed += u64::from(self.metrics.in_window(self.now));
            match group {
                None => self.spawn(None),
                Some(g) => self.member_ended(g),
            }
            return;
        }
        append_tokens(prog, p, n);
        self.request(p);
    }

    fn request(&mut self, p: ProgramId) {
        let now = self.now;
        let gen = self.cfg.workload.gen_tokens;
        let Some(prog) = self.programs.get_mut(&p) else {
            return;
        };
        prog.turns_left = prog.turns_left.saturating_sub(1);
        prog.gen_target = uniform(&mut prog.rng, gen);
        prog.generated = 0;
        prog.request_arrived = now;
        self.dirty = true;
        if let Some(st) = self.core.on_request(p, now, &SimCtx(&self.programs)) {
            self.record_start(&st);
        }
    }

    /// A member of group `g` ended; the last one replaces the group.
    fn member_ended(&mut self, g: u64) {
        let Some(run) = self.groups.get_mut(&g) else {
            return;
        };
        run.live = run.live.saturating_sub(1);
        if run.live > 0 {
            return;
        }
        let started = run.started;
        self.groups.remove(&g);
        if self.metrics.in_window(started) {
            self.metrics.group_makespans.push(self.now - started);
        }
        self.spawn_group();
    }

    /// Counts a (re)start's prefix match against what an unlimited cache
    /// would have hit.
    pub(crate) fn record_start(&mut self, st: &Started) {
        let system_tokens = if self.system_seen {
            self.system.len()
        } else {
            0
        };
        let Some(prog) = self.programs.get(&st.program) else {
            return;
        };
        let len = st.context_tokens;
        let ideal = prog
            .ever_computed
            .max(system_tokens)
            .min(len.saturating_sub(1));
        let cached = st.matched.cached_tokens;
        if self.metrics.in_window(self.now) {
            self.metrics.query_tokens += len as u64;
            self.metrics.hit_tokens += cached as u64;
            self.metrics.ideal_hit_tokens += ideal as u64;
            self.metrics.recomputed_tokens += ideal.saturating_sub(cached) as u64;
        }
    }

    pub(crate) fn terminate(&mut self, p: ProgramId) {
        self.core.terminate(p);
        self.programs.remove(&p);
    }

    /// Completes the requests that produced their last token in the step that
    /// just ended.
    fn finish_step(&mut self, r: usize) {
        let done = std::mem::take(&mut self.replicas[r].finishing);
        self.dirty |= !done.is_empty();
        for p in done {
            let now = self.now;
            let in_window = self.metrics.in_window(now);
            let Some(prog) = self.programs.get_mut(&p) else {
                continue;
            };
            let len = prog.context.len();
            let latency = now - prog.request_arrived;
            let (named, tool) = self.cfg.workload.sample_tool(&mut prog.rng);
            if in_window {
                self.metrics.steps += 1;
                self.metrics.latencies.push(latency);
                if prog.turns_done == 0 {
                    self.metrics.first_latencies.push(latency);
                }
            }
            prog.turns_done += 1;
            self.core.finish_request(p, now, len);
            if let Some(i) = named {
                self.core.note_tool(p, ToolId(i as u64), now);
            }
            self.push(now + tool, Event::ToolDone(p.0));
        }
    }

    pub(crate) fn note_computed(&mut self, p: ProgramId, r: usize) {
        let c = self.core.kv(r).num_computed(p);
        if let Some(prog) = self.programs.get_mut(&p) {
            prog.ever_computed = prog.ever_computed.max(c);
            if c >= self.system.len() {
                self.system_seen = true;
            }
        }
    }

    fn result(&self, wall_s: f64) -> RunResult {
        let m = &self.metrics;
        let window_min = ((self.cfg.duration_s - self.cfg.warmup_s) / 60.0).max(1e-9);
        let stats = self.core.policy.stats();
        let pauses = self.core.stats().pauses;
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        RunResult {
            policy: self.cfg.scheduler.policy.to_string(),
            workload: self.cfg.workload.name.clone(),
            concurrency: self.cfg.concurrency,
            replicas: self.cfg.replicas,
            steps_per_min: m.steps as f64 / window_min,
            prefix_hit_rate: ratio(m.hit_tokens, m.query_tokens),
            ideal_hit_rate: ratio(m.ideal_hit_tokens, m.query_tokens),
            recomputed_tokens: m.recomputed_tokens,
            pauses: pauses.total() - pauses.of(PauseCause::Exhaustion),
            restores: stats.restores,
            preemptions: pauses.of(PauseCause::Exhaustion),
            park_keep: stats.parks.of(Park::Keep),
            park_swap: stats.parks.of(Park::Swap),
            park_recompute: stats.parks.of(Park::Recompute),
            kv_imbalance: m.kv_imbalance(),
            sched_us_per_step: m.sched_ns as f64 / 1000.0 / m.sched_calls.max(1) as f64,
            output_tok_s: m.output_tokens as f64 / (window_min * 60.0),
            p50_step_s: m.percentile(0.5),
            p99_step_s: m.percentile(0.99),
            max_step_s: percentile(&m.latencies, 1.0),
            first_p50_s: percentile(&m.first_latencies, 0.5),
            first_max_s: percentile(&m.first_latencies, 1.0),
            groups_completed: m.group_makespans.len() as u64,
            group_makespan_p50_s: percentile(&m.group_makespans, 0.5),
            group_makespan_max_s: percentile(&m.group_makespans, 1.0),
            programs_completed: m.programs_completed,
            engine_steps: m.engine_steps,
            mean_kv_usage: m.mean_usage(),
            kv_tokens: self.cfg.kv_tokens,
            host_kv_tokens: self.cfg.host_kv_tokens,
            copied_tokens: m.copied_tokens,
            duration_s: self.cfg.duration_s,
            wall_s,
        }
    }
}

/// Token streams of groups' shared tasks (programs use streams 1..).
const GROUP_STREAMS: u64 = 1 << 40;

fn group_rng(seed: u64, g: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ (GROUP_STREAMS + g).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A program of the first cohort under a stationary start (as `agentd
/// bench --stationary-start` sends it): it joins at a turn uniform over its
/// plan, the turns before it (generated tokens, then the tool's output) in
/// its first prompt as history that no cache holds. Without it all N
/// programs start at turn 0 as one cohort and a window an hour in still
/// sees its rhythm: `long` at 96 programs, cpu-avx2, seeds 2-3, the request
/// policy read 108 steps/min against the program policy's 130 after a
/// cohort start and 129 against 129 after this one, the start the engine's
/// paired cells run (benches/results/sim-stationary-start).
fn join_mid_history(prog: &mut Prog, p: ProgramId, w: &Workload) {
    let join = prog.rng.gen_range(0..prog.turns_left.max(1));
    for _ in 0..join {
        let gen = uniform(&mut prog.rng, w.gen_tokens);
        let tool = w.tool_tokens.sample(&mut prog.rng) as usize;
        // The history stops where `next_turn` would end the program.
        if w.ends_before(prog.context.len() + gen, tool) {
            break;
        }
        append_tokens(prog, p, gen + tool);
        prog.turns_left = prog.turns_left.saturating_sub(1);
    }
}

/// Appends `n` fresh tokens of `p`'s own stream to its context.
pub(crate) fn append_tokens(prog: &mut Prog, p: ProgramId, n: usize) {
    for _ in 0..n {
        prog.context.push(token_at(p.0 + 1, prog.next_token));
        prog.next_token += 1;
    }
}
