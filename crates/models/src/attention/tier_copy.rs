//! The host tier's copies beside the forward (issue 32 item 5).
//!
//! A step's copies (blocks evicted to the host tier, blocks restored from
//! it) used to run whole before the forward. Each layer's copies only
//! have to finish before the forward reaches that layer: it reads and
//! writes nothing else of the cache there. So a copy thread takes every
//! layer's storage out of the device cache, carries out the copies layer by
//! layer in the allocator's order, and hands each layer back over a
//! channel; the forward takes layer `l` back just before computing it.
//! Layer 0's copies still come first; the rest overlap the layers before
//! them (a copy is a `memcpy` at memory bandwidth, a layer mostly matmuls).
//!
//! Nothing here is `unsafe`: a layer's storage (two `Vec`s) is owned by
//! one thread at a time and moved, never shared. The copies are checked
//! against both caches before any layer leaves the cache, so carrying them
//! out cannot fail half way, and every layer is back in the cache when
//! [`beside`] returns, whether the forward succeeded or not.

use std::sync::{mpsc, Mutex};

use agentd_kv::BlockCopy;

use super::cache::{KvCacheConfig, LayerKv, PagedKvCache};
use crate::error::{ModelError, Result};

/// One block's run of K (and of V) in one layer: where it starts on the
/// device and in the host tier, and which way it goes.
#[derive(Debug, Clone, Copy)]
struct Run {
    to_host: bool,
    device: usize,
    host: usize,
}

/// A step's tier copies, checked against both caches.
#[derive(Debug)]
pub(crate) struct TierCopies {
    runs: Vec<Run>,
    /// Floats of K (or V) of one block in one layer.
    len: usize,
}

impl TierCopies {
    /// Checks `copies` between `device` and `host` (same geometry but for
    /// the number of blocks, ids in range, neither released).
    pub(crate) fn plan(
        device: &PagedKvCache,
        host: &PagedKvCache,
        copies: &[BlockCopy],
    ) -> Result<Self> {
        let (d, h) = (*device.config(), *host.config());
        if (KvCacheConfig {
            num_blocks: d.num_blocks,
            ..h
        }) != d
        {
            return Err(ModelError::CacheMismatch(format!(
                "copy between caches of different geometry: {h:?} vs {d:?}"
            )));
        }
        if device.is_released() || host.is_released() {
            return Err(ModelError::CacheMismatch(
                "a tier copy while the cache's memory is released".into(),
            ));
        }
        let runs = copies
            .iter()
            .map(|c| {
                let (to_host, dev, slot) = match *c {
                    BlockCopy::Offload { device: b, host: s } => (true, b.0, s),
                    BlockCopy::Onload { host: s, device: b } => (false, b.0, s),
                };
                Ok(Run {
                    to_host,
                    device: device.block_start(dev)?,
                    host: host.block_start(slot)?,
                })
            })
            .collect::<Result<_>>()?;
        let len = d.block_len();
        Ok(TierCopies { runs, len })
    }

    /// Carries out the copies in every layer, one layer after the other
    /// (`StepRunner::copy_blocks`: no forward to overlap).
    pub(crate) fn apply_all(&self, device: &mut PagedKvCache, host: &mut PagedKvCache) {
        for (d, h) in device.layers_mut().iter_mut().zip(host.layers_mut()) {
            self.apply(d, h);
        }
    }

    /// Carries out the copies in one layer, in order (an eviction before a
    /// restore into the block it freed).
    fn apply(&self, device: &mut LayerKv, host: &mut LayerKv) {
        let n = self.len;
        for r in &self.runs {
            let (d, h) = (r.device..r.device + n, r.host..r.host + n);
            if r.to_host {
                host.k[h.clone()].copy_from_slice(&device.k[d.clone()]);
                host.v[h].copy_from_slice(&device.v[d]);
            } else {
                device.k[d.clone()].copy_from_slice(&host.k[h.clone()]);
                device.v[d].copy_from_slice(&host.v[h]);
            }
        }
    }
}

/// What the forward calls before computing layer `l`: it puts the layer's
/// storage back into the cache once its copies are done.
pub(crate) type BeforeLayer<'a> = dyn FnMut(usize, &mut PagedKvCache) -> Result<()> + Send + 'a;

/// Runs `forward` on `device` while a copy thread carries out `copies`
/// layer by layer (see the module docs). `forward` must call the hook it
/// is given before it touches layer `l`, for each layer in order.
pub(crate) fn beside<T>(
    device: &mut PagedKvCache,
    host: &mut PagedKvCache,
    copies: &TierCopies,
    forward: impl FnOnce(&mut PagedKvCache, &mut BeforeLayer<'_>) -> Result<T>,
) -> Result<T> {
    // Taken by the copy thread once it runs: if it cannot start, they are
    // still here to put back.
    let parked = Mutex::new(device.take_layers());
    let (tx, mut rx) = mpsc::channel::<(usize, LayerKv)>();
    let out = std::thread::scope(|s| {
        let (host_layers, parked) = (host.layers_mut(), &parked);
        std::thread::Builder::new()
            .name("agentd-kv-copy".into())
            .spawn_scoped(s, move || {
                let layers = std::mem::take(&mut *parked.lock().unwrap_or_else(|e| e.into_inner()));
                for (l, (mut dev, h)) in layers.into_iter().zip(host_layers).enumerate() {
                    copies.apply(&mut dev, h);
                    // The receiver outlives this thread: a send cannot fail.
                    let _ = tx.send((l, dev));
                }
            })
            .map_err(|e| ModelError::Backend {
                backend: "cpu",
                message: format!("the KV copy thread: {e}"),
            })?;
        let arrivals = &mut rx;
        let mut before = move |l: usize, cache: &mut PagedKvCache| match arrivals.recv() {
            Ok((got, kv)) if got == l => {
                cache.put_layer(got, kv);
                Ok(())
            }
            Ok((got, kv)) => {
                cache.put_layer(got, kv);
                Err(ModelError::Backend {
                    backend: "cpu",
                    message: format!("layer {l} computed before layer {got} came back"),
                })
            }
            Err(_) => Err(ModelError::Backend {
                backend: "cpu",
                message: format!("the KV copy thread ended before layer {l}"),
            }),
        };
        forward(device, &mut before)
    });
    // The layers the forward did not reach (it stopped early): every one
    // was sent before the scope joined the thread. Or none left, when the
    // thread could not start.
    for (l, kv) in rx.try_iter() {
        device.put_layer(l, kv);
    }
    let unsent = parked.into_inner().unwrap_or_else(|e| e.into_inner());
    for (l, kv) in unsent.into_iter().enumerate() {
        device.put_layer(l, kv);
    }
    out
}
