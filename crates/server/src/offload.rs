//! CPU-heavy request work — chat-template rendering, tokenization of long
//! prompts, detokenization of long token lists — runs on tokio's blocking
//! pool, never on the runtime's worker threads: a 100k-token prompt takes
//! ~100 ms to tokenize, which on a worker thread would stall every socket
//! that thread serves. At most one job per core runs at once (like TGI's
//! tokenizer workers); the rest wait asynchronously for a slot.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

use crate::ApiError;

fn slots() -> Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            Arc::new(Semaphore::new(cores))
        })
        .clone()
}

/// Runs `f` on the blocking pool once a CPU slot is free.
pub async fn run<T, F>(f: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let permit = slots()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::Unavailable("the server is shutting down".into()))?;
    let job = tokio::task::spawn_blocking(move || {
        let _slot = permit;
        f()
    });
    match job.await {
        Ok(r) => r,
        Err(e) => Err(ApiError::Internal(format!(
            "request preparation failed: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn work_runs_off_the_runtime_thread() {
        let runtime_thread = std::thread::current().id();
        let ran_on = run(|| Ok(std::thread::current().id())).await.unwrap();
        assert_ne!(ran_on, runtime_thread);
        let err = run(|| -> Result<(), ApiError> { Err(ApiError::invalid("x", "bad")) }).await;
        assert!(matches!(err, Err(ApiError::InvalidParam { .. })));
    }
}
