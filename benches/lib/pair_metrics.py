#!/usr/bin/env python3
"""Where each arm's time went in a benches/pair.sh run, from its servers'
/metrics (markdown table on stdout).

usage: pair_metrics.py METRICS_DIR A_NAME B_NAME CONC
METRICS_DIR holds c<N>-pass<P>-<arm>-<seq>.prom, scraped from the start of
the bench's measured window to its end (pair.sh). Counters are read as the
difference between the first and the last snapshot, gauges as the mean of
all of them.

Why these columns: past the knee both arms' forwards are busy the whole
window, so throughput is forward time per finished request. That is the
prompt tokens each computes (`prefill tokens/finished`, `prefix hit`) and
how many steps a request's decode takes, which is how many sequences each
step decodes (`decoders/step`, generated tokens per step) and so how much
of the KV pool holds running programs (`KV used`, `running`). Within a
pass the arms run on different cores, so compare the mean of the passes.

Where the servers export what their forwards computed
(`agentd:step_decode_context_tokens_total`, `..._prefill_attention_pairs_
total`), a table of forward µs per planned token against context per
decode row and pairs per prefill token tells a dearer token from a
longer one (`pair-work-swe-48-avx2/`: the same contexts, the µs
following the core). Its last two columns are the mix of what finished
(prompt and generated tokens per finished request): steps/min counts
steps, so an arm whose window finished longer steps ran more work at the
same rate (`pair-passes-swe-48-steady/`: 3.2-4.6% longer prompts in the
program arm's two slowest passes).

The last table splits each server's CPU time over the window by thread
(c<N>-pass<P>-<arm>-<seq>.threads, pair.sh's thread_cpu): with one core
per server, anything besides the forward's kernel thread (tier copies,
planning, sampling, HTTP) is time the forward did not get.
(`pair-threads-gqa1-long-48/`: 190 of 196 s forward in both arms.)
Stdlib only.
"""
import glob
import os
import re
import sys

from prom import families

COUNTERS = {
    "fwd_s": "agentd:step_forward_seconds_sum",
    "steps": "agentd:step_forward_seconds_count",
    "finished": "agentd:requests_finished_total",
    "batch": "agentd:batch_tokens_total",
    "gen": "vllm:generation_tokens_total",
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "pauses": "agentd:program_pauses_total",
    "onloaded": "agentd:kv_onloaded_blocks_total",
    "offloaded": "agentd:kv_offloaded_blocks_total",
    "decode_ctx": "agentd:step_decode_context_tokens_total",
    "pairs": "agentd:step_prefill_attention_pairs_total",
    "prompt": "vllm:prompt_tokens_total",
}
GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv": "vllm:kv_cache_usage_perc",
}


def parse(path):
    with open(path) as f:
        return families(f.read())


def window_files(d, c, p, arm, ext):
    """The window's c<N>-pass<P>-<arm>-<seq>.<ext> files, in scrape order."""
    pat = re.compile(rf"c{c}-pass{p}-{arm}-(\d+)\.{ext}$")
    files = [(int(m.group(1)), f) for f in glob.glob(f"{d}/*.{ext}")
             if (m := pat.search(os.path.basename(f)))]
    return [f for _, f in sorted(files)]


def passes(d, c):
    """The pass numbers with snapshots of level `c` (pair.sh's PASSES), ascending."""
    pat = re.compile(rf"c{c}-pass(\d+)-[ab]-\d+\.prom$")
    return sorted({int(m.group(1)) for f in glob.glob(f"{d}/*.prom")
                   if (m := pat.search(os.path.basename(f)))})


def snapshots(d, c, p, arm):
    return [parse(f) for f in window_files(d, c, p, arm, "prom")]


def summary(snaps):
    if len(snaps) < 2:
        return None
    first, last = snaps[0], snaps[-1]
    dc = {k: last.get(m, 0.0) - first.get(m, 0.0) for k, m in COUNTERS.items()}
    g = {k: sum(s.get(m, 0.0) for s in snaps) / len(snaps) for k, m in GAUGES.items()}
    fin = max(dc["finished"], 1.0)
    steps = max(dc["steps"], 1.0)
    return {
        "finished": dc["finished"],
        "decoders": dc["gen"] / steps,
        "step_s": dc["fwd_s"] / steps,
        "prefill": (dc["batch"] - dc["gen"]) / fin,
        "fwd_per_fin": dc["fwd_s"] / fin,
        "hit": dc["hits"] / dc["queries"] if dc["queries"] else float("nan"),
        "pauses": dc["pauses"],
        "onloaded": dc["onloaded"],
        "offloaded": dc["offloaded"],
        # What the forward computed (servers from 2026-12-07 on export the
        # sums; 0 before): forward time per planned token, the mean context
        # a decode row read (a request's first token is sampled by its
        # prefill, so decode rows are generated tokens less finished
        # requests) and attention pairs per prefill token.
        "us_per_token": 1e6 * dc["fwd_s"] / max(dc["batch"], 1.0),
        "ctx_per_row": dc["decode_ctx"] / max(dc["gen"] - dc["finished"], 1.0),
        "pairs_per_prefill": dc["pairs"] / max(dc["batch"] - dc["gen"], 1.0),
        "has_work": dc["decode_ctx"] > 0,
        # The mix of what finished: a window whose finished steps carry
        # longer prompts or answers has done more work per step, whatever
        # the policy (a 120 s window is about one program's life).
        "prompt_per_fin": dc["prompt"] / fin,
        "gen_per_fin": dc["gen"] / fin,
        **g,
    }


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def threads(d, c, p, arm):
    """The first and the last thread-CPU snapshot of the window
    (pair.sh's thread_cpu: "TID NAME TICKS" lines, TID 0 the process)."""
    files = window_files(d, c, p, arm, "threads")
    if len(files) < 2:
        return None

    def read(path):
        out = {}
        with open(path) as f:
            for line in f:
                tid, name, ticks = line.split()
                out[int(tid)] = (name, int(ticks))
        return out

    return read(files[0]), read(files[-1])


