//! Giving the CPU runner's memory back to the system (the regions are
//! [`agentd_runtime::MemoryTags`]).

pub use agentd_runtime::memory::MemoryTags;

/// Returns the allocator's free memory to the system. Buffers of a
/// released pool or model above glibc's mmap threshold (128 KiB, raised
/// up to 32 MiB after such frees) are unmapped when dropped; smaller ones
/// (a tiny model's per-layer tensors, a small pool's layers) go back to
/// the arenas, where only `malloc_trim` hands their pages to the kernel
/// (`MADV_DONTNEED` on every free page of every arena, glibc >= 2.8).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's
    // own arenas; no live allocation is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}
