#!/usr/bin/env bash
# The host tier's copies beside the forward vs before it (issue 32 item 5),
# under each kernel path this CPU has: one table per path and a plot, in
# $OUT/tier-copy-<cpu>.{md,svg}. Run on a quiet machine (minutes of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benches/results}
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' | tr -cs 'A-Za-z0-9' '-' | sed 's/-$//')
paths=${PATHS:-$(grep -q avx512f /proc/cpuinfo && echo "avx512 avx2" || echo avx2)}
md=$OUT/tier-copy-$cpu.md
{
  echo "# Tier copies beside the forward vs before it"
  echo
  echo "\`benches/tier-copy.sh\` ($(date -u +%FT%TZ)); load before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Each row: medians of ${TIER_ROUNDS:-9} interleaved runs; before/beside > 1 means the overlap is faster."
} > "$md"
args=()
for p in $paths; do
  echo >> "$md"; echo "## $p" >> "$md"; echo >> "$md"
  AGENTD_CPU_KERNELS=$p cargo bench -q -p agentd-models --bench tier_copy --locked 2>/dev/null | tee "$OUT/.tier-copy-$p.md" >> "$md"
  args+=("$p=$OUT/.tier-copy-$p.md")
done
python3 benches/lib/tier_copy_report.py "$OUT/tier-copy-$cpu.svg" "${args[@]}"
rm -f "$OUT"/.tier-copy-*.md
echo "wrote $md and $OUT/tier-copy-$cpu.svg"
