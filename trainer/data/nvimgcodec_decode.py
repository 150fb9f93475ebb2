"""``data.nvjpeg_library=nvimgcodec``: ``data.decoder=nvjpeg``'s batched decode through NVIDIA's
nvImageCodec (the decoding library under DALI) instead of torchvision's ``decode_jpeg``.

Why it exists: on an H100 torchvision's ``decode_jpeg(device="cuda")`` returned only once the work
already queued on the device had run (``device_decode``'s docstring), so a decode in the prefetch
thread cannot overlap the step. nvImageCodec drives the same nvJPEG (its hardware engine where the
GPU has one) through allocators of its own that are given the stream they serve, and orders a decode
on the stream it is handed: it waits on the device for that stream's earlier work, and that stream
waits for the decode. Whether that lets a decode run beside the step is what
``scripts/bench_nvjpeg_overlap.py`` measures (its ``nvimgcodec`` way), on a GPU.

Streams and memory: a batch is decoded on the caller's current stream (the prefetch thread's copy
stream, or the compute stream without prefetching), and ``DeviceDecoder``'s batched crop reads the
images on that same stream, so nothing else is needed to keep the crop's reads ahead of the next
decode's writes. The last batch's decoded images are handed back to the next decode to decode into
(nvImageCodec grows a buffer only for a larger image than it held): once the image sizes have been
seen, a batch allocates and frees no device memory, and stream order puts each write after the crop
that read the buffer before.

Without CUDA the same calls run nvImageCodec's CPU backend (libjpeg-turbo, the pixels of
torchvision's CPU decoder): that is how it is tested on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from typing import List, Optional

import numpy as np
import torch

from trainer.errors import ConfigError

log = logging.getLogger(__name__)

LIBRARIES = ("torchvision", "nvimgcodec")  # data.nvjpeg_library


def _restore(saved: list) -> None:
    for fd, copy in saved:
        os.dup2(copy, fd)
        os.close(copy)


@contextlib.contextmanager
def _output_to_log():
    """Route what native code prints to the process's stdout and stderr into the log (debug).

    nvImageCodec's extensions print a line at import for each optional codec library (nvJPEG2000,
    nvTIFF) that is not installed; JPEG decoding needs neither. Redirecting the file descriptors is
    the only way to catch what C code prints; it is done once, at the first import, and skipped
    where a descriptor cannot be copied (a closed stream).
    """
    saved: list = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        for stream in (sys.stdout, sys.stderr):  # Python's buffered text goes out first, where it belongs
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            for fd in (1, 2):
                saved.append((fd, os.dup(fd)))
                os.dup2(sink.fileno(), fd)
        except OSError:
            _restore(saved)
            saved = []
        try:
            yield
        finally:
            _restore(saved)
            sink.seek(0)
            printed = sink.read().decode(errors="replace").strip()
            if printed:
                log.debug("nvImageCodec at import: %s", printed)


_MODULE = None
_IMPORT_LOCK = threading.Lock()


def nvimgcodec():
    """The ``nvidia.nvimgcodec`` module, imported once; a ConfigError saying how to install it if it is not."""
    global _MODULE
    with _IMPORT_LOCK:
        if _MODULE is None:
            try:
                with _output_to_log():
                    from nvidia import nvimgcodec as module
            except ImportError as e:
                cuda = (torch.version.cuda or "13").split(".")[0]
                wheel = "nvidia-nvimgcodec-cu12[nvjpeg]" if cuda == "12" else "nvidia-nvimgcodec-cu13[nvjpeg]"
                raise ConfigError(
                    f"data.nvjpeg_library=nvimgcodec needs NVIDIA's nvImageCodec, which is not installed here ({e}). "
                    f"Install it with pip install '{wheel}' (the trainer's extra: pip install -e '.[nvimgcodec]'; "
                    "the -cu12 wheel for a torch built with CUDA 12), or set data.nvjpeg_library=torchvision."
                ) from None
            _MODULE = module
        return _MODULE


def _cpu_threads() -> int:
    """nvImageCodec's host threads (header parsing; on GPUs without a JPEG engine part of the Huffman
    decoding): half the cores, at most 8, beside the loader's workers."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class BatchDecoder:
    """A list of JPEG files (uint8 CPU tensors) -> a list of uint8 3 x H x W images on ``device``
    (None where a file could not be decoded). One per ``DeviceDecoder``; safe to call from the
    prefetch thread and the step loop (one call at a time)."""

    def __init__(self) -> None:
        nvimgcodec()  # not installed: the run stops here, before its first step, saying how to install it
        self._decoders: dict = {}
        self._spare: Optional[list] = None  # the last batch's images, decoded into next (CUDA)
        self._reuse = True
        self._lock = threading.Lock()

    def _decoder(self, device: torch.device):
        codec = nvimgcodec()
        key = (device.type, device.index)
        if key not in self._decoders:
            if device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                self._decoders[key] = codec.Decoder(device_id=index, max_num_cpu_threads=_cpu_threads())
            else:
                self._decoders[key] = codec.Decoder(
                    device_id=codec.NVIMGCODEC_DEVICE_CPU_ONLY,
                    backends=[codec.Backend(codec.BackendKind.CPU_ONLY)],
                    max_num_cpu_threads=1,
                )
        return self._decoders[key]

    def __call__(self, files: List[torch.Tensor], device: torch.device) -> List[Optional[torch.Tensor]]:
        codec = nvimgcodec()
        params = codec.DecodeParams(sample_format=codec.SampleFormat.P_RGB)  # 3 x H x W, as torchvision's
        streams = [codec.CodeStream(f.numpy()) for f in files]
        with self._lock:
            decoder = self._decoder(device)
            if device.type != "cuda":
                images = decoder.decode(streams, params=params)
                return [None if im is None else torch.from_numpy(np.asarray(im)) for im in images]
            stream = torch.cuda.current_stream(device).cuda_stream
            spare = self._spare if self._spare is not None and len(self._spare) == len(streams) else None
            try:
                images = decoder.decode(streams, images=spare, params=params, cuda_stream=stream)
            except Exception as e:  # noqa: BLE001 - a library that will not decode into used images
                if spare is None:
                    raise
                log.warning("nvImageCodec would not decode into the last batch's images (%s): allocating anew", e)
                self._reuse = False
                images = decoder.decode(streams, params=params, cuda_stream=stream)
            reusable = self._reuse and all(im is not None for im in images)
            self._spare = images if reusable else None
            return [None if im is None else torch.from_dlpack(im) for im in images]
