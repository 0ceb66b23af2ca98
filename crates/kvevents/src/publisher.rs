//! One replica's ZMQ publisher: PUB for the live stream, ROUTER for replay,
//! both on a thread of their own so the engine only pays a channel send.
//!
//! Multipart messages exactly as vLLM's `ZmqEventPublisher` sends them:
//! `[topic, seq (8-byte big-endian), payload]`. A replay request is
//! `[identity, "", start_seq]`; the answer is every buffered batch with
//! `seq >= start_seq` as `[identity, "", topic, seq, payload]`, then the end
//! marker `[identity, "", "", -1 (8 bytes), ""]`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use agentd_kv::KvEvent;
use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::config::{endpoint_for_rank, is_bind, KvEventsConfig};
use crate::wire::{coalesce, encode_batch};
use crate::Error;

/// vLLM's end-of-replay marker: sequence number -1.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

struct Batch {
    seq: u64,
    ts: f64,
    events: Vec<KvEvent>,
}

/// Publishes one replica's KV events as data-parallel rank `rank`.
pub struct Publisher {
    tx: Option<mpsc::Sender<Batch>>,
    next_seq: AtomicU64,
    dropped: AtomicU64,
    endpoint: String,
    replay_endpoint: Option<String>,
    thread: Option<JoinHandle<()>>,
}

/// What the publisher thread needs, fixed at start.
struct Setup {
    topic: Bytes,
    block_size: usize,
    rank: u32,
    buffer_steps: usize,
}

impl Publisher {
    /// Opens the sockets (the port of `cfg.endpoint` plus `rank`, like vLLM)
    /// and starts the publisher thread. Fails if a socket cannot be opened.
    pub fn start(cfg: &KvEventsConfig, rank: usize, block_size: usize) -> Result<Self, Error> {
        let endpoint = endpoint_for_rank(&cfg.endpoint, rank)?;
        let replay = match &cfg.replay_endpoint {
            Some(r) => Some(endpoint_for_rank(r, rank)?),
            None => None,
        };
        let setup = Setup {
            topic: Bytes::from(cfg.topic.clone().into_bytes()),
            block_size,
            rank: u32::try_from(rank).map_err(|_| Error::Config("rank too large".into()))?,
            buffer_steps: cfg.buffer_steps,
        };
        let (tx, rx) = mpsc::channel(cfg.max_queue_size);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("agentd-kvevents-r{rank}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Io(e.to_string())));
                        return;
                    }
                };
                rt.block_on(async move {
                    match open(&endpoint, replay.as_deref()).await {
                        Ok((pubs, router, bound)) => {
                            let _ = ready_tx.send(Ok(bound));
                            serve(setup, rx, pubs, router).await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|e| Error::Io(e.to_string()))?;
        let (endpoint, replay_endpoint) = ready_rx
            .recv()
            .map_err(|_| Error::Io("publisher thread died".into()))??;
        info!(rank, %endpoint, replay = ?replay_endpoint, "KV events publisher started");
        Ok(Self {
            tx: Some(tx),
            next_seq: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            endpoint,
            replay_endpoint,
            thread: Some(thread),
        })
    }

    /// The PUB endpoint as bound or connected (a port 0 resolved).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }
    /// Batches dropped because the queue to the publisher thread was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Queues one step's events; never blocks. The sequence number is taken
    /// here, so a batch dropped on a full queue shows as a gap to subscribers.
    pub fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let Some(tx) = &self.tx else { return };
        if tx.try_send(Batch { seq, ts, events }).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            warn!(seq, dropped = n, "KV events queue full; batch dropped");
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Closing the channel lets the thread publish what is queued and exit.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Opened = (PubSocket, Option<RouterSocket>, (String, Option<String>));

async fn open(endpoint: &str, replay: Option<&str>) -> Result<Opened, Error> {
    let zerr = |what: &str, e: zeromq::ZmqError| Error::Io(format!("{what}: {e}"));
    let mut pubs = PubSocket::new();
    let bound = if is_bind(endpoint) {
        let ep = pubs
            .bind(&wildcard_to_any(endpoint))
            .await
            .map_err(|e| zerr(endpoint, e))?;
        ep.to_string()
    } else {
        pubs.connect(endpoint)
            .await
            .map_err(|e| zerr(endpoint, e))?;
        endpoint.to_string()
    };
    let (router, replay_bound) = match replay {
        Some(r) => {
            let mut s = RouterSocket::new();
            let ep = s.bind(&wildcard_to_any(r)).await.map_err(|e| zerr(r, e))?;
            (Some(s), Some(ep.to_string()))
        }
        None => (None, None),
    };
    Ok((pubs, router, (bound, replay_bound)))
}

/// ZMQ's `*` host means every interface.
fn wildcard_to_any(endpoint: &str) -> String {
    endpoint.replacen("//*:", "//0.0.0.0:", 1)
}

async fn serve(
    setup: Setup,
    mut rx: mpsc::Receiver<Batch>,
    mut pubs: PubSocket,
    mut router: Option<RouterSocket>,
) {
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::with_capacity(setup.buffer_steps.min(4096));
    loop {
        tokio::select! {
            batch = rx.recv() => {
                let Some(b) = batch else { break };
                let payload = Bytes::from(encode_batch(b.ts, &coalesce(b.events), setup.block_size, setup.rank));
                let seq = Bytes::copy_from_slice(&b.seq.to_be_bytes());
                let msg = frames(vec![setup.topic.clone(), seq, payload.clone()]);
                if let Err(e) = pubs.send(msg).await {
                    warn!(seq = b.seq, error = %e, "KV events publish failed");
                }
                if buffer.len() == setup.buffer_steps {
                    buffer.pop_front();
                }
                buffer.push_back((b.seq, payload));
            }
            req = recv_replay(&mut router) => match req {
                Ok(msg) => replay(&setup, &buffer, router.as_mut(), msg).await,
                Err(e) => debug!(error = %e, "replay socket receive failed"),
            },
        }
    }
}

/// Waits for a replay request, forever when there is no replay socket.
async fn recv_replay(router: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match router {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn replay(
    setup: &Setup,
    buffer: &VecDeque<(u64, Bytes)>,
    router: Option<&mut RouterSocket>,
    msg: ZmqMessage,
) {
    let Some(router) = router else { return };
    let f = msg.into_vec();
    let start = match f.as_slice() {
        [_, empty, seq] if empty.is_empty() => <[u8; 8]>::try_from(seq.as_ref()).ok(),
        _ => None,
    };
    let Some(start) = start.map(u64::from_be_bytes) else {
        warn!(frames = f.len(), "invalid KV events replay request");
        return;
    };
    let id = f[0].clone();
    let empty = Bytes::new();
    for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
        let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
        let m = frames(vec![
            id.clone(),
            empty.clone(),
            setup.topic.clone(),
            seq,
            payload.clone(),
        ]);
        if router.send(m).await.is_err() {
            return; // the requester left
        }
    }
    let end = frames(vec![
        id,
        empty.clone(),
        empty.clone(),
        Bytes::from_static(&END_SEQ),
        empty,
    ]);
    let _ = router.send(end).await;
}

fn frames(v: Vec<Bytes>) -> ZmqMessage {
    // Never empty here, so the conversion cannot fail.
    ZmqMessage::try_from(v).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}
