"""What every picture under docs/img shares: one colour per saver family, both file formats.

The benchmarks draw with matplotlib (the `plots` extra) on the Agg backend: no screen needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Fixed ids inside the SVG (clip paths), so that the same figure gives the same file.
matplotlib.rcParams["svg.hashsalt"] = "langgraph-ckpt-ext"

# Ours in blues, LangGraph's official savers in oranges/greys; a DeltaChannel variant dashed.
COLOURS = {
    "ours": "#1f5fbf",
    "official": "#e07b00",
    "plainredis": "#8c8c8c",
    "bound": "#2a9d8f",  # bench_floor's lower bounds, not checkpointers
}


def colour(saver: str) -> str:
    """The colour of a saver named like `ours-sqlite`, `official-postgres-delta`."""
    for family, value in COLOURS.items():
        if saver.startswith(family):
            return value
    return "#444444"


def linestyle(saver: str) -> str:
    """Dashed for a DeltaChannel run, dotted for a secondary setting, solid otherwise."""
    if saver.endswith("-delta"):
        return "--"
    if saver.endswith("-normal"):
        return ":"
    return "-"


def figure(width: float = 7.0, height: float = 4.2) -> tuple[Any, Any]:
    """A new figure and axes of the common size."""
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def save(fig: Any, outdir: Path, name: str) -> list[Path]:
    """Write `name`.png and `name`.svg into `outdir`; return their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        path = outdir / f"{name}.{ext}"
        # No timestamps in the SVG: the same figures give the same file.
        fig.savefig(path, dpi=120, metadata={"Date": None} if ext == "svg" else None)
        paths.append(path)
    plt.close(fig)
    return paths
