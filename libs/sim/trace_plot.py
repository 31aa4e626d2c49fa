"""`sim trace --plot`: the queueing-delay CDF of each set-up (needs matplotlib, the `plot` extra)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from libs.sim.trace_metrics import queueing_delays
from libs.sim.trace_outcome import JobOutcome

FLOOR_S = 1.0  # delays under a second are drawn at a second (log scale)
STYLES = ("-", "--", ":", "-.")  # set-ups often coincide: dashes keep each visible


def can_plot() -> str | None:
    """None when matplotlib is there, else what to do about it (checked before a long run, not after)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib: pip install 'gpusched[plot]'"
    return None


def plot_delay_cdf(runs: Mapping[str, Sequence[JobOutcome]], path: Path, title: str = "") -> None:
    problem = can_plot()
    if problem:
        raise RuntimeError(problem)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for i, (name, outcomes) in enumerate(runs.items()):
        delays = np.sort(np.maximum(np.asarray(queueing_delays(outcomes), dtype=float), FLOOR_S))
        if delays.size == 0:
            continue
        ax.step(delays, np.arange(1, delays.size + 1) / delays.size, where="post", label=name,
                linestyle=STYLES[i % len(STYLES)], linewidth=1.6)
    ax.set_xscale("log")
    ax.set_xlabel(f"queueing delay, s (first start - submit; under {FLOOR_S:g} s drawn at {FLOOR_S:g} s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.set_title(title or "queueing delay CDF")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
