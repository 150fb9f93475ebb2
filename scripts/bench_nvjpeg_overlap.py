"""Can the GPU decode the next batches while it trains? nvJPEG beside a stand-in step, five ways.

Why this exists: on one H100 (torchvision 0.26) a call of torchvision's batched ``decode_jpeg(...,
device="cuda")`` mostly returned only after the work already queued on the device had run, whatever
stream it was on. The trainer's prefetch thread decodes one batch per call, so each decode waits for
the step in flight, then decodes while the step loop waits for it: the JPEG table's nvJPEG row spent
18% of its time there (``recipes/resnet50/RESULTS.md``). This measures, with no model and no
framework, what each way of placing the decode gives:

- ``compute``: the stand-in step alone (bf16 matrix products sized to ``--step-ms``): the ceiling;
- ``serial``: decode, then step, in one thread (what the loader does without a prefetch thread);
- ``thread-K``: a producer thread decoding K batches per ``decode_jpeg`` call (one call over all
  their files, then each batch's crop), up to 2K batches queued ahead, the step loop waiting on
  each batch's event on the device (K=1 is what the trainer does today);
- ``process``: a decoding process of its own (its own CUDA context, whose waits do not see this
  process's work), handing each batch over through CUDA IPC (``torch.multiprocessing``), one ahead;
- ``nvimgcodec-K``: ``thread-K`` with the product's ``data.nvjpeg_library=nvimgcodec`` decode
  (``trainer.data.nvimgcodec_decode``: the same nvJPEG through NVIDIA's nvImageCodec, ordered on the
  producer's stream) in place of torchvision's; ``nvimgcodec_cuda-K`` the same with nvJPEG's CUDA
  decoder only (not the GPU's JPEG engine): whether a wait comes with the engine or the library.

Each way runs ``--steps`` steps after a warm-up; the result is its images/s and its share of
``compute``'s. The step reads its batch (a mean of it enters the products), so a step cannot run
before its batch is decoded. The JPEGs are ``--batch`` images of 256 x 320 px (quality 90, smooth
random content) encoded once, cropped and resized to 224 px by the product's ``resized_crops``.

    python scripts/bench_nvjpeg_overlap.py                        # one CUDA GPU
    python scripts/bench_nvjpeg_overlap.py --device cpu --batch 8 --steps 3 --step-ms 5 --ways compute,serial,thread-2,nvimgcodec-2
                                                                   # does it run? (a CPU rehearsal)

Results go to ``--out`` (default scripts/results/bench_nvjpeg_overlap.json) and a table is printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torchvision.io import decode_jpeg, encode_jpeg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from trainer.data.batched_crops import center_boxes, resized_crops  # noqa: E402

DEFAULT_OUT = ROOT / "scripts" / "results" / "bench_nvjpeg_overlap.json"
HEIGHT, WIDTH, SIZE = 256, 320, 224


def make_jpegs(n: int, seed: int = 0) -> list:
    """n JPEG files of smooth random content (low-frequency noise upsampled), as CPU uint8 tensors."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        low = torch.rand(1, 3, HEIGHT // 16, WIDTH // 16, generator=g)
        image = torch.nn.functional.interpolate(low, size=(HEIGHT, WIDTH), mode="bilinear", align_corners=False)
        out.append(encode_jpeg((image[0] * 255).to(torch.uint8), quality=90))
    return out


def decode_batches(files: list, k: int, batch: int, device: torch.device, codec=None) -> list:
    """k batches in one decode call (torchvision's, or ``codec``: an nvimgcodec_decode.BatchDecoder),
    then each batch's center crop to SIZE: uint8 N x 3 x SIZE x SIZE each."""
    images = decode_jpeg(files * k, device=device) if codec is None else codec(files * k, device)
    boxes = center_boxes([(HEIGHT, WIDTH)] * batch, int(SIZE / 0.875), SIZE)
    flips = torch.zeros(batch, dtype=torch.bool)
    return [resized_crops(images[i * batch : (i + 1) * batch], boxes, flips, SIZE) for i in range(k)]


