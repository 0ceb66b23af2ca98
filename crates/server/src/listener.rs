//! The accept loop: hyper's HTTP/1 connection settings and a cap on open
//! connections, so slow or silent clients cannot exhaust the server.
//!
//! - `header_read_timeout` (hyper) closes a connection whose request head
//!   does not arrive in time. hyper starts that timer whenever it waits for
//!   a head, also between requests of a keep-alive connection, so the same
//!   setting is the idle keep-alive timeout.
//! - At `max_connections` the loop stops accepting (back-pressure): new
//!   connections wait in the kernel's listen backlog instead of taking file
//!   descriptors, and are accepted as others close.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// After a failed accept (EMFILE, ENFILE, ECONNABORTED): retrying at once
/// would spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// File descriptors kept for everything but client connections (model
/// files, tool processes' pipes, the Docker socket, logs).
const RESERVED_FDS: u64 = 256;

/// Connection limits (`agentd serve --header-read-timeout-s`,
/// `--max-connections`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// For a request head to arrive, and for the next one on an idle
    /// keep-alive connection.
    pub header_read_timeout: Duration,
    /// Open connections at once; clamped to the process's fd limit.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            // Clients send a head in one write; 15 s covers a slow link and
            // frees a silent connection's fd quickly (uvicorn, behind vLLM,
            // closes idle keep-alive connections after 5 s).
            header_read_timeout: Duration::from_secs(15),
            max_connections: 4096,
        }
    }
}

impl ConnectionLimits {
    /// `max_connections`, lowered to leave [`RESERVED_FDS`] of the soft
    /// `RLIMIT_NOFILE` free.
    pub fn effective_max_connections(&self) -> usize {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
        let fds = if ok && lim.rlim_cur != libc::RLIM_INFINITY {
            usize::try_from(lim.rlim_cur.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX)
        } else {
            usize::MAX
        };
        self.max_connections.min(fds).max(1)
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the
/// open connections to finish their requests.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let max = limits.effective_max_connections();
    tracing::info!(
        max_connections = max,
        header_read_timeout_s = limits.header_read_timeout.as_secs_f64(),
        "accepting connections"
    );
    let permits = Arc::new(Semaphore::new(max));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break, // closed: never, the semaphore lives here
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // Timeouts, resets and malformed heads end up here.
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
