"""Does a compile=true job measure the same inside a sweep as alone?

Why this exists: a local sweep runs every job in one process, and torch.compile keeps its state per
process (compiled graphs, guards, automatic-dynamic shapes). Each job now starts from a clean state
(``torch.compiler.reset()`` in ``switchboard.apply_global_settings``) and only the networks are
compiled, never Lightning's ``training_step`` or ``self.log``. This checks the claim from outside:
the second job of ``train.py -m compile=true data.batch_size=16,32`` against the same batch-32 job
run alone, each in its own process, repeated and interleaved (sweep, alone, sweep, alone, ...; the
first round is a warm-up for the on-disk inductor cache and is not counted).

Compared: the batch-32 job's ``compile_time_s`` and ``epoch_time_s`` (medians over the counted
rounds, with min-max), and what dynamo logged about recompiling (``TORCH_LOGS=recompiles``): each job
of the sweep should recompile exactly as the job alone does (once, train -> eval), never for a
changed size (a dynamic-shape recompile) and never in Lightning's logging code.

    python scripts/bench_sweep_compile.py                 # 4 rounds (~6 min on 2 cores)
    python scripts/bench_sweep_compile.py --rounds 2      # quick look

Results: scripts/results/sweep_compile.json (every run, the medians, the machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.measure.hardware import machine_record, usable_cores  # noqa: E402

RUN = [
    "compile=true",
    "model.width=16",
    "data.image_size=32",
    "data.num_samples=640",
    "data.val_samples=64",
    "trainer.max_epochs=4",
    "checkpoint.enabled=false",
    "monitor.enabled=false",
]


def _run(args, out: Path) -> dict:
    env = dict(os.environ, TORCH_LOGS="recompiles", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{r.stderr[-3000:]}")
    logs = r.stderr
    reasons = [
        line.split("[__recompiles]", 1)[1].strip()[2:]
        for line in logs.splitlines()
        if "[__recompiles]" in line and line.split("[__recompiles]", 1)[1].strip().startswith("- ")
    ]
    return {"reasons": reasons, "dir": str(out)}


def _job(metrics_path: Path) -> dict:
    m = json.loads(metrics_path.read_text())
    return {"compile_time_s": m["compile_time_s"], "epoch_time_s": m["epoch_time_s"], "batch_size": m["batch_size"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", type=Path, default=ROOT / "scripts" / "results" / "sweep_compile.json")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_sweep_compile."))
    rounds = []
    for n in range(args.rounds):
        sweep_dir, alone_dir = tmp / f"sweep{n}", tmp / f"alone{n}"
        sweep = _run(["-m", *RUN, "data.batch_size=16,32", f"hydra.sweep.dir={sweep_dir}"], sweep_dir)
        alone = _run([*RUN, "data.batch_size=32", f"hydra.run.dir={alone_dir}"], alone_dir)
        # the sweep's log holds both jobs: the second job's part begins with its own header line
        # dynamo logs to stderr, both jobs of the sweep together: each of the two jobs should recompile
        # exactly as the job alone does (train -> eval), nothing more
        rounds.append(
            {
                "in_sweep": _job(sweep_dir / "1" / "metrics.json"),
                "alone": _job(alone_dir / "metrics.json"),
                "sweep_reasons": sweep["reasons"],
                "alone_reasons": alone["reasons"],
                "same_recompiles_per_job": sorted(sweep["reasons"]) == sorted(alone["reasons"] * 2),
            }
        )
        print(
            f"round {n}: in sweep {rounds[-1]['in_sweep']['compile_time_s']} s compile, {rounds[-1]['in_sweep']['epoch_time_s']} s/epoch; "
            f"alone {rounds[-1]['alone']['compile_time_s']} s, {rounds[-1]['alone']['epoch_time_s']} s/epoch",
            flush=True,
        )
    counted = rounds[1:] if len(rounds) > 1 else rounds

    def stats(side: str, key: str) -> dict:
        values = [r[side][key] for r in counted]
        return {"median": round(statistics.median(values), 4), "min": min(values), "max": max(values), "values": values}

    every_reason = [x for r in rounds for x in r["sweep_reasons"] + r["alone_reasons"]]
    summary = {
        "in_sweep": {k: stats("in_sweep", k) for k in ("compile_time_s", "epoch_time_s")},
        "alone": {k: stats("alone", k) for k in ("compile_time_s", "epoch_time_s")},
        "size_recompiles": sum("size mismatch" in x for x in every_reason),
        "logging_frames_recompiled": sum(bool(re.search(r"\blog\b|_log_dict|training_step", x)) for x in every_reason),
        "recompile_reasons": sorted(set(every_reason)),
        "every_sweep_job_recompiled_as_alone": all(r["same_recompiles_per_job"] for r in rounds),
    }
    result = {
        "what": "the batch-32 job of `train.py -m compile=true data.batch_size=16,32` vs the same job alone; rounds interleaved, the first not counted",
        "command": ["train.py", *RUN],
        "machine": {
            **machine_record(),
            "usable_cores": usable_cores(),
            "python": platform.python_version(),
            "date": datetime.date.today().isoformat(),
        },
        "summary": summary,
        "rounds": [{k: v for k, v in r.items()} for r in rounds],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    s = summary
    print(
        f"compile_time_s: in sweep {s['in_sweep']['compile_time_s']['median']} "
        f"({s['in_sweep']['compile_time_s']['min']}-{s['in_sweep']['compile_time_s']['max']}) "
        f"vs alone {s['alone']['compile_time_s']['median']} ({s['alone']['compile_time_s']['min']}-{s['alone']['compile_time_s']['max']})"
    )
    print(
        f"epoch_time_s: in sweep {s['in_sweep']['epoch_time_s']['median']} ({s['in_sweep']['epoch_time_s']['min']}-{s['in_sweep']['epoch_time_s']['max']}) "
        f"vs alone {s['alone']['epoch_time_s']['median']} ({s['alone']['epoch_time_s']['min']}-{s['alone']['epoch_time_s']['max']})"
    )
    print(
        f"recompiles for a changed size: {s['size_recompiles']}; of logging code: {s['logging_frames_recompiled']}; reasons seen: {s['recompile_reasons']}; "
        f"each sweep job recompiled as the job alone: {s['every_sweep_job_recompiled_as_alone']}"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
