"""Benchmark of python -m trainer.tune against an exhaustive sweep of the same flags.

For each case (the tiny CNN on synthetic data; ResNet-50 at smoke scale on the built-in JPEGs) it
runs every combination of the candidates on/off, each as its own process with the probe settings
the tuner uses, one after another; then the tuner restricted to the same candidates. Every
configuration's time is computed the way the tuner computes it (median steady epoch scaled to a
full epoch, compile time spread over the horizon), so the tuned configuration's speed-up can be
read inside the exhaustive sweep's own measurements and compared with the best one there.

    python scripts/bench_tune.py --out scripts/results/tune [--cases tiny resnet50]

Writes <out>/<case>.md and <out>/<case>.json; the runs themselves go under --work.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.tune.candidates import CATALOGUE  # noqa: E402
from trainer.tune.probe import result_of, run_settings  # noqa: E402
from trainer.tune.search import merge  # noqa: E402

CASES = {
    "tiny": {
        "base": ["data.batch_size=32", "data.image_size=32", "model.width=32"],
        "flags": ["workers", "amp", "channels_last", "compile", "fused_optimizer"],
    },
    "resnet50": {
        "base": ["+recipe=resnet50", "scale=smoke", "data=builtin"],
        "flags": ["workers", "decoder_torchvision", "amp", "channels_last", "compile"],
    },
}
PROBE = {"probe_batches": 10, "probe_epochs": 4, "horizon_epochs": 10, "verify_epochs": 3}


def probe(base: list, config: list, run_dir: Path, full_samples: float) -> tuple:
    """One configuration as the tuner probes it (its own process, the tuner's probe settings):
    (ok, full-epoch time computed the tuner's way or None, compile s, wall s, error)."""
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.cli",
            *base,
            *config,
            *run_settings("probe", SimpleNamespace(**PROBE)),
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env=dict(os.environ, TRAINER_QUIET_CONSOLE="1"),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0 or not (run_dir / "metrics.json").exists():
        return False, None, None, wall, done.stderr[-2000:]
    r = result_of(run_dir, config)
    time_s = statistics.median(r.epoch_times(full_samples, PROBE["horizon_epochs"])) if r.ok else None
    return r.ok, time_s, r.compile_s, wall, r.error


def machine() -> str:
    import torch

    from trainer.measure import hardware

    hw = hardware.detect("auto")
    native = "native bf16" if hw.bf16_native else "no native bf16"
    return f"{hw.name} ({hw.accelerator}, {hw.cpu_cores} usable cores, {native}), torch {torch.__version__}, {platform.node()}"


def run_case(name: str, out: Path, work_root: Path) -> dict:
    case = CASES[name]
    by_name = {c.name: c for c in CATALOGUE}
    work = work_root / name
    if work.exists():  # a tune would resume from its old journal and train.py refuses finished run dirs
        raise SystemExit(f"{work} exists: give a new --work folder (old runs would be read instead of measured)")
    work.mkdir(parents=True)
    env = dict(os.environ, TRAINER_QUIET_CONSOLE="1")

    # the tuner first: its baseline training gives the full epoch length the times are scaled to
    tune_dir = work / "tune"
    start = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.tune",
            *case["base"],
            f"hydra.run.dir={tune_dir}",
            f"tune.only=[{','.join(case['flags'])}]",
            *(f"tune.{k}={v}" for k, v in PROBE.items()),
            "tune.budget_min=60",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    tune_wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"tune failed: {r.stderr[-3000:]}")
    import yaml

    winner = yaml.safe_load((tune_dir / "best.yaml").read_text())["overrides"]
    journal = [json.loads(line) for line in (tune_dir / "tune_journal.jsonl").read_text().splitlines()[1:]]
    full = next(j["epoch_samples"] for j in journal if j["kind"] == "verify" and j["config"] == [])
    tune_rows = list(__import__("csv").DictReader(open(tune_dir / "tune_report.csv")))
    final = next((row for row in tune_rows if row["decision"] == "final"), None)

    # the exhaustive sweep: every combination, each its own process, one after another
    rows = []
    start = time.perf_counter()
    for bits in itertools.product([False, True], repeat=len(case["flags"])):
        on = [f for f, b in zip(case["flags"], bits) if b]
        config: list = []
        for f in on:
            config = merge(config, by_name[f].overrides)
        run_dir = work / "exhaustive" / ("+".join(on) or "baseline")
        _, time_s, compile_s, wall, _ = probe(case["base"], config, run_dir, full)
        rows.append(
            {"flags": on, "config": config, "time_s": time_s, "compile_s": compile_s or None, "wall_s": round(wall, 1)}
        )
    exhaustive_wall = time.perf_counter() - start

    base_t = rows[0]["time_s"]
    for row in rows:
        row["speedup"] = round(base_t / row["time_s"], 3) if row["time_s"] else None
    best = max((row for row in rows if row["speedup"]), key=lambda row: row["speedup"])
    tuned = next((row for row in rows if sorted(row["config"]) == sorted(winner)), rows[0])
    result = {
        "case": name,
        "base": case["base"],
        "flags": case["flags"],
        "probe": PROBE,
        "full_epoch_samples": full,
        "machine": machine(),
        "tune": {
            "winner": winner,
            "wall_s": round(tune_wall, 1),
            "own_speedup": final and final["speedup"],
            "own_ci": final and final["speedup_ci"],
            "probes": len(journal),
        },
        "exhaustive": {
            "configs": len(rows),
            "wall_s": round(exhaustive_wall, 1),
            "best": best["flags"],
            "best_speedup": best["speedup"],
        },
        "tuned_in_exhaustive": tuned["speedup"],
        "fraction_of_best": round(tuned["speedup"] / best["speedup"], 3) if tuned["speedup"] else None,
        "time_fraction": round(tune_wall / exhaustive_wall, 3),
        "rows": rows,
    }
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    md = [
        f"# trainer.tune vs an exhaustive sweep: {name}",
        "",
        f"Machine: {result['machine']}. Base: `{' '.join(case['base'])}`. Candidates: {', '.join(case['flags'])} "
        f"({len(rows)} combinations). Probe: {PROBE['probe_epochs']} epochs x {PROBE['probe_batches']} steps (first a warm-up), "
        f"times scaled to a full epoch of {full:g} samples, compile spread over {PROBE['horizon_epochs']} epochs.",
        "",
        f"- tuner: `{' '.join(winner) or '(as given)'}`, {len(journal)} runs, {tune_wall / 60:.1f} min; its own measurement "
        f"{final['speedup'] if final else 'n/a'}x ({final['speedup_ci'] if final else ''}) vs the configuration as given",
        f"- exhaustive: best `{'+'.join(best['flags']) or 'baseline'}` {best['speedup']}x, {exhaustive_wall / 60:.1f} min",
        f"- the tuned configuration inside the exhaustive sweep: {tuned['speedup']}x = {result['fraction_of_best']:.0%} of the best, "
        f"in {result['time_fraction']:.0%} of the time",
        "",
        "| flags on | full-epoch time (s) | speedup | compile (s) | run wall (s) |",
        "|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda row: -(row["speedup"] or 0)):
        md.append(
            f"| {'+'.join(row['flags']) or 'baseline'} | {row['time_s'] and round(row['time_s'], 3)} "
            f"| {row['speedup']} | {row['compile_s'] or ''} | {row['wall_s']} |"
        )
    (out / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:8]), flush=True)
    return result


