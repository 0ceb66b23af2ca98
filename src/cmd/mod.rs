//! One module per subcommand.

pub mod banner;
pub mod bench;
pub mod bench_model;
pub mod bench_rollout;
pub mod cpu;
pub mod default_model;
pub mod device;
pub mod dtype;
pub mod generate;
pub mod generation;
pub mod host_tier;
pub mod kv_events;
pub mod kv_size;
pub mod make_model;
pub mod model_arg;
pub mod scheduler_args;
pub mod serve;
pub mod simulate;
pub mod telemetry;
pub mod vllm_flags;
pub mod workload_args;
