//! Giving a runner's memory back to the system between RL rollouts and
//! taking it again (SGLang's `release_memory_occupation` /
//! `resume_memory_occupation`, vLLM's `/sleep` and `/wake_up`): the KV
//! pool and the weights, each by its tag.

/// Which of a runner's memory regions, by SGLang's tag names
/// (`GPU_MEMORY_TYPE_KV_CACHE`, `GPU_MEMORY_TYPE_WEIGHTS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryTags {
    pub kv_cache: bool,
    pub weights: bool,
}

impl MemoryTags {
    /// Both regions (SGLang's default when no tags are given).
    pub const ALL: MemoryTags = MemoryTags {
        kv_cache: true,
        weights: true,
    };

    /// SGLang's tag for the KV cache.
    pub const KV_CACHE: &'static str = "kv_cache";
    /// SGLang's tag for the weights.
    pub const WEIGHTS: &'static str = "weights";

    pub fn any(self) -> bool {
        self.kv_cache || self.weights
    }

    /// The regions in `self` or in `other`.
    pub fn union(self, other: MemoryTags) -> MemoryTags {
        MemoryTags {
            kv_cache: self.kv_cache || other.kv_cache,
            weights: self.weights || other.weights,
        }
    }

    /// The regions in `self` and not in `other`.
    pub fn minus(self, other: MemoryTags) -> MemoryTags {
        MemoryTags {
            kv_cache: self.kv_cache && !other.kv_cache,
            weights: self.weights && !other.weights,
        }
    }

    /// Whether every region of `other` is in `self`.
    pub fn contains(self, other: MemoryTags) -> bool {
        other.minus(self) == MemoryTags::default()
    }

    /// The tag names, in SGLang's order (`weights`, `kv_cache`).
    pub fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.weights {
            v.push(Self::WEIGHTS);
        }
        if self.kv_cache {
            v.push(Self::KV_CACHE);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_sets() {
        let kv = MemoryTags {
            kv_cache: true,
            weights: false,
        };
        assert_eq!(MemoryTags::ALL.minus(kv).names(), vec!["weights"]);
        assert!(MemoryTags::ALL.contains(kv));
        assert!(!kv.contains(MemoryTags::ALL));
        assert_eq!(kv.union(MemoryTags::ALL), MemoryTags::ALL);
        assert!(!MemoryTags::default().any());
        assert_eq!(MemoryTags::ALL.names(), vec!["weights", "kv_cache"]);
    }
}