class Step:
    """The stand-in training step: bf16 matrix products, the batch's mean entering the first."""

    def __init__(self, device: torch.device, step_ms: float) -> None:
        self.device = device
        dim = 8192 if device.type == "cuda" else 256
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.a = torch.randn(dim, dim, device=device, dtype=dtype)
        self.c = torch.empty_like(self.a)
        self.n = 1
        if device.type == "cuda":  # calibrate: products per step for step_ms
            self.run(None)
            torch.cuda.synchronize(device)
            t = time.perf_counter()
            for _ in range(10):
                self.run(None)
            torch.cuda.synchronize(device)
            self.n = max(1, round(step_ms / ((time.perf_counter() - t) / 10 * 1e3)))

    def run(self, batch) -> None:
        x = self.a if batch is None else self.a + batch.float().mean().to(self.a.dtype)
        for _ in range(self.n):
            torch.mm(x, self.a, out=self.c)


CODEC_WAYS = {"nvimgcodec": None, "nvimgcodec_cuda": "cuda"}  # way name -> BatchDecoder's backend


def codec(backend=None):
    """The product's nvImageCodec batch decode (data.nvjpeg_library=nvimgcodec); ``backend="cuda"``:
    nvJPEG's CUDA decoder only."""
    from trainer.data.nvimgcodec_decode import BatchDecoder

    return BatchDecoder(backend)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, steps: int, body) -> float:
    """Seconds for ``steps`` calls of body(i) after 3 warm-up calls, the device synchronized around."""
    for i in range(3):
        body(i)
    sync(device)
    t = time.perf_counter()
    for i in range(steps):
        body(i)
    sync(device)
    return time.perf_counter() - t


def way_compute(step: Step, files, args, device) -> float:
    return timed(device, args.steps, lambda i: step.run(None))


def way_serial(step: Step, files, args, device) -> float:
    return timed(device, args.steps, lambda i: step.run(decode_batches(files, 1, args.batch, device)[0]))


def way_thread(step: Step, files, args, device, k: int, codec=None) -> float:
    ready: "queue.Queue" = queue.Queue(maxsize=2 * k)
    stop = threading.Event()
    side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def produce() -> None:
        try:
            if side is not None:
                torch.cuda.set_device(device)
            while not stop.is_set():
                if side is not None:
                    with torch.cuda.stream(side):
                        batches = decode_batches(files, k, args.batch, device, codec)
                        event = torch.cuda.Event()
                        event.record(side)
                else:
                    batches, event = decode_batches(files, k, args.batch, device, codec), None
                put(batches, event)
        except BaseException as e:  # the step loop raises it instead of waiting for ever
            put([e], None)

    def put(batches, event) -> None:
        for b in batches:
            while not stop.is_set():
                try:
                    ready.put((b, event), timeout=0.1)
                    break
                except queue.Full:
                    continue

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()

    def body(i: int) -> None:
        batch, event = ready.get(timeout=120)
        if isinstance(batch, BaseException):
            raise batch
        if event is not None:
            torch.cuda.current_stream(device).wait_event(event)
            batch.record_stream(torch.cuda.current_stream(device))
        step.run(batch)

    try:
        return timed(device, args.steps, body)
    finally:
        stop.set()
        while thread.is_alive():
            try:
                ready.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.1)


def _decoder_process(files, batch: int, device_index: int, out, stop) -> None:
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    keep = []  # CUDA IPC: the producer keeps a tensor alive while the consumer may still read it
    while not stop.is_set():
        b = decode_batches(files, 1, batch, device)[0]
        torch.cuda.current_stream(device).synchronize()  # decoded before the handle is sent
        keep = [*keep[-4:], b]
        while not stop.is_set():
            try:
                out.put(b, timeout=0.1)
                break
            except queue.Full:
                continue


