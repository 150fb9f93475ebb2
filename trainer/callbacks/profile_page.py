"""An offline summary of a ``profile=true`` trace: ``profiler/summary.html`` and ``profiler/breakdown.png``.

TensorBoard's profiler tab draws its Overview with charts it loads from the web, so on an
air-gapped cluster a person sees a spinner. This page needs nothing but the file: the step-time
breakdown, the top operators by self device time and by self CPU time, the GPU's kernel-busy share
per profiled step (on a GPU), and the doctor's verdict, with the chart inlined as a PNG.

The breakdown partitions the profiled steps' wall time the way torch-tb-profiler's Overview does:
each instant goes to the first of kernel, memcpy, memset, runtime (CUDA API calls), data loading,
CPU execution that covers it, the rest is "other", so the parts add up to the step time. In words:
"host-to-device copy" is memcpy time no kernel overlaps, "CPU-side execution" is host op time
while the device was idle.

``summarize`` runs where the profiler stops (``ProfilerCallback``) and writes ``summary.json``;
``write_page`` runs when the job ends, once the doctor has spoken.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from typing import Any, Dict, Iterable, List, Optional, Tuple

from torch.autograd import DeviceType

SUMMARY = "summary.json"
PAGE = "summary.html"
CHART = "breakdown.png"
# (key, label), in the priority order of the partition
CATEGORIES = (
    ("kernel", "GPU kernels"),
    ("memcpy", "host-to-device copy (and other memcpy)"),
    ("memset", "memset"),
    ("runtime", "CUDA runtime calls"),
    ("data", "data loading"),
    ("cpu", "CPU-side execution"),
    ("other", "other"),
)
TOP = 10

Interval = Tuple[float, float]


def summarize(prof, device: str) -> Dict[str, Any]:
    """The profile's numbers (microseconds), from the profiler's events; JSON-ready."""
    events = list(prof.events())
    steps = sorted(
        (e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep") and _on_cpu(e)
    )
    classes: Dict[str, List[Interval]] = {key: [] for key, _ in CATEGORIES}
    for e in events:
        kind = _classify(e)
        if kind:
            classes[kind].append((e.time_range.start, e.time_range.end))
    breakdown = partition(steps, classes)
    averages = prof.key_averages()
    return {
        "device": device,
        "steps": len(steps),
        "step_time_us": sum(end - start for start, end in steps),
        "breakdown_us": breakdown,
        "kernel_busy_per_step": [
            round(_length(_intersect(_union(classes["kernel"]), [s])) / (s[1] - s[0]), 4) if s[1] > s[0] else 0.0
            for s in steps
        ]
        if device == "cuda"
        else [],
        "top_device": _top(averages, "self_device_time_total") if device == "cuda" else [],
        "top_cpu": _top(averages, "self_cpu_time_total"),
    }


def _on_cpu(event) -> bool:
    return getattr(event, "device_type", DeviceType.CPU) == DeviceType.CPU


def _classify(event) -> Optional[str]:
    """Which category an event's time belongs to (None: annotations that span whole steps)."""
    name = event.name
    if name.startswith("ProfilerStep"):
        return None
    if not _on_cpu(event):
        lowered = name.lower()
        if "memcpy" in lowered:
            return "memcpy"
        if "memset" in lowered:
            return "memset"
        return None if getattr(event, "is_user_annotation", False) else "kernel"
    if name.startswith("enumerate(DataLoader)"):
        return "data"
    if name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
        return "runtime"
    if getattr(event, "is_user_annotation", False):
        return None  # Lightning's and the user's record_function spans: whole phases, not work
    return "cpu"


def partition(steps: List[Interval], classes: Dict[str, List[Interval]]) -> Dict[str, float]:
    """Each instant of the steps to the first category (in CATEGORIES order) covering it."""
    covered: List[Interval] = []
    out: Dict[str, float] = {}
    total = _length(_union(steps))
    for key, _ in CATEGORIES:
        if key == "other":
            out[key] = max(0.0, total - _length(covered))
            continue
        mine = _subtract(_intersect(_union(classes.get(key, [])), _union(steps)), covered)
        out[key] = _length(mine)
        covered = _union(covered + mine)
    return out


