#!/bin/bash
# The sampler before (769139b: argmax = max pass then a scalar search; two
# mask forms) and after (one-pass blocked argmax; one mask rule), the
# sampler bench on both of its passes, in the order old new new old.
# The old side builds from a worktree of OLD into a target dir of its own
# (the two checkouts' crates have the same package ids, and one shared
# target dir ran the old build for both), the new side is this checkout.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benches/results/sampler-argmax
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/agentd-ci-target}
OLD=${OLD:-769139b}
wt=$(mktemp -d)
trap 'git worktree remove --force "$wt/old" 2>/dev/null; rm -rf "$wt"' EXIT
git worktree add -q "$wt/old" "$OLD"
# The bench did not exist at OLD: the same file runs against the old sampler.
mkdir -p "$wt/old/crates/runtime/benches"
cp crates/runtime/benches/sampler.rs "$wt/old/crates/runtime/benches/"
grep -q 'name = "sampler"' "$wt/old/crates/runtime/Cargo.toml" ||
  printf '\n[[bench]]\nname = "sampler"\nharness = false\n' >> "$wt/old/crates/runtime/Cargo.toml"
OLD_TARGET=${OLD_TARGET:-/var/tmp/agentd-sampler-old-target}
arm() { # NAME DIR TARGET_DIR
  (cd "$2" && export CARGO_TARGET_DIR=$3 && cargo bench -q -p agentd-runtime --bench sampler > "$OLDPWD/$OUT/$1-avx2.txt" 2>/dev/null &&
    AGENTD_CPU_KERNELS=portable cargo bench -q -p agentd-runtime --bench sampler > "$OLDPWD/$OUT/$1-portable.txt" 2>/dev/null)
  echo "$1 done"
}
arm old1 "$wt/old" "$OLD_TARGET"
arm new1 . "$CARGO_TARGET_DIR"
arm new2 . "$CARGO_TARGET_DIR"
arm old2 "$wt/old" "$OLD_TARGET"
