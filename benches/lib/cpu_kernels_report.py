"""The table and plot of benches/cpu-kernels.sh: reads its JSONL (one
`agentd bench-model --json` report per line, each with the shape added) and
writes <name>.md (tok/s per path, the avx2/avx512 ratio per cell) and
<name>.svg (one panel each for prefill and decode: tok/s per cell, a bar per
kernel path). Standard library only, so the script runs on a bare machine.

    python3 benches/lib/cpu_kernels_report.py RESULTS.jsonl OUT_STEM
"""
import json
import sys
from html import escape

COLOURS = {"avx512": "#1f77b4", "avx2": "#ff7f0e", "neon": "#2ca02c", "portable": "#7f7f7f"}


def load(path):
    reports = [json.loads(line) for line in open(path) if line.strip()]
    cell, paths = {}, []
    for r in reports:
        if r["cpu_kernels"] not in paths:
            paths.append(r["cpu_kernels"])
        for row in r["rows"]:
            cell[(r["shape"], r["prompt_len"], row["batch"], r["cpu_kernels"])] = row["ours"]
    keys = sorted({k[:3] for k in cell}, key=lambda k: (k[0], k[1], k[2]))
    return reports, cell, paths, keys


def table(reports, cell, paths, keys):
    first = reports[0] if reports else {}
    lines = [f"# CPU kernel paths: {first.get('cpu', '?')}", "",
             f"`agentd bench-model`, {first.get('threads', '?')} threads, block size 16, "
             f"{first.get('decode_steps', '?')} decode steps after each prefill; tok/s.", "",
             "| shape | context | batch | " + " | ".join(f"{p} prefill | {p} decode" for p in paths)
             + " | avx2/avx512 prefill | avx2/avx512 decode |",
             "|---|---:|---:|" + "---:|---:|" * len(paths) + "---:|---:|"]
    for shape, ctx, batch in keys:
        cells = []
        for p in paths:
            f = cell.get((shape, ctx, batch, p))
            cells += [f"{f['prefill_tok_s']:.1f}", f"{f['decode_tok_s']:.2f}"] if f else ["-", "-"]
        a, b = cell.get((shape, ctx, batch, "avx2")), cell.get((shape, ctx, batch, "avx512"))
        ratio = [f"{a[m] / b[m]:.2f}" if a and b and b[m] else "-"
                 for m in ("prefill_tok_s", "decode_tok_s")]
        lines.append(f"| {shape} | {ctx} | {batch} | " + " | ".join(cells + ratio) + " |")
    return "\n".join(lines) + "\n"


def panel(y0, title, metric, cell, paths, keys, width):
    """One bar panel, 260 px high, starting at y0; returns SVG elements."""
    left, h = 60, 170
    top = y0 + 30
    vals = [cell[(*k, p)][metric] for k in keys for p in paths if (*k, p) in cell]
    vmax = max(vals) if vals else 1.0
    group_w = (width - left - 20) / max(len(keys), 1)
    bar_w = group_w * 0.8 / max(len(paths), 1)
    out = [f'<text x="{left}" y="{y0 + 18}" font-size="14" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{left}" y1="{top + h}" x2="{width - 20}" y2="{top + h}" stroke="black"/>']
    for i in range(5):
        v = vmax * i / 4
        y = top + h - h * i / 4
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{v:.0f}</text>')
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#ddd"/>')
    for gi, (shape, ctx, batch) in enumerate(keys):
        gx = left + gi * group_w + group_w * 0.1
        for pi, p in enumerate(paths):
            f = cell.get((shape, ctx, batch, p))
            if not f:
                continue
            bh = h * f[metric] / vmax
            out.append(f'<rect x="{gx + pi * bar_w:.1f}" y="{top + h - bh:.1f}" width="{bar_w * 0.9:.1f}" '
                       f'height="{bh:.1f}" fill="{COLOURS.get(p, "#000")}"><title>{escape(shape)} ctx {ctx} '
                       f'batch {batch} {p}: {f[metric]:.1f} tok/s</title></rect>')
        label = f"{shape.replace('qwen3-bench-', '')} {ctx}x{batch}"
        cx = gx + group_w * 0.4
        out.append(f'<text x="{cx:.1f}" y="{top + h + 12}" font-size="9" text-anchor="end" '
                   f'transform="rotate(-35 {cx:.1f} {top + h + 12})">{escape(label)}</text>')
    return out


def plot(reports, cell, paths, keys):
    width = max(640, 70 + 46 * len(keys))
    cpu = reports[0].get("cpu", "?") if reports else "?"
    els = [f'<text x="10" y="20" font-size="15">agentd bench-model per CPU kernel path, {escape(cpu)} '
           f'(shape context x batch)</text>']
    els += panel(30, "prefill tok/s", "prefill_tok_s", cell, paths, keys, width)
    els += panel(300, "decode tok/s", "decode_tok_s", cell, paths, keys, width)
    for i, p in enumerate(paths):
        x = 70 + i * 110
        els.append(f'<rect x="{x}" y="580" width="12" height="12" fill="{COLOURS.get(p, "#000")}"/>')
        els.append(f'<text x="{x + 16}" y="591" font-size="12">{escape(p)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="600" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
            + "".join(els) + "</svg>\n")


def main():
    src, stem = sys.argv[1], sys.argv[2]
    reports, cell, paths, keys = load(src)
    text = table(reports, cell, paths, keys)
    open(stem + ".md", "w").write(text)
    open(stem + ".svg", "w").write(plot(reports, cell, paths, keys))
    print(text)


if __name__ == "__main__":
    main()
