//! What a rollout iteration sends: G groups of n samples; the samples of a
//! group share the system prompt and the task (GRPO's n samples of one
//! prompt), and each has its own turns, tool outputs and tool times.
//! Everything is a pure function of (seed, iteration, group, sample).

use crate::workload::{BenchWorkload, ProgramPlan};

/// The stream of a group's task (`sample` None) or of one sample:
/// distinct per (seed, iteration, group, sample), so no iteration hits
/// another's cached contexts (a swap flushes the cache anyway).
pub fn rollout_stream(seed: u64, iteration: usize, group: usize, sample: Option<usize>) -> u64 {
    // A tag keeps these streams apart from `program_stream`'s.
    const TAG: u64 = 0x0072_6f6c_6c6f_7574; // "rollout" in ASCII
    let sample = sample.map_or(0, |s| s as u64 + 1);
    let bytes = [
        TAG.to_le_bytes(),
        seed.to_le_bytes(),
        (iteration as u64).to_le_bytes(),
        (group as u64).to_le_bytes(),
        sample.to_le_bytes(),
    ]
    .concat();
    // Stream 0 is the shared system prompt.
    xxhash_rust::xxh3::xxh3_64(&bytes).max(1)
}

/// One sample (program) of an iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplePlan {
    pub group: usize,
    pub sample: usize,
    pub plan: ProgramPlan,
}

/// The G x n samples of iteration `iteration`, group by group.
pub fn iteration_plan(
    w: &BenchWorkload,
    seed: u64,
    iteration: usize,
    groups: usize,
    group_size: usize,
) -> Vec<SamplePlan> {
    let mut out = Vec::with_capacity(groups * group_size);
    for g in 0..groups {
        let task_plan = w.plan(rollout_stream(seed, iteration, g, None));
        let task = task_plan.turns.first().map(|t| t.appended.as_slice());
        for s in 0..group_size {
            let stream = rollout_stream(seed, iteration, g, Some(s));
            out.push(SamplePlan {
                group: g,
                sample: s,
                plan: w.plan_with_task(stream, task),
            });
        }
    }
    out
}

/// The sampling seed of one turn of one sample: samples of a group differ,
/// and a rerun draws the same tokens. Below 2^31 (vLLM takes an int).
pub fn sampling_seed(stream: u64, turn: usize) -> u64 {
    (stream ^ (turn as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) & 0x7fff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::{Count, ToolTime};

    fn small() -> BenchWorkload {
        let mut w: BenchWorkload = "swe".parse().unwrap();
        w.system_tokens = 32;
        w.task_tokens = Count::Uniform(10, 30);
        w.turns = Count::Uniform(2, 6);
        w.tool_tokens = Count::Uniform(5, 9);
        w.output_tokens = Count::Uniform(3, 7);
        w.tool_time = ToolTime::Fixed(0.5);
        w
    }

    #[test]
    fn groups_share_their_task_and_nothing_else() {
        let w = small();
        let plans = iteration_plan(&w, 1, 0, 3, 4);
        assert_eq!(plans.len(), 12);
        for g in 0..3 {
            let members: Vec<&SamplePlan> = plans.iter().filter(|p| p.group == g).collect();
            assert_eq!(members.len(), 4);
            assert_eq!(
                members.iter().map(|p| p.sample).collect::<Vec<_>>(),
                [0, 1, 2, 3]
            );
            let task = &members[0].plan.turns[0].appended;
            assert!((10..=30).contains(&task.len()));
            for m in &members[1..] {
                assert_eq!(&m.plan.turns[0].appended, task, "group {g} shares its task");
                assert_ne!(m.plan.stream, members[0].plan.stream);
                // Tool outputs are the sample's own.
                assert_ne!(m.plan.turns[1].appended, members[0].plan.turns[1].appended);
            }
        }
        // Groups differ from each other.
        assert_ne!(
            plans[0].plan.turns[0].appended,
            plans[4].plan.turns[0].appended
        );
        // The samples' turn counts vary (the group's makespan is its slowest).
        let turns: std::collections::BTreeSet<usize> =
            plans.iter().map(|p| p.plan.turns.len()).collect();
        assert!(turns.len() > 1, "{turns:?}");
        for p in &plans {
            assert!((2..=6).contains(&p.plan.turns.len()));
            assert_eq!(p.plan.turns.last().unwrap().tool_time_s, 0.0);
            assert!(p.plan.turns[..p.plan.turns.len() - 1]
                .iter()
                .all(|t| t.tool_time_s == 0.5));
        }
    }

    #[test]
    fn iterations_are_reproducible_and_distinct() {
        let w = small();
        let a = iteration_plan(&w, 1, 0, 2, 2);
        assert_eq!(a, iteration_plan(&w, 1, 0, 2, 2));
        let b = iteration_plan(&w, 1, 1, 2, 2);
        assert_ne!(a[0].plan.turns[0].appended, b[0].plan.turns[0].appended);
        let c = iteration_plan(&w, 2, 0, 2, 2);
        assert_ne!(a[0].plan.turns[0].appended, c[0].plan.turns[0].appended);
        assert_ne!(
            rollout_stream(1, 0, 0, None),
            rollout_stream(1, 0, 0, Some(0))
        );
    }

    #[test]
    fn a_shared_task_respects_the_context_limit() {
        let mut w = small();
        w.turns = Count::Fixed(50);
        w.max_context = 200;
        for p in iteration_plan(&w, 3, 0, 2, 3) {
            let ctx: usize = w.system_tokens
                + p.plan
                    .turns
                    .iter()
                    .map(|t| t.appended.len() + t.output_tokens)
                    .sum::<usize>();
            assert!(ctx <= 200, "{ctx}");
        }
    }

    #[test]
    fn sampling_seeds_differ_by_sample_and_turn() {
        let s0 = rollout_stream(1, 0, 0, Some(0));
        let s1 = rollout_stream(1, 0, 0, Some(1));
        assert_ne!(sampling_seed(s0, 0), sampling_seed(s1, 0));
        assert_ne!(sampling_seed(s0, 0), sampling_seed(s0, 1));
        assert!(sampling_seed(u64::MAX, 7) < 1 << 31);
    }
}