def group(name):
    """Thread names (as /proc truncates them, 15 bytes) as the table
    groups them: the forward runs on the kernels' threads (`agentd-rR-tT`),
    the replica's own thread plans steps and samples."""
    if re.fullmatch(r"agentd-r\d+-t\d+", name):
        return "forward kernels"
    for prefix, g in (("agentd-replica", "replica (plan, sample)"),
                      ("tokio-r", "tokio (HTTP)"),
                      ("agentd-kveven", "kv events")):
        if name.startswith(prefix):
            return g
    return "other live threads"


def cpu_split(snap):
    """CPU seconds over the window by thread group. Threads that ended
    within it (the per-step KV copy threads) are the process's total less
    the live threads'."""
    first, last = snap
    total = (last[0][1] - first.get(0, ("", 0))[1]) / TICKS_PER_S
    split = {}
    for tid, (name, ticks) in last.items():
        if tid == 0:
            continue
        before = first.get(tid, (name, 0))[1]
        g = group(name)
        split[g] = split.get(g, 0.0) + (ticks - before) / TICKS_PER_S
    split["ended threads (KV copies)"] = total - sum(split.values())
    return total, split


def print_cpu(d, names, conc):
    rows = []
    for c in conc.split(","):
        for p in passes(d, c):
            for arm in ("a", "b"):
                snap = threads(d, c, p, arm)
                if snap is not None:
                    rows.append((c, p, names[arm], *cpu_split(snap)))
    if not rows:
        return
    groups = sorted({g for *_, split in rows for g in split})
    print()
    print("CPU seconds over the window by thread (`/proc/PID/task`; each server has one core):")
    print()
    print("| programs | pass | arm | process | " + " | ".join(groups) + " |")
    print("|---:|---:|---|---:|" + "---:|" * len(groups))
    for c, p, arm, total, split in rows:
        cells = " | ".join(f"{split.get(g, 0.0):.1f}" for g in groups)
        print(f"| {c} | {p} | {arm} | {total:.1f} | {cells} |")


def main():
    d, names, conc = sys.argv[1], {"a": sys.argv[2], "b": sys.argv[3]}, sys.argv[4]
    print("| programs | pass | arm | finished | decoders/step | forward s/step | KV used | running / waiting "
          "| prefill tokens/finished | forward s/finished | prefix hit | pauses | blocks offloaded / onloaded |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sums = []
    for c in conc.split(","):
        for p in passes(d, c):
            for arm in ("a", "b"):
                s = summary(snapshots(d, c, p, arm))
                if s is None:
                    print(f"| {c} | {p} | {names[arm]} | (fewer than 2 snapshots) |||||||||")
                    continue
                sums.append((c, p, names[arm], s))
                print(f"| {c} | {p} | {names[arm]} | {s['finished']:.0f} | {s['decoders']:.1f} "
                      f"| {s['step_s']:.3f} | {s['kv']:.3f} | {s['running']:.1f} / {s['waiting']:.1f} "
                      f"| {s['prefill']:.0f} | {s['fwd_per_fin']:.3f} | {s['hit']:.4f} "
                      f"| {s['pauses']:.0f} | {s['offloaded']:.0f} / {s['onloaded']:.0f} |")
    print_work(sums)
    print_cpu(d, names, conc)


def print_work(sums):
    """Forward time against what it computed (`sums`: main's (conc, pass,
    arm, summary) rows), where the servers export the sums: at the same
    tokens a step, a dearer token is longer contexts read (attention) or
    the same contexts read slower."""
    rows = [r for r in sums if r[3]["has_work"]]
    if not rows:
        return
    print()
    print("What the forward computed over the window:")
    print()
    print("| programs | pass | arm | forward µs / planned token | context tokens / decode row "
          "| attention pairs / prefill token | prompt tokens / finished | generated / finished |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for c, p, arm, s in rows:
        print(f"| {c} | {p} | {arm} | {s['us_per_token']:.0f} | {s['ctx_per_row']:.0f} "
              f"| {s['pairs_per_prefill']:.0f} | {s['prompt_per_fin']:.0f} | {s['gen_per_fin']:.1f} |")


if __name__ == "__main__":
    main()
