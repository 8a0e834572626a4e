"""One trend plot per job of a history: samples/s and CPU ms a sample by night, steps marked."""

import math
from pathlib import Path
from typing import List, Sequence

from matplotlib.figure import Figure

from pipebench.base.io import folder_safe
from pipebench.regress.history import History, Step
from pipebench.report.plots import write_png

SIGNALS = (("samples_per_s", "samples/s", "samples_per_s_p25", "samples_per_s_p75"),
           ("cpu_ms_per_sample", "CPU ms a sample", "cpu_ms_p25", "cpu_ms_p75"))


def plot_job(history: History, job: str, steps: Sequence[Step], out_dir: Path) -> Path:
    """trend-<job>.png: both signals with their quartiles over rounds, a line at each step."""
    rows = [r for r in history.rows if r.job == job]
    figure = Figure(figsize=(8, 5))
    axes = figure.subplots(2, 1, sharex=True)
    x = list(range(len(rows)))
    for ax, (key, title, low, high) in zip(axes, SIGNALS):
        values = [getattr(r, key) for r in rows]
        errors = [[max(0.0, v - getattr(r, low)) if math.isfinite(getattr(r, low)) else 0.0 for v, r in zip(values, rows)],
                  [max(0.0, getattr(r, high) - v) if math.isfinite(getattr(r, high)) else 0.0 for v, r in zip(values, rows)]]
        ax.errorbar(x, values, yerr=errors, marker="o", capsize=2)
        ax.set_ylabel(title)
        for step in steps:
            if step.job == job and step.signal == key:
                ax.axvline(step.index - 0.5, color="red", linestyle="--")
                ax.annotate(f"step at {step.commit[:10]}", (step.index - 0.5, max(v for v in values if math.isfinite(v))),
                            color="red", fontsize=8)
    axes[-1].set_xticks(x, [f"{r.commit[:7]}\n{r.date[:10]}" for r in rows], fontsize=6, rotation=90)
    figure.suptitle(job)
    figure.tight_layout()
    path = out_dir / f"trend-{folder_safe(job)}.png"
    write_png(figure, path)
    return path


def plot_history(history: History, steps: Sequence[Step], out_dir: Path) -> List[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [plot_job(history, job, steps, out_dir) for job in history.jobs()]
