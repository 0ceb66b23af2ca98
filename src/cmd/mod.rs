//! One module per subcommand.

pub mod scheduler_args;
pub mod simulate;
