//! What the RL trainer surfaces (SGLang's native routes, vLLM's tokenizer
//! and dev-mode routes: `routes::sglang`, `routes::tokenize`) keep beside
//! the engine: the weight version, the `rid`s of requests in flight (for
//! `/abort_request`), where the weights came from and how to load new ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use agentd_engine::AbortHandle;

use crate::error::ApiError;

/// SGLang's `--weight-version` default.
pub const DEFAULT_WEIGHT_VERSION: &str = "default";

pub struct RlState {
    weight_version: Mutex<String>,
    /// Where the serving weights were loaded from (`/model_info`'s
    /// `model_path`; a weight update changes it).
    model_path: Mutex<String>,
    /// Requests in flight by `rid`: each engine request of the request.
    rids: Mutex<HashMap<String, Vec<AbortHandle>>>,
    /// vLLM's weight-update session (`/start_weight_update` to
    /// `/finish_weight_update`, `routes::vllm_weights`): `None` outside
    /// one, else whether a checkpoint was loaded in it.
    weight_session: Mutex<Option<bool>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RlState {
    pub fn new(model_path: String) -> Self {
        RlState {
            weight_version: Mutex::new(DEFAULT_WEIGHT_VERSION.to_string()),
            model_path: Mutex::new(model_path),
            rids: Mutex::new(HashMap::new()),
            weight_session: Mutex::new(None),
        }
    }

    pub fn weight_version(&self) -> String {
        locked(&self.weight_version).clone()
    }

    pub fn set_weight_version(&self, v: String) {
        *locked(&self.weight_version) = v;
    }

    pub fn model_path(&self) -> String {
        locked(&self.model_path).clone()
    }

    pub fn set_model_path(&self, p: String) {
        *locked(&self.model_path) = p;
    }

    /// vLLM's weight-update session, locked (never across an await).
    pub fn weight_session(&self) -> MutexGuard<'_, Option<bool>> {
        locked(&self.weight_session)
    }

    /// Registers the engine requests of `rid`; a `rid` already in flight is
    /// a 400 (SGLang refuses duplicate request ids). The guard unregisters.
    pub fn register(
        self: &Arc<Self>,
        rid: &str,
        handles: Vec<AbortHandle>,
    ) -> Result<RidGuard, ApiError> {
        let mut map = locked(&self.rids);
        if map.contains_key(rid) {
            return Err(ApiError::invalid(
                "rid",
                format!("Duplicate request ID detected: {rid} is already in flight"),
            ));
        }
        map.insert(rid.to_string(), handles);
        Ok(RidGuard {
            rl: self.clone(),
            rid: rid.to_string(),
        })
    }

    /// Cancels the requests of `rid`; false when none is in flight.
    pub fn abort(&self, rid: &str) -> bool {
        let map = locked(&self.rids);
        let Some(handles) = map.get(rid) else {
            return false;
        };
        for h in handles {
            h.abort();
        }
        true
    }
}

/// Unregisters a `rid` when its response is done (or dropped).
pub struct RidGuard {
    rl: Arc<RlState>,
    rid: String,
}

impl Drop for RidGuard {
    fn drop(&mut self) {
        locked(&self.rl.rids).remove(&self.rid);
    }
}
