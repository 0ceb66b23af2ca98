//! The pluggable part: a backend admits the resources it handles (checks
//! them once, when declared) and reclaims them (when their last owner ends).

use std::future::Future;
use std::pin::Pin;

use crate::error::ToolError;
use crate::resource::Resource;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait Backend: Send + Sync {
    /// For logs and errors.
    fn name(&self) -> &'static str;

    /// Whether `r` is this backend's to admit and reclaim.
    fn handles(&self, r: &Resource) -> bool;

    /// Checks a declared resource and returns it in the form it will be
    /// reclaimed by (a canonical path, a pid resolved to its group). Refuses
    /// what the backend must never touch.
    fn admit(&self, r: Resource) -> Result<Resource, ToolError>;

    /// Frees `r`. Something already gone counts as reclaimed.
    fn reclaim<'a>(&'a self, r: &'a Resource) -> BoxFuture<'a, Result<(), ToolError>>;
}
