"""Prometheus text exposition, read the way the bench scripts compare runs:
each metric family's series summed, labels dropped (a policy's pauses by
cause, a histogram's _sum and _count as their own families). Stdlib only;
shared by benches/lib/pair_metrics.py and scripts/idle_probe.py."""


def families(text):
    """{family name: sum of its series' values} of a /metrics body."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        name = key.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out
