//! Giving the CPU runner's memory back to the system (the regions are
//! [`agentd_runtime::MemoryTags`]), and asking it for huge pages for the KV
//! pool.

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

/// Huge pages (2 MiB) asked for the whole 2 MiB-aligned pages inside
/// `buf`, before it is first written: the KV pool is read in runs of one
/// block per KV head (4-8 KiB) at block ids the allocator scatters over
/// gigabytes, so with 4 KiB pages nearly every run of a decode step costs
/// a TLB miss and a page walk. Random 4 KiB reads over 1 GiB on an AMD
/// EPYC (Zen 4), 2 threads: 12.0 GB/s on 4 KiB pages, 16.2 on
/// huge pages (sequential reads: 35 GB/s); `agentd bench-model` decode,
/// 32 x 4,096 tokens, 171.3 -> 195.1 tok/s with them
/// (`benches/results/attention-decode-AMD-EPYC`). Transparent huge pages are
/// `madvise`-only on these machines, so nothing else turns them on. Costs
/// that a lazily mapped pool takes memory in 2 MiB steps as it is first
/// written, not 4 KiB ones. A hint: where the kernel refuses it (no THP,
/// another OS) nothing changes.
pub(crate) fn advise_huge_pages(buf: &mut [f32]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buf.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(buf);
        let (lo, hi) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if hi > lo {
            // SAFETY: [lo, hi) lies inside `buf`, which this call borrows
            // mutably; MADV_HUGEPAGE changes how its pages are backed, never
            // their contents, and its failure is harmless (ignored).
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}