def _union(intervals: Iterable[Interval]) -> List[Interval]:
    merged: List[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: List[Interval], b: List[Interval]) -> List[Interval]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(a: List[Interval], b: List[Interval]) -> List[Interval]:
    """``a`` minus ``b``; both sorted and disjoint."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def _length(intervals: List[Interval]) -> float:
    return float(sum(end - start for start, end in intervals))


def _top(averages, attribute: str) -> List[Dict[str, Any]]:
    rows = sorted(averages, key=lambda a: getattr(a, attribute, 0.0), reverse=True)
    return [
        {
            "name": a.key,
            "self_us": round(float(getattr(a, attribute, 0.0)), 1),
            "calls": int(a.count),
        }
        for a in rows[:TOP]
        if getattr(a, attribute, 0.0) > 0
    ]


# ---- the page


def save(summary: Dict[str, Any], profiler_dir: str) -> str:
    path = os.path.join(profiler_dir, SUMMARY)
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    return path


def write_page(profiler_dir: str, verdict: Optional[str], title: str) -> Optional[str]:
    """``summary.html`` (self-contained) and ``breakdown.png`` from ``summary.json``; None if there is none."""
    try:
        with open(os.path.join(profiler_dir, SUMMARY)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    png = chart_png(summary)
    with open(os.path.join(profiler_dir, CHART), "wb") as f:
        f.write(png)
    page = render(summary, verdict, title, png)
    path = os.path.join(profiler_dir, PAGE)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def chart_png(summary: Dict[str, Any]) -> bytes:
    fig = chart_figure(summary)
    import matplotlib.pyplot as plt  # lazy: after chart_figure chose the Agg backend

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def chart_figure(summary: Dict[str, Any]):
    """The breakdown as one stacked horizontal bar: a segment per category with time, in CATEGORIES
    order, each as wide as its share of the profiled steps' time (in %)."""
    # lazy: the Agg backend chosen before pyplot is imported (no display on a training node)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    total = summary["step_time_us"] or 1.0
    parts = [(label, summary["breakdown_us"].get(key, 0.0) / total) for key, label in CATEGORIES]
    parts = [(label, share) for label, share in parts if share > 0]
    colors = {"GPU kernels": "#4c72b0", "data loading": "#dd8452", "CPU-side execution": "#55a868"}
    fig, ax = plt.subplots(figsize=(8, 1.9), dpi=100)
    left = 0.0
    for i, (label, share) in enumerate(parts):
        ax.barh([0], [share * 100], left=left, color=colors.get(label, f"C{i + 3}"), label=f"{label} {share:.0%}")
        left += share * 100
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_xlabel("share of the profiled steps' time (%)")
    ms = summary["step_time_us"] / max(1, summary["steps"]) / 1000
    ax.set_title(f"step time breakdown: {summary['steps']} steps, {ms:.1f} ms per step ({summary['device']})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=3, fontsize=8, frameon=False)
    return fig


def render(summary: Dict[str, Any], verdict: Optional[str], title: str, png: bytes) -> str:
    total = summary["step_time_us"] or 1.0
    steps = max(1, summary["steps"])
    rows = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{summary['breakdown_us'].get(key, 0.0) / steps / 1000:.2f}</td>"
        f"<td>{summary['breakdown_us'].get(key, 0.0) / total:.1%}</td></tr>"
        for key, label in CATEGORIES
    )
    busy = summary.get("kernel_busy_per_step") or []
    busy_html = (
        "<p>GPU kernel busy share per profiled step: " + ", ".join(f"{b:.0%}" for b in busy) + "</p>"
        if busy
        else "<p>No GPU in this run: no device kernels to show.</p>"
    )
    image = base64.b64encode(png).decode("ascii")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>Profile summary: {html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; max-width: 70em; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
.verdict {{ background: #f3f6fb; border-left: 4px solid #4c72b0; padding: 0.6em 1em; }}
</style></head><body>
<h1>Profile summary</h1>
<p>{html.escape(title)}: {summary["steps"]} profiled steps on {html.escape(summary["device"])},
{summary["step_time_us"] / steps / 1000:.2f} ms per step.</p>
<h2>Doctor's verdict</h2>
<p class="verdict">{html.escape(verdict or "no verdict: the run did not finish")}</p>
<h2>Where a step's time goes</h2>
<img alt="step time breakdown" src="data:image/png;base64,{image}">
<table><tr><th>part</th><th>ms per step</th><th>share</th></tr>{rows}</table>
<p>Each instant of a step counts once, for the first of these that was happening (the order above),
as TensorBoard's profiler Overview counts it.</p>
{busy_html}
{_ops_table("Top operators by self device time", summary.get("top_device") or [])}
{_ops_table("Top operators by self CPU time", summary.get("top_cpu") or [])}
<p>The full traces are beside this file (<code>*.pt.trace.json</code>): TensorBoard's profiler tab or Perfetto.</p>
</body></html>
"""


def _ops_table(heading: str, rows: List[Dict[str, Any]]) -> str:
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{r['self_us'] / 1000:.2f}</td><td>{r['calls']}</td></tr>"
        for r in rows
    )
    return f"<h2>{heading}</h2><table><tr><th>operator</th><th>self ms (profiled steps)</th><th>calls</th></tr>{body}</table>"
