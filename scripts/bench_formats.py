"""Which data format should I use? Image folder vs packed vs Parquet vs WebDataset shards, each from local
disk, from an S3 API read directly, and from S3 through ``data.cache``: epoch time, data-wait
fraction, the doctor's verdict and val_acc, one table.

The data is the built-in real JPEGs (10 classes, 1000 train + 250 val images stored at 160 px),
trained by the tiny CNN at 64 px crops, batch 32, 4 epochs (the first is warm-up), 0 loader
workers (on 2 cores a worker competes with the training process; see builtin_pipeline/). Parquet:
4 files of 5 row groups of 50 images; WebDataset: 20 shards of 50; ``data.shuffle_window=100``, so
a process holds 4 blocks at a time and reads every block again each epoch. The S3
endpoint is moto's server on 127.0.0.1 (in-memory, loopback): it shows the cost of going through
an object-store API (request overhead, no page cache), not a real network's latency. Each
configuration runs ``--rounds`` times, interleaved, and the table gives the median epoch time.

    python scripts/bench_formats.py                       # writes scripts/results/data_formats/
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

FORMATS = ("imagefolder", "packed", "parquet", "webdataset")
SOURCES = ("local disk", "S3 direct", "S3 + data.cache")
# shuffle_window 100 over blocks of 50: a process holds 4 of the 20 blocks at a time, so every epoch
# reads its blocks again (a window as large as this small dataset would keep all of it in memory and
# hide the storage)
COMMON = [
    "data.image_size=64",
    "data.batch_size=32",
    "trainer.max_epochs=4",
    "data.num_workers=0",
    "data.shuffle_window=100",
    "checkpoint.enabled=false",
    "trainer.enable_progress_bar=false",
]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "scripts" / "results" / "data_formats"))
    args = parser.parse_args()

    from s3server import S3Server

    from trainer.data.builtin import ensure_builtin
    from trainer.data.pack import pack

    work = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    source = ensure_builtin(str(work / "builtin"), 100, 160)
    roots = {"imagefolder": source}
    pack(source, str(work / "packed"), 64)
    pack(source, str(work / "parquet"), fmt="parquet", shard_samples=250, group_rows=50)
    pack(source, str(work / "webdataset"), fmt="webdataset", shard_samples=50)
    roots.update(packed=str(work / "packed"), parquet=str(work / "parquet"), webdataset=str(work / "webdataset"))

    server = S3Server(work / "moto.log")
    try:
        fs = server.fs()
        fs.mkdir("bench")
        for name, root in roots.items():
            fs.put(root.rstrip("/") + "/", f"bench/{name}", recursive=True)
        env = dict(__import__("os").environ, **server.env())
        results = {}
        for rnd in range(args.rounds):
            for fmt in FORMATS:
                for src in SOURCES:
                    run_dir = work / "runs" / f"{fmt}-{src.replace(' ', '_').replace('+', '')}-{rnd}"
                    root = roots[fmt] if src == "local disk" else f"s3://bench/{fmt}"
                    extra = [f"data.cache={work / 'cache' / run_dir.name}"] if "cache" in src else []
                    cmd = [
                        sys.executable,
                        str(ROOT / "train.py"),
                        f"data={fmt}",
                        f"data.root={root}",
                        *COMMON,
                        *extra,
                        f"hydra.run.dir={run_dir}",
                    ]
                    start = time.time()
                    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
                    wall = time.time() - start
                    if r.returncode != 0:
                        print(r.stderr[-2000:], file=sys.stderr)
                        raise SystemExit(f"{fmt} / {src} failed")
                    m = json.loads((run_dir / "metrics.json").read_text())
                    results.setdefault((fmt, src), []).append(
                        {
                            "epoch_time_s": m["epoch_time_s"],
                            "data_wait": m["data_wait_fraction"],
                            "val_acc": m["val_acc"],
                            "bottleneck": m["diagnosis"]["bottleneck"],
                            "verdict": m["diagnosis"]["verdict"],
                            "wall_s": round(wall, 1),
                        }
                    )
                    print(
                        f"round {rnd} {fmt:11s} {src:16s} {m['epoch_time_s']:.3f} s/epoch, data wait {m['data_wait_fraction']:.0%}, "
                        f"val_acc {m['val_acc']:.3f}, {m['diagnosis']['bottleneck']}, wall {wall:.0f} s",
                        flush=True,
                    )
    finally:
        server.stop()

    base = statistics.median(r["epoch_time_s"] for r in results[("imagefolder", "local disk")])
    rows = []
    for (fmt, src), runs in results.items():
        t = statistics.median(r["epoch_time_s"] for r in runs)
        rows.append(
            {
                "format": fmt,
                "source": src,
                "epoch_time_s": round(t, 3),
                "min_s": min(r["epoch_time_s"] for r in runs),
                "max_s": max(r["epoch_time_s"] for r in runs),
                "speedup_vs_imagefolder_local": round(base / t, 2),
                "data_wait": round(statistics.median(r["data_wait"] for r in runs), 3),
                "val_acc": runs[0]["val_acc"],
                "bottleneck": runs[0]["bottleneck"],
                "verdict": runs[0]["verdict"],
                "wall_s_first_round": runs[0]["wall_s"],
            }
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{_cpu()}, {__import__('os').cpu_count()} cores, torch {__import__('torch').__version__}, Python {platform.python_version()}"
    (out / "formats.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "date": time.strftime("%Y-%m-%d"),
                "rounds": args.rounds,
                "settings": COMMON,
                "rows": rows,
            },
            indent=1,
        )
    )
    lines = [
        "# Data formats: image folder vs packed vs Parquet vs WebDataset, from disk and from S3",
        "",
        f"Machine: {machine}; {time.strftime('%Y-%m-%d')}. Made by `python scripts/bench_formats.py` ({args.rounds} rounds, interleaved; "
        "median epoch time of the steady epochs, min-max over rounds). Built-in JPEGs (1000 train / 250 val, stored at 160 px), tiny CNN, "
        "64 px crops, batch 32, 4 epochs (1 warm-up), 0 loader workers; Parquet row groups and WebDataset shards of 50 images, "
        "data.shuffle_window=100 (a process holds 4 of the 20 blocks, so each epoch reads "
        "them again). S3 = moto's server on 127.0.0.1 (in memory, loopback): the cost of "
        'the object-store API, not of a real network. "wall" is the whole first-round process (with S3 + data.cache it includes the copy).',
        "",
        "| format | source | s/epoch (min-max) | vs image folder on disk | data wait | val_acc | doctor | wall (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['format']} | {r['source']} | {r['epoch_time_s']:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f}) | {r['speedup_vs_imagefolder_local']:.2f}x | "
            f"{r['data_wait']:.0%} | {r['val_acc']:.3f} | {r['bottleneck']} | {r['wall_s_first_round']:.0f} |"
        )
    (out / "formats.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
