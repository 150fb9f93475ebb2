"""Data-only benchmark: how fast can the input pipeline alone deliver batches? (no model, no training)

Why it exists: the model's step rate is only half the story. If the loader alone cannot deliver
more images/s than the model consumes, the run is input-bound whatever flags the model gets. This
builds the train loader exactly as ``train.py`` would (same config composition, same datamodule),
iterates it for a fixed number of batches per configuration after one warm-up pass, and prints
images/s per configuration, to put next to the report's samples/s.

    python scripts/bench_data.py                                   # built-in JPEGs: decoders x workers
    python scripts/bench_data.py --config "data=packed data.root=DIR" --config "data=packed data.root=DIR data.num_workers=1"
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT = [
    f"data=builtin data.image_size=64 data.decoder={d} data.num_workers={w}"
    for w in (0, 1)
    for d in ("pil", "torchvision", "turbo")
]


def loader_images_per_s(overrides, batches: int, repeats: int) -> dict:
    from trainer.config.compose import compose_for_run
    from trainer.data import ImageDataModule

    cfg = compose_for_run(overrides)
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    rates = []
    for r in range(repeats + 1):  # the first pass warms the page cache and starts the workers
        n, start = 0, time.perf_counter()
        for i, (x, _) in enumerate(dm.train_dataloader()):
            n += x.shape[0]
            if i + 1 >= batches:
                break
        if r:
            rates.append(n / (time.perf_counter() - start))
    return {
        "overrides": overrides,
        "images_per_s": round(statistics.median(rates), 1),
        "decoder": dm.decoder,
        "num_workers": dm.num_workers,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="overrides for one configuration (repeatable)")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "scripts" / "results" / "bench_data.json"))
    args = p.parse_args(argv)
    results = []
    for config in args.config or DEFAULT:
        res = loader_images_per_s(shlex.split(config), args.batches, args.repeats)
        results.append(res)
        print(f"{res['images_per_s']:9.1f} images/s  {config}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
