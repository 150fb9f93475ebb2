"""Reduced-size JPEG decode (``data.decode_scale=auto``): images/s of decode + training transform.

The built-in real JPEGs stored at 256 and 512 px, decoded by PIL and by libjpeg-turbo (simplejpeg),
then the training transform (random resized crop to 64 or 128 px, flip, normalize) as a loader
worker runs it, one process on one core. Each configuration runs ``--rounds`` times, interleaved
(off and auto alternate), and the table gives the median images/s, its min-max, and the ratio of
medians auto / off measured in the same rounds.

    python scripts/bench_decode_scale.py        # writes scripts/results/decode_scale.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.measure.hardware import machine_record  # noqa: E402


def images_per_s(files, decoder: str, image_size: int, scale: str, seconds: float) -> float:
    from trainer.data.decoders import Loader
    from trainer.data.folder import needed_side, transforms_for

    loader = Loader(decoder, cache_in_memory=True, min_side=needed_side(image_size) if scale == "auto" else None)
    transform = transforms_for(image_size, train=True, augment=True)
    for path in files[:20]:
        transform(loader(path))  # warm the in-memory cache and the code paths: decode cost only
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for path in files:
            transform(loader(path))
            done += 1
    return done / (time.perf_counter() - start)


def main() -> None:
    import torch

    from trainer.data.builtin import ensure_builtin

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--out", default=str(ROOT / "scripts" / "results" / "decode_scale"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for stored in (256, 512):
            root = Path(ensure_builtin(str(Path(cache) / str(stored)), 10, stored))
            files = sorted(str(p) for p in root.rglob("*.jpg"))[:100]
            for decoder in ("pil", "turbo"):
                for image_size in (64, 128):
                    runs = {"off": [], "auto": []}
                    for _ in range(args.rounds):
                        for scale in ("off", "auto"):
                            runs[scale].append(images_per_s(files, decoder, image_size, scale, args.seconds))
                    ratios = [a / o for a, o in zip(runs["auto"], runs["off"])]
                    rows.append(
                        {
                            "stored_px": stored,
                            "decoder": decoder,
                            "image_size": image_size,
                            "off_images_per_s": round(statistics.median(runs["off"]), 1),
                            "off_range": [round(min(runs["off"]), 1), round(max(runs["off"]), 1)],
                            "auto_images_per_s": round(statistics.median(runs["auto"]), 1),
                            "auto_range": [round(min(runs["auto"]), 1), round(max(runs["auto"]), 1)],
                            "speedup_median": round(statistics.median(ratios), 2),
                            "speedup_range": [round(min(ratios), 2), round(max(ratios), 2)],
                        }
                    )
                    print(rows[-1], flush=True)
    machine = {
        **machine_record(),
        "python": sys.version.split()[0],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_scale.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    lines = [
        f"# data.decode_scale=auto: decode + training transform, one core ({machine['cpu_kind']} CPU)\n",
        "| stored px | decoder | image_size | off img/s | auto img/s | auto/off (median, min-max of rounds) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['stored_px']} | {r['decoder']} | {r['image_size']} | {r['off_images_per_s']} "
            f"| {r['auto_images_per_s']} | {r['speedup_median']:.2f}x ({r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f}) |"
        )
    (out / "decode_scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
