//! SGLang's native HTTP surface, as RL trainers drive it (slime, AReaL,
//! verl's SGLang adapter; issue 31): `/generate` ([`generate`]) and the
//! control routes between rollouts ([`control`]: pause / continue, abort,
//! flush, weight updates and versions, model and server info, health;
//! [`memory`]: releasing and resuming the KV pool and the weights).
//! Requests, bodies and status codes follow SGLang's `http_server.py` and
//! `io_struct.py`; every route sits behind `--api-key` like the others.

pub mod control;
pub mod generate;
pub mod logprobs;
pub mod memory;
pub mod request;
