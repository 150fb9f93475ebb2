"""``ab_report.png``: the report's chart, bars of epoch time and, with a target, val_acc over time.

Apart because it is the one part that needs matplotlib, imported only when a chart is drawn, and
because a chart that cannot be drawn must not cost the table (``write_report`` logs and goes on).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import List, Optional

from trainer.console import row_notes
from trainer.measure import time_to_target as ttt
from trainer.report.jobs import Job, fold_repeats, varied_keys
from trainer.report.render import format_cell, shown_keys


def _label(row: dict, varied: List[str]) -> str:
    """A readable bar label: the varied settings of this row (paths shortened), wrapped."""
    parts = []
    for k in varied:
        value = row.get(k)
        if value is None:
            continue
        text = format_cell(value, k)
        if "/" in text:
            text = "…/" + text.rstrip("/").rsplit("/", 1)[-1]
        parts.append(f"{k}={text}")
    return "\n".join(textwrap.wrap(", ".join(parts), 48)) if parts else row["job"]


def chart(jobs: List[Job], columns: List[str], rows: List[dict], goal: Optional[float] = None):
    """The figure of ``ab_report.png``: horizontal bars of epoch time per configuration, the speedup
    written on each bar; with a target (``goal``) a second panel of val_acc against training time,
    one line per row (the row's first job), the target dashed. Returned rather than saved so that
    what it shows can be read back from its data (``save_png`` writes it)."""
    from matplotlib.figure import Figure  # lazy: keeps matplotlib out of python -m trainer.report's start-up

    curves = None
    if goal is not None:
        folded = fold_repeats(jobs, varied_keys(jobs))  # the rows of build_rows, in the same order
        curves = [ttt.curve(row.first.metrics.get("epochs") or []) for row in folded]

    varied = shown_keys(columns, rows)
    labels = [_label(r, varied) for r in rows]
    times = [r["epoch_time_s"] or 0.0 for r in rows]
    lines = sum(max(1, label.count("\n") + 1) for label in labels)
    height = 0.32 * lines + 0.25 * len(rows) + 1.6
    with_curves = bool(curves) and any(curves)
    # a Figure of its own, not pyplot's: no process-wide figure registry or backend to set
    if with_curves:
        fig = Figure(figsize=(11, height + 4.2))
        ax, curve_ax = fig.subplots(2, 1, gridspec_kw={"height_ratios": [height, 4.2]})
    else:
        fig = Figure(figsize=(11, height))
        ax = fig.subplots()
    ypos = range(len(rows))
    colors = ["#9e9e9e" if _is_baseline(r) else ("#d9534f" if r["status"] != "ok" else "#4c72b0") for r in rows]
    errors = [[0.0] * len(rows), [0.0] * len(rows)]
    for i, r in enumerate(rows):
        if r.get("spread_s") and r["epoch_time_s"]:
            lo, hi = (float(x) for x in r["spread_s"].split("-"))
            errors[0][i], errors[1][i] = max(0.0, r["epoch_time_s"] - lo), max(0.0, hi - r["epoch_time_s"])
    ax.barh(list(ypos), times, color=colors, xerr=errors, ecolor="#333333", capsize=3)
    top = max(times) if any(times) else 1.0
    for y, r, t in zip(ypos, rows, times):
        if r["status"] != "ok":
            text = "FAILED"
        elif r["speedup"] is not None:
            text = (
                f"{t:.3g} s   {r['speedup']:.2f}x"
                + (f" [{r['speedup_ci']}]" if r.get("speedup_ci") else "")
                + (" (noise)" if "within noise" in row_notes(r) else "")  # the epoch time's, not the target's
            )
        else:
            text = f"{t:.3g} s"
        ax.text(t + errors[1][y] + top * 0.015, y, text, va="center", fontsize=9)
    ax.set_yticks(list(ypos))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel("epoch time (s), median of steady epochs; lower is better")
    ax.set_title("A/B: epoch time and speedup vs baseline (grey)")
    if with_curves:
        _accuracy_curves(curve_ax, rows, labels, curves, goal)
    fig.tight_layout()
    return fig


def _is_baseline(row: dict) -> bool:
    """The baseline row's notes begin with "baseline" (other rows' notes may name the baseline)."""
    return row_notes(row)[0] == "baseline"


def save_png(path: Path, figure) -> None:
    figure.savefig(path, dpi=110)


def _accuracy_curves(ax, rows: List[dict], labels: List[str], curves: List[list], goal) -> None:
    """val_acc against training time (validation time apart), one line per row; the target dashed."""
    for i, (row, label, points) in enumerate(zip(rows, labels, curves)):
        if points:
            xs, ys = zip(*points)
            style = {"color": "#9e9e9e", "linewidth": 2.5} if _is_baseline(row) else {"color": f"C{i % 10}"}
            ax.plot(xs, ys, marker="o", markersize=3, label=label.replace("\n", " ")[:60], **style)
    if goal is not None:
        ax.axhline(goal, color="#333333", linestyle="--", linewidth=1, label=f"target {goal:.3f}")
    ax.set_xlabel("training time so far (s), validation time apart")
    ax.set_ylabel("val_acc")
    ax.set_title("time to accuracy: val_acc after each epoch")
    ax.legend(fontsize=7, loc="lower right")
