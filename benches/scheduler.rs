//! The scheduler's decision per engine step with 1,000 programs on 8 replicas
//! (target: < 20 µs), on real KV caches filled as an engine would fill them.
//! Run: `cargo bench --bench scheduler`.

use std::hint::black_box;

use agentd_kv::{KvCache, ProgramId};
use agentd_scheduler::{Policy, ProgramScheduler, Replicas, RequestScheduler, SchedulerConfig};
use criterion::{criterion_group, criterion_main, Criterion};

const REPLICAS: usize = 8;
const PROGRAMS: u64 = 1_000;
const BLOCKS: usize = 54_000; // ≈ 865k tokens of 16: one H100 with Qwen3-8B FP8
const SYSTEM: usize = 2_048;

fn context(i: u64) -> Vec<u32> {
    let len = SYSTEM + 500 + (i as usize * 7_919) % 30_000;
    (0..len as u32)
        .map(|t| {
            if (t as usize) < SYSTEM {
                t
            } else {
                (i as u32) << 16 | (t & 0xffff)
            }
        })
        .collect()
}

/// Admits programs until every replica is full, then makes half of the active
/// programs acting (their tool is running), leaving the rest queued.
fn populate(policy: &mut dyn Policy, kv: &mut [KvCache]) -> f64 {
    let contexts: Vec<Vec<u32>> = (0..PROGRAMS).map(context).collect();
    for (i, c) in contexts.iter().enumerate() {
        policy.on_request(ProgramId(i as u64), 0.0, c.len(), &Replicas(kv, &[]));
    }
    let mut now = 0.0;
    for round in 0..50 {
        now = round as f64 * 0.01;
        let mut admitted = 0;
        for r in 0..REPLICAS {
            let d = policy.schedule(r, now, &Replicas(kv, &[]));
            for (p, to) in d.admit {
                let ctx = &contexts[p.0 as usize];
                let m = kv[to].match_prefix(p, ctx);
                if kv[to]
                    .allocate_slots(p, ctx.len() - m.cached_tokens)
                    .is_ok()
                {
                    let _ = kv[to].commit(p, &ctx[m.cached_tokens..]);
                }
                admitted += 1;
            }
            for (p, _cause) in d.pause {
                kv[r].pause(p);
            }
        }
        if admitted == 0 {
            break;
        }
    }
    for i in (0..PROGRAMS).step_by(2) {
        policy.on_request_finished(ProgramId(i), now, contexts[i as usize].len());
    }
    now
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("schedule_1000_programs_8_replicas");
    for name in ["program", "request"] {
        let mut kv: Vec<KvCache> = (0..REPLICAS).map(|_| KvCache::new(BLOCKS, 16, 0)).collect();
        let cfg = SchedulerConfig::default();
        let mut policy: Box<dyn Policy> = match name {
            "program" => Box::new(ProgramScheduler::new(cfg, REPLICAS)),
            _ => Box::new(RequestScheduler::new(cfg, REPLICAS)),
        };
        let mut now = populate(policy.as_mut(), &mut kv);
        eprintln!(
            "{name}: {} waiting, KV usage {:?}",
            policy.num_waiting(),
            kv.iter()
                .map(|k| (k.usage() * 100.0).round())
                .collect::<Vec<_>>()
        );
        let mut r = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                r = (r + 1) % REPLICAS;
                now += 0.001;
                black_box(policy.schedule(r, now, &Replicas(&kv, &[])))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
