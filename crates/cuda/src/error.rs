//! Errors of the CUDA backend.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    /// No usable GPU: the driver library is missing or reports no device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA driver call failed (launch, allocation, copy, module load).
    #[error("CUDA driver error in {op}: {msg}")]
    Driver { op: String, msg: String },
    /// A cuBLAS call failed.
    #[error("cuBLAS error in {op}: {msg}")]
    Blas { op: String, msg: String },
    /// The model or batch has a shape these kernels do not handle.
    #[error("unsupported on the CUDA backend: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Model(#[from] agentd_runtime::ModelError),
}

pub type Result<T> = std::result::Result<T, CudaError>;