def confirm(name: str, out: Path, work_root: Path, rounds: int = 3) -> dict:
    """Measure the baseline, the tuned configuration and the exhaustive best again, interleaved.

    The exhaustive best is the maximum of many single noisy measurements, so it is biased upwards
    (the winner's curse); the tuned one was chosen on the tuner's own probes. Re-measuring the
    three side by side, several rounds, is the fair comparison of the two."""
    result = json.loads((out / f"{name}.json").read_text())
    case = CASES[name]
    rows = {"+".join(r["flags"]) or "baseline": r for r in result["rows"]}
    best = rows["+".join(result["exhaustive"]["best"]) or "baseline"]
    tuned = next(
        (r for r in result["rows"] if sorted(r["config"]) == sorted(result["tune"]["winner"])), rows["baseline"]
    )
    picks = {"baseline": rows["baseline"]["config"], "tuned": tuned["config"], "exhaustive best": best["config"]}
    times: dict = {k: [] for k in picks}
    for i in range(rounds):
        for label, config in picks.items():
            run_dir = work_root / name / "confirm" / f"{i}-{label.replace(' ', '_')}"
            ok, time_s, _, _, error = probe(case["base"], config, run_dir, result["full_epoch_samples"])
            if not ok:
                raise SystemExit(f"{run_dir} failed: {error}")
            times[label].append(time_s)
    med = {k: statistics.median(v) for k, v in times.items()}
    result["confirm"] = {
        "rounds": rounds,
        "times_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
        "speedup": {k: round(med["baseline"] / med[k], 3) for k in picks},
    }
    result["confirm"]["fraction_of_best"] = round(
        result["confirm"]["speedup"]["tuned"] / result["confirm"]["speedup"]["exhaustive best"], 3
    )
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    c = result["confirm"]
    lines = [
        "",
        f"## Measured again: baseline, tuned and exhaustive best, interleaved, {rounds} rounds",
        "",
        "| configuration | full-epoch times (s) | speedup (medians) |",
        "|---|---|---|",
    ]
    for label, config in picks.items():
        lines.append(
            f"| {label}: `{' '.join(config) or '(as given)'}` | {', '.join(f'{t:.3f}' for t in times[label])} | {c['speedup'][label]}x |"
        )
    lines += ["", f"Tuned / exhaustive best, measured side by side: {c['fraction_of_best']:.0%}."]
    with open(out / f"{name}.md", "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "scripts" / "results" / "tune"))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--work", default="/tmp/bench_tune", help="where the runs go (a new folder)")
    parser.add_argument(
        "--confirm-only", action="store_true", help="only the interleaved re-measurement, on existing results"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.cases:
        if not args.confirm_only:
            run_case(name, out, Path(args.work))
        confirm(name, out, Path(args.work))


if __name__ == "__main__":
    main()
