//! One module per subcommand.

pub mod bench;
pub mod bench_model;
pub mod device;
pub mod dtype;
pub mod generate;
pub mod kv_events;
pub mod make_model;
pub mod scheduler_args;
pub mod serve;
pub mod simulate;
