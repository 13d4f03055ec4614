"""Draw docs/benchmarks.png: training-step time of each tpu configuration
(eager debug, strict and fused; the whole step captured with torch.tpu.graph;
torch.compile'd model, step and captured step) against CPU eager, CPU Inductor
and JAX, for the MLP, GPT and ResNet examples, from the figures recorded in
bench/figures.json.

Nothing is measured here. Before drawing, the script checks that every figure
of bench/figures.json is the one written in the tables under "Current
figures" in docs/benchmarks.md (same configuration, same example, same
number), and stops if one is not. `--check` only checks (no matplotlib
needed). Configurations without a recorded figure are left out of the chart
(no JAX figure for the MLP and the ResNet; on the H200 no graph or compiled
graph, and no baseline for the MLP and the ResNet). Where a table gives two
fresh-process runs, the bar is the first and a dot marks the second.

matplotlib is needed by this script only; it is not part of `make setup`.
Install it into the environment first: .venv/bin/python -m pip install matplotlib

Usage: python bench/chart.py [--check] [--out docs/benchmarks.png]
"""

import argparse
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIGURES = os.path.join(ROOT, "bench", "figures.json")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
EXAMPLES = ("MLP", "GPT", "ResNet")


def load():
    with open(FIGURES) as f:
        return json.load(f)


def current_tables(text):
    """The markdown tables under '## Current figures', in order: each a dict
    {row label: {column header: cell text}}."""
    start = text.index("## Current figures")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else len(text)]
    tables, rows = [], None
    for line in section.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                header, rows = cells, {}
            elif not set("".join(cells)) <= set("-: "):
                rows[cells[0]] = dict(zip(header[1:], cells[1:]))
        elif rows is not None:
            tables.append(rows)
            rows = None
    return tables


def cell_values(cell):
    """'3.04 (2.0x), 3' -> [3.04] (the ratio and the programs compiled dropped);
    '32.9, 28.6' -> [32.9, 28.6] (two runs)."""
    if "(" in cell:
        cell = cell[: cell.index("(")]
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell)]


def check(figures):
    with open(PAGE) as f:
        tables = current_tables(f.read())
    errors = []
    runs = figures["runs"]
    if len(tables) < len(runs):
        errors.append(
            f"docs/benchmarks.md has {len(tables)} tables under Current figures, bench/figures.json {len(runs)} runs"
        )
    for run, table in zip(runs, tables):
        for example, configs in run["step_ms"].items():
            for config, value in configs.items():
                want = value if isinstance(value, list) else [value]
                cell = table.get(config, {}).get(example)
                if cell is None:
                    errors.append(f"{run['commit']} {example} {config}: not in docs/benchmarks.md")
                elif cell_values(cell) != want:
                    errors.append(
                        f"{run['commit']} {example} {config}: figures.json {want}, docs/benchmarks.md {cell!r}"
                    )
    return errors


def color(config):
    if config.startswith("CPU"):
        return "#8c8c8c"
    if config.startswith("JAX"):
        return "#2f6db5"
    return {
        "tpu debug": "#f2c4a0",
        "tpu strict": "#eb9a5e",
        "tpu fused": "#d96a1d",
        "tpu graph": "#a34a0c",
        "tpu compiled": "#b9d99a",
        "tpu compiled step": "#7cb356",
        "tpu compiled graph": "#3f7d20",
    }[config]


def draw(figures, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = figures["runs"]
    fig, axes = plt.subplots(len(runs), len(EXAMPLES), figsize=(16, 4.2 * len(runs)), squeeze=False)
    for r, run in enumerate(runs):
        for c, example in enumerate(EXAMPLES):
            ax = axes[r][c]
            configs = run["step_ms"].get(example, {})
            labels = list(configs)
            top = max(max(v) if isinstance(v, list) else v for v in configs.values()) if configs else 1
            for name, value in configs.items():
                if name.startswith(("CPU eager", "JAX")) and not isinstance(value, list):
                    ax.axvline(value, color=color(name), linestyle="--", linewidth=0.8, zorder=0)
            for y, name in enumerate(labels):
                vals = configs[name] if isinstance(configs[name], list) else [configs[name]]
                ax.barh(y, vals[0], height=0.7, color=color(name), edgecolor="black", linewidth=0.4)
                for v in vals[1:]:
                    ax.plot(v, y, "o", color="black", markersize=4)
                ax.text(
                    max(vals) + top * 0.03,
                    y,
                    ", ".join(str(v) for v in vals),
                    va="center",
                    fontsize=8,
                    bbox=dict(facecolor="white", edgecolor="none", pad=0.5),
                )
            if not any(n.startswith(("CPU", "JAX")) for n in configs):
                ax.text(
                    0.98,
                    0.04,
                    "no CPU or JAX figure recorded",
                    transform=ax.transAxes,
                    ha="right",
                    va="bottom",
                    fontsize=8,
                    style="italic",
                )
            ax.set_yticks(range(len(labels)))
            ax.set_yticklabels(labels, fontsize=8)
            ax.set_ylim(max(len(labels), 10) - 0.4, -0.6)  # first row on top
            ax.set_xlim(0, top * 1.25)
            ax.set_xlabel("step time, ms (lower is better)", fontsize=8)
            ax.tick_params(axis="x", labelsize=8)
            ax.set_title(f"{example}: {run['title']}\n{run['date']}, commit {run['commit']}", fontsize=9)
    fig.suptitle(
        "torchtpu training step per configuration (dashed: CPU eager and JAX; dot: a second fresh-process run)",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=90, metadata={"Software": None})
    print(f"wrote {os.path.relpath(out, ROOT)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="only check bench/figures.json against docs/benchmarks.md")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.png"))
    args = ap.parse_args()
    figures = load()
    errors = check(figures)
    if errors:
        print("bench/figures.json does not match docs/benchmarks.md:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    print("bench/figures.json matches the current tables of docs/benchmarks.md")
    if not args.check:
        draw(figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
