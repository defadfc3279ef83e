"""Draw the benchmarks' `--json` files as the pictures under docs/img (PNG and SVG each).

  storage_growth     bytes stored against thread length, log-log, per saver, with the fitted
                     slope (1 linear, 2 quadratic)                         bench_backends.py
  turn_latency       latency of each turn against the turn's number       bench_backends.py
  throughput         checkpoints/s at concurrency 1 and 16, per saver     bench_backends.py
  smart_round_trips  store round trips per turn, per save policy          bench_smart.py
  replica_lag        lag and queue of replicas, one killed and restarted  bench_replica_lag.py
  floor              turns/s and CPU per turn of every line against LangGraph's floor
                                                                          bench_floor.py

Several `bench_backends.py` files (one per backend) are merged: the union of their savers.
`figures.py` runs the benchmarks and calls `draw_all`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plotstyle
from matplotlib.ticker import FuncFormatter
from plotstyle import colour, figure, linestyle, save

Json = dict[str, Any]

# The panel a saver is drawn in, by the store it writes to.
BACKENDS = {"sqlite": "SQLite", "memory": "in memory", "postgres": "PostgreSQL",
            "redis": "Redis"}


def backend_of(saver: str) -> str:
    """`ours-sqlite-normal` -> sqlite, `plainredis-delta` -> redis."""
    if saver.startswith("plainredis"):
        return "redis"
    return saver.split("-")[1] if "-" in saver else saver


def load(directory: Path) -> dict[str, list[Json]]:
    """Every results file in `directory`, by its `benchmark` key."""
    found: dict[str, list[Json]] = {}
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "benchmark" in data:
            found.setdefault(data["benchmark"], []).append(data)
        else:
            print(f"draw: {path.name} has no \"benchmark\" key: not drawn")
    return found


def merge_backends(files: list[Json]) -> Json:
    """One `bench_backends.py` result of several (one per backend): savers in run order."""
    merged: Json = {"savers": [], "growth": {}, "throughput": {}, "restore_ms": {}}
    for data in files:
        for saver in data.get("savers", []):
            if saver not in merged["savers"]:
                merged["savers"].append(saver)
        for key in ("growth", "throughput", "restore_ms"):
            merged[key].update(data.get(key) or {})
    return merged


def slope(turns: list[int], sizes: list[int]) -> float | None:
    """Least-squares slope of log(bytes) on log(turns) over the second half of the thread."""
    points = [(math.log(t), math.log(b)) for t, b in zip(turns, sizes, strict=False)
              if t > 0 and b > 0 and t >= turns[-1] / 2]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def _panels(savers: list[str], height: float = 3.6) -> tuple[Any, dict[str, Any]]:
    """A figure with one panel per backend of `savers`, in the order they first appear."""
    groups = list(dict.fromkeys(backend_of(s) for s in savers))
    cols = min(2, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plotstyle.plt.subplots(rows, cols, figsize=(6.0 * cols, height * rows),
                                       layout="constrained", squeeze=False)
    flat = list(axes.flat)
    for ax in flat[len(groups):]:
        ax.set_visible(False)
    panels = {}
    for group, ax in zip(groups, flat, strict=False):
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(BACKENDS.get(group, group))
        panels[group] = ax
    return fig, panels


def draw_storage(backends: Json, outdir: Path) -> list[Path]:
    growth = backends["growth"]
    savers = [s for s in backends["savers"] if s in growth]
    fig, panels = _panels(savers)
    for saver in savers:
        g = growth[saver]
        k = slope(g["turns"], g["bytes"])
        label = f"{saver}  slope {k:.2f}" if k is not None else saver
        panels[backend_of(saver)].plot(
            g["turns"], [b / 1e6 for b in g["bytes"]], label=label, color=colour(saver),
            linestyle=linestyle(saver), marker="o" if len(g["turns"]) <= 60 else None,
            markersize=3)
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 100, 0.1: not 10^2, 10^-1
    for ax in panels.values():
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.set_xlabel("turns in the thread (log)")
        ax.set_ylabel("MB stored (log)")
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("Storage of one thread as it grows (slope: log-log fit over its second half; "
                 "1 linear, 2 quadratic)", fontsize=10)
    return save(fig, outdir, "storage_growth")


def draw_latency(backends: Json, outdir: Path) -> list[Path]:
    growth = backends["growth"]
    savers = [s for s in backends["savers"] if s in growth and growth[s].get("turn_ms")]
    fig, panels = _panels(savers)
    for saver in savers:
        g = growth[saver]
        many = len(g["turns"]) > 60
        panels[backend_of(saver)].plot(
            g["turns"], g["turn_ms"], label=saver, color=colour(saver),
            linestyle=linestyle(saver), linewidth=0.8 if many else 1.5,
            marker=None if many else "o", markersize=3)
    for ax in panels.values():
        ax.set_ylim(bottom=0)
        ax.set_xlabel("turn number")
        ax.set_ylabel("turn latency, ms")
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("Latency of a turn along one long thread (median of the turns between two points)",
                 fontsize=10)
    return save(fig, outdir, "turn_latency")


def draw_throughput(backends: Json, outdir: Path) -> list[Path]:
    throughput = backends["throughput"]
    savers = [s for s in backends["savers"] if s in throughput]
    fig, ax = figure(width=max(7.0, 0.75 * len(savers) + 2), height=4.4)
    ax.grid(False)
    ax.grid(True, axis="y", alpha=0.3)
    width = 0.38
    for i, saver in enumerate(savers):
        for j, level in enumerate(("1", "16")):
            value = throughput[saver].get(level)
            if value is None:
                continue
            x = i + (j - 0.5) * width
            ax.bar(x, value, width, color=colour(saver), alpha=1.0 if j == 0 else 0.55,
                   hatch=None if j == 0 else "//", edgecolor="white" if j == 0 else "black",
                   linewidth=0.5, linestyle=linestyle(saver))
            ax.annotate(f"{value:.0f}", (x, value), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(savers)), savers, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("checkpoints stored per second")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)  # room for the labels and the legend
    solid = plotstyle.plt.Rectangle((0, 0), 1, 1, color="#777777")
    hatched = plotstyle.plt.Rectangle((0, 0), 1, 1, facecolor="#bbbbbb", hatch="//",
                                      edgecolor="black", linewidth=0.5)
    ax.legend([solid, hatched], ["concurrency 1", "concurrency 16"], loc="upper right",
              fontsize=8)
    ax.set_title("Agent loop throughput (higher is better)", fontsize=10)
    return save(fig, outdir, "throughput")


def draw_smart(smart: Json, outdir: Path) -> list[Path]:
    backends = smart["backends"]
    policies = smart.get("policies", {})
    fig, axes = plotstyle.plt.subplots(1, len(backends), figsize=(6.2 * len(backends), 4.4),
                                       layout="constrained", squeeze=False, sharey=True)
    width = 0.38
    for ax, (backend, run) in zip(axes[0], backends.items(), strict=True):
        variants = list(run["variants"])
        ax.grid(True, axis="y", alpha=0.3)
        for i, variant in enumerate(variants):
            row = run["variants"][variant]
            for j, (key, shade) in enumerate((("calls_per_turn", "#1f5fbf"),
                                             ("writes_per_turn", "#9fbfe9"))):
                x = i + (j - 0.5) * width
                ax.bar(x, row[key], width, color="#8c8c8c" if variant == "bare" and j == 0
                       else "#cccccc" if variant == "bare" else shade)
                ax.annotate(f"{row[key]:.2g}", (x, row[key]), ha="center", va="bottom",
                            fontsize=7, xytext=(0, 2), textcoords="offset points")
        labels = [f"{v}\n{policies.get(v, '')}".replace(", side_effect_tools=", "\nside effects: ")
                  for v in variants]
        ax.set_xticks(range(len(variants)), labels, fontsize=7)
        ax.set_title(f"{BACKENDS.get(backend, backend)}: {run['threads']} threads x "
                     f"{run['turns']} turns", fontsize=9)
        ax.set_ylabel("store round trips per turn")
    handles = [plotstyle.plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#1f5fbf", "#9fbfe9")]
    axes[0][-1].legend(handles, ["all store calls", "of which writes"], loc="upper right",
                       fontsize=8)
    fig.suptitle("SmartCheckpointer: store round trips per agent turn, by save policy "
                 "(grey: the backend alone; fewer is better)", fontsize=10)
    return save(fig, outdir, "smart_round_trips")


def _down(samples: list[Json], name: str) -> list[tuple[float, float]]:
    """The spans of time `status()` reported replica `name` down."""
    spans, start = [], None
    for s in samples:
        up = s["replicas"][name]["up"]
        if not up and start is None:
            start = s["t"]
        elif up and start is not None:
            spans.append((start, s["t"]))
            start = None
    if start is not None:
        spans.append((start, samples[-1]["t"]))
    return spans


def draw_lag(lag: Json, outdir: Path) -> list[Path]:
    samples = lag["samples"]
    t = [s["t"] for s in samples]
    fig, (top, bottom) = plotstyle.plt.subplots(2, 1, figsize=(7.5, 5.4), sharex=True,
                                                layout="constrained")
    shades = {"redis": "#c0392b", "sqlite": "#1f5fbf"}
    for name in lag["replicas"]:
        c = shades.get(name, "#444444")
        top.plot(t, [s["replicas"][name]["lag_s"] for s in samples], color=c, label=name)
        bottom.plot(t, [s["replicas"][name]["queued"] for s in samples], color=c, label=name)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.axvspan(lag["kill_s"], lag["restart_s"], color="#999999", alpha=0.25, linewidth=0,
                   label=f"{lag['killed']} down (SIGKILL -> restart)")
        for i, (start, end) in enumerate(_down(samples, lag["killed"])):
            ax.axvspan(start, end, facecolor="none", edgecolor="#c0392b", hatch="///",
                       linewidth=0, alpha=0.5, label="status(): marked down" if i == 0 else None)
        if lag.get("caught_up_s") is not None:
            ax.axvline(lag["caught_up_s"], color="#2e7d32", linestyle="--", linewidth=1,
                       label="caught up (lag < 0.1 s)")
    top.set_ylabel("lag: oldest unreplicated op, s")
    bottom.set_ylabel("ops queued")
    bottom.set_xlabel("seconds since the start of the run")
    top.legend(loc="upper left", fontsize=8)
    verdict = "caught up" if lag.get("caught_up") else "did NOT catch up"
    top.set_title(f"ReplicatedCheckpointer (async): replica {lag['killed']} killed and restarted "
                  f"mid-run, {lag['turns']} turns; {verdict}", fontsize=10)
    return save(fig, outdir, "replica_lag")


def draw_floor(floor: Json, outdir: Path) -> list[Path]:
    """Two panels: turns/s and CPU per turn of each line as a multiple of the floor's, at
    each concurrency, with issue 25's goals marked."""
    levels = [k for k in ("1", "16") if k in floor]
    lines = list(floor[levels[0]])
    if len(lines) > 9:  # the bound lines too: one panel above the other
        fig, axes = plotstyle.plt.subplots(2, 1, figsize=(12, 8.5), layout="constrained")
    else:
        fig, axes = plotstyle.plt.subplots(1, 2, figsize=(11.5, 4.4), layout="constrained")
    width = 0.38
    for ax, key, label in ((axes[0], "turns_x", "turns/s, x the floor's (higher is better)"),
                           (axes[1], "cpu_x", "CPU per turn, x the floor's (lower is better)")):
        ax.grid(True, axis="y", alpha=0.3)
        for i, line in enumerate(lines):
            for j, level in enumerate(levels):
                value = floor[level][line][key]
                x = i + (j - 0.5) * width
                ax.bar(x, value, width, color=colour(line), alpha=1.0 if j == 0 else 0.55,
                       hatch=None if j == 0 else "//", edgecolor="white" if j == 0 else "black",
                       linewidth=0.5)
                ax.annotate(f"{value:.2f}", (x, value), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(lines)), lines, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
    goals = {"ours-sqlite": 0.8, "ours-postgres": 0.6, "ours-redis": 0.7}
    for line, goal in goals.items():
        if line in lines:
            i = lines.index(line)
            axes[0].hlines(goal, i - 0.45, i + 0.45, colors="#2e7d32", linestyles="--",
                           linewidth=1.2)
    if "ours-sqlite" in lines:
        i = lines.index("ours-sqlite")
        axes[1].hlines(1.3, i - 0.45, i + 0.45, colors="#2e7d32", linestyles="--",
                       linewidth=1.2)
    solid = plotstyle.plt.Rectangle((0, 0), 1, 1, color="#777777")
    hatched = plotstyle.plt.Rectangle((0, 0), 1, 1, facecolor="#bbbbbb", hatch="//",
                                      edgecolor="black", linewidth=0.5)
    goal = plotstyle.plt.Line2D([], [], color="#2e7d32", linestyle="--")
    axes[1].legend([*[solid, hatched][:len(levels)], goal],
                   [f"concurrency {level}" for level in levels] + ["goal (issue 25)"],
                   loc="upper left", fontsize=8)
    fig.suptitle("Every checkpoint stored, against LangGraph's floor (InMemorySaver, "
                 "durability=\"exit\")", fontsize=10)
    return save(fig, outdir, "floor")


def draw_all(data: Path, outdir: Path) -> list[Path]:
    """Draw every picture the results files in `data` allow; return the files written."""
    found = load(data)
    written: list[Path] = []
    backends = [f for f in found.get("backends", []) if "growth" in f or "throughput" in f]
    if len(backends) < len(found.get("backends", [])):
        print("draw: skipped backends files without growth/throughput (an older shape)")
    if backends:
        merged = merge_backends(backends)
        if merged["growth"]:
            written += draw_storage(merged, outdir) + draw_latency(merged, outdir)
        if merged["throughput"]:
            written += draw_throughput(merged, outdir)
    for smart in found.get("smart", [])[-1:]:
        written += draw_smart(smart, outdir)
    for lag in found.get("replica_lag", [])[-1:]:
        written += draw_lag(lag, outdir)
    for floor in found.get("floor", [])[-1:]:
        written += draw_floor(floor, outdir)
    return written
