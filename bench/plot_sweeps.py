"""Draws the JSON of bench/sweep.py as PNG plots (matplotlib): the sweeps run on the GPU machine, which may lack
matplotlib, and are drawn wherever the JSON is brought back.

- `<prefix>transfer.png`: GB/s of each transfer way (solid: gather, to the GPU; dashed: scatter, back) against the
  ids per batch and the row width, with the link's bound measured at each point (black).
- `<prefix>step.png`: ms per training step of each way against the same axes, with the step's bound (black, dashed:
  the bytes a step must move at the copy rate). Left out when the sweep timed no training way.

    python bench/plot_sweeps.py sweep.json --out bench/plots --prefix gpu_
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines this runs on
import matplotlib.pyplot as plt  # noqa: E402

SWEEPS = (("batch", "ids per batch"), ("dim", "row width (float32)"))
DIRECTIONS = {"h2d": ("-", "gather"), "d2h": ("--", "scatter")}


def sweep_points(data: dict, sweep: str) -> list[dict]:
    return sorted((p for p in data["points"] if sweep in p["sweeps"]), key=lambda p: p[sweep])


def fixed_label(data: dict, sweep: str) -> str:
    base = data["base"]
    return f"at {base['dim']} wide" if sweep == "batch" else f"at {base['batch']:,} ids"


def label_x_axis(ax, xs: list, data: dict, sweep: str, xlabel: str) -> None:
    """The sweep's x axis: log2, ticks at the points (16k, 32k, ...)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x) for x in xs])
    ax.set_xlabel(f"{xlabel} ({fixed_label(data, sweep)})")


def finish(fig, axes, title: str, path: Path) -> None:
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def draw_transfer(data: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    colors: dict[str, str] = {}
    for ax, (sweep, xlabel) in zip(axes, SWEEPS):
        points = sweep_points(data, sweep)
        xs = [p[sweep] for p in points]
        one_rate = all(p["bound GB/s"]["h2d"] == p["bound GB/s"]["d2h"] for p in points)  # no GPU: one copy
        for direction, (style, words) in DIRECTIONS.items():
            if one_rate and direction == "d2h":
                continue
            ax.plot(xs, [p["bound GB/s"][direction] for p in points], style, color="black", linewidth=2,
                    label="bound (contiguous copy)" + ("" if one_rate else f", {words}"))
        ways = list(dict.fromkeys(r["way"] for p in points for r in p["transfer"]))
        for way in ways:
            for direction, (style, words) in DIRECTIONS.items():
                ys = [next((r["GB/s"] for r in p["transfer"] if r["way"] == way and r["dir"] == direction), None)
                      for p in points]
                if all(y is None for y in ys):
                    continue
                line = ax.plot(xs, ys, style, marker="o", color=colors.get(way), label=f"{way}, {words}")[0]
                colors.setdefault(way, line.get_color())
        label_x_axis(ax, xs, data, sweep, xlabel)
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    finish(fig, axes, f"Row transfer rate, {data['device']} ({data['table_mb']} MB table; bound: {data['bound']})",
           path)


def draw_step(data: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    colors: dict[str, str] = {}
    for ax, (sweep, xlabel) in zip(axes, SWEEPS):
        points = sweep_points(data, sweep)
        xs = [p[sweep] for p in points]
        ax.plot(xs, [p["step bound ms"] for p in points], "--", color="black", linewidth=2,
                label="bound: weights + Adam moments of the distinct ids, each way, at the copy rate")
        ways = list(dict.fromkeys(r["way"] for p in points for r in p.get("step", [])))
        for way in ways:
            ys = [next((r["ms"] for r in p["step"] if r["way"] == way), None) for p in points]
            line = ax.plot(xs, ys, "-", marker="o", color=colors.get(way), label=way)[0]
            colors.setdefault(way, line.get_color())
        label_x_axis(ax, xs, data, sweep, xlabel)
        ax.set_yscale("log")
        ax.set_ylabel("ms per training step")
        ax.grid(True, which="both", alpha=0.3)
    finish(fig, axes, f"Training step time (Adam, Zipf ids), {data['device']} ({data['table_mb']} MB user table)",
           path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path, help="the output of bench/sweep.py")
    parser.add_argument("--out", type=Path, default=Path("bench/plots"))
    parser.add_argument("--prefix", default="", help="start of the file names, e.g. gpu_")
    args = parser.parse_args(argv)
    data = json.loads(args.json.read_text())
    for sweep, _ in SWEEPS:
        if not sweep_points(data, sweep):
            print(f"{args.json} has no point of the {sweep} sweep")
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    written = [args.out / f"{args.prefix}transfer.png"]
    draw_transfer(data, written[0])
    if any("step" in p for p in data["points"]):
        written.append(args.out / f"{args.prefix}step.png")
        draw_step(data, written[1])
    else:
        print("no training way was timed: no step plot")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