def way_process(step: Step, files, args, device) -> float:
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(maxsize=2), ctx.Event()
    proc = ctx.Process(target=_decoder_process, args=(files, args.batch, device.index or 0, out, stop), daemon=True)
    proc.start()
    held: list = []  # a received batch freed right after its step would make the host wait for that step

    def body(i: int) -> None:
        batch = out.get(timeout=120)
        step.run(batch)
        held[:] = [*held[-2:], batch]

    try:
        return timed(device, args.steps, body)
    finally:
        stop.set()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--batch", type=int, default=256, help="images per batch (default 256)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per way (default 40)")
    p.add_argument("--step-ms", type=float, default=45.0, help="the stand-in step's device time (default 45 ms)")
    p.add_argument(
        "--ways",
        default="compute,serial,thread-1,thread-2,thread-3,process,nvimgcodec-1,nvimgcodec-2,nvimgcodec_cuda-1",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but torch sees no CUDA GPU here")
    files = make_jpegs(args.batch)
    step = Step(device, args.step_ms)
    rows = []
    for way in args.ways.split(","):
        if (way == "process" or way.startswith("nvimgcodec_cuda-")) and device.type != "cuda":
            continue  # CUDA IPC needs CUDA, as nvJPEG's CUDA decoder does
        try:
            if way.startswith("thread-"):
                seconds = way_thread(step, files, args, device, int(way.split("-")[1]))
            elif way.split("-")[0] in CODEC_WAYS:  # on a CPU: nvImageCodec's CPU decoder
                name, k = way.split("-")
                seconds = way_thread(step, files, args, device, int(k), codec(CODEC_WAYS[name]))
            else:
                seconds = {"compute": way_compute, "serial": way_serial, "process": way_process}[way](
                    step, files, args, device
                )
        except Exception as e:  # one way failing leaves the others' numbers
            rows.append({"way": way, "error": f"{type(e).__name__}: {e}"})
            print(f"  {way:10s} failed: {rows[-1]['error']}", flush=True)
            continue
        rows.append(
            {"way": way, "seconds": round(seconds, 4), "images_per_s": round(args.steps * args.batch / seconds, 1)}
        )
        print(
            f"  {way:10s} {rows[-1]['images_per_s']:10.1f} images/s ({seconds:.3f} s for {args.steps} steps)",
            flush=True,
        )
    base = next((r["images_per_s"] for r in rows if r["way"] == "compute"), None)
    for r in rows:
        if "images_per_s" in r:
            r["of_compute"] = round(r["images_per_s"] / base, 3) if base else None

    def alone(lib) -> float:
        """ms to decode and crop one batch with nothing else on the device (median of 3 x 3)."""
        return round(
            statistics.median(
                timed(device, 3, lambda i: decode_batches(files, 1, args.batch, device, lib)) / 3 for _ in range(3)
            )
            * 1e3,
            2,
        )

    decode_alone = {"torchvision": alone(None)}
    for name, backend in CODEC_WAYS.items():
        if any(r["way"].split("-")[0] == name and "error" not in r for r in rows):
            decode_alone[name] = alone(codec(backend))
    result = {
        "what": "nvJPEG beside a stand-in step (scripts/bench_nvjpeg_overlap.py)",
        "settings": {
            "batch": args.batch,
            "steps": args.steps,
            "step_ms": args.step_ms,
            "products_per_step": step.n,
            "image": f"{HEIGHT}x{WIDTH} JPEG q90 -> {SIZE} px",
        },  # fmt: skip
        "machine": {
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        },
        "decode_alone_ms": decode_alone["torchvision"],
        "decode_alone_ms_by_library": decode_alone,
        "rows": rows,
    }
    print("decode and crop of one batch alone: " + ", ".join(f"{k} {v} ms" for k, v in decode_alone.items()))
    for r in rows:
        print(f"  {r['way']:10s} {r.get('of_compute') if r.get('of_compute') is not None else '-'} of compute")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
