"""`--plot`: our allocation curve against the published FGD and BestFit curves (needs matplotlib, the
`plot` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from libs.sim.fgd import Summary
from libs.sim.published import published_curve


def plot_curves(summary: Summary, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("--plot needs matplotlib: pip install 'gpusched[plot]'") from err
    workload = Path(summary.pods_csv).stem
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    xs = list(range(131))
    ours = [float(np.mean([r.curve[k] for r in summary.runs if k in r.curve])) for k in xs]
    ax.plot(xs, ours, label=f"gpusched {summary.policy} (ours)", linewidth=2.2, color="tab:green")
    for policy, color in (("fgd", "tab:orange"), ("best-fit", "tab:blue")):
        curve = published_curve(policy, workload)
        if curve:
            ax.plot(list(curve), list(curve.values()), label=f"{policy} (published)", linestyle="--", color=color)
    ax.plot([0, 100], [0, 100], color="grey", linewidth=0.6)
    ax.set_xlabel("arrived GPU request, % of capacity")
    ax.set_ylabel("GPUs allocated, %")
    ax.set_xlim(60, 130)
    ax.set_ylim(60, 100)
    ax.grid(alpha=0.3)
    ax.set_title(f"{workload}: allocation, mean of seeds {summary.seeds[0]}-{summary.seeds[-1]}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
