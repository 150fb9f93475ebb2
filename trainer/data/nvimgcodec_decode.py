"""``data.nvjpeg_library=nvimgcodec``: ``data.decoder=nvjpeg``'s batched decode through NVIDIA's
nvImageCodec (the decoding library under DALI) instead of torchvision's ``decode_jpeg``.

Why it exists: on an H100 torchvision's ``decode_jpeg(device="cuda")`` returned only once the work
already queued on the device had run (``device_decode``'s docstring), so a decode in the prefetch
thread cannot overlap the step. nvImageCodec drives the same nvJPEG (its hardware engine where the
GPU has one), allocates its output images stream-ordered on the stream it is handed, and orders a
decode on that stream: its own streams wait on the device for that stream's earlier work, and that
stream waits for the decode. nvJPEG's own handle still uses the default (synchronizing) allocators,
and nvImageCodec waits on the host for its previous decode at the start of a call. Whether a decode
then runs beside the step is what ``scripts/bench_nvjpeg_overlap.py`` measures (its ``nvimgcodec``
way), on a GPU.

Streams and memory: a batch is decoded on the caller's current stream (the prefetch thread's copy
stream, or the compute stream without prefetching), and ``DeviceDecoder``'s batched crop reads the
images on that same stream. The last batch's images are handed back to the next decode on the same
stream to decode into (nvImageCodec grows a buffer only for a larger image than it held): stream
order puts each write after the crop that read the buffer before, and once the sizes have been seen
a batch allocates no device memory (a batch of another length, or one with a failed file, starts
anew). Reusing an image on another stream would make nvImageCodec wait on the host for the old one,
so the images are kept per stream. The input bytes are kept until the caller's stream has passed
the decode (nvJPEG may copy them to the device after the call returns).

Failures: nvImageCodec returns no image for any failure (a bad file, an allocation, nvJPEG missing),
so a failed file is decoded once more, then tried on the CPU: a file that decodes there stops the
run with what failed; one that does not is a bad sample (``data.on_bad_sample``). A first decode on
each device checks that nvJPEG works before the run's first batch.

Without CUDA the same calls run nvImageCodec's CPU backend (libjpeg-turbo, the pixels of
torchvision's CPU decoder): that is how it is tested on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from typing import List, Optional

import numpy as np
import torch
import torchvision.io

from trainer.errors import ConfigError, TrainingStopped
from trainer.measure import hardware

log = logging.getLogger(__name__)


def _restore(saved: list) -> None:
    for fd, copy in saved:
        os.dup2(copy, fd)
        os.close(copy)


OPTIONAL_LIBRARIES = ("nvjpeg2k", "nvJPEG2000", "nvtiff", "nvTIFF")  # codecs JPEG decoding does not need


@contextlib.contextmanager
def _output_to_log():
    """Route what native code prints to the process's stdout and stderr into the log.

    nvImageCodec's extensions print lines at import for each optional codec library (nvJPEG2000,
    nvTIFF) they cannot load; JPEG decoding needs neither, so those lines go to the debug log and
    any other line (nvJPEG itself missing) is a warning. Redirecting the file descriptors is the
    only way to catch what C code prints; it is done once, at the first import, and skipped where
    it cannot be (a closed descriptor, no temporary file).
    """
    saved: list = []
    try:
        sink = tempfile.TemporaryFile(mode="w+b")
    except OSError:
        yield
        return
    with sink:
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
            printed = re.sub(r"\x1b\[[0-9;]*m", "", sink.read().decode(errors="replace"))  # no colour codes
            for line in printed.splitlines():
                if line.strip():
                    optional = any(name in line for name in OPTIONAL_LIBRARIES)
                    log.log(logging.DEBUG if optional else logging.WARNING, "nvImageCodec at import: %s", line)


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


def host_threads() -> int:
    """nvImageCodec's host threads (header parsing; on GPUs without a JPEG engine part of the Huffman
    decoding): half the cores this run may use (its affinity mask, quota, Slurm allocation), at most 8,
    beside the loader's workers."""
    return max(1, min(8, hardware.usable_cores() // 2))


def _host_tensor(image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image))  # zero-copy; the array keeps the image alive


def _decodes_on_the_cpu(file: torch.Tensor) -> bool:
    try:
        torchvision.io.decode_jpeg(file)
    except RuntimeError:
        return False
    return True


class BatchDecoder:
    """A list of JPEG files (uint8 CPU tensors) -> a list of uint8 3 x H x W images on ``device``:
    None for a file that is not a decodable JPEG (neither nvImageCodec nor torchvision's CPU decoder
    decodes it). A returned image is valid until the next call (its memory is decoded into again).
    One per ``DeviceDecoder``; safe to call from the prefetch thread and the step loop."""

    BACKENDS = {"cuda": "GPU_ONLY"}  # for measurements: nvJPEG's CUDA decoder alone, not the JPEG engine

    def __init__(self, backend: Optional[str] = None) -> None:
        nvimgcodec()  # not installed: the run stops here, before its first step, saying how to install it
        self.backend = backend  # None: every decoder nvImageCodec has, the JPEG engine first where there is one
        self._decoders: dict = {}
        self._spare: Optional[tuple] = None  # (stream, images): the last batch's, decoded into next on that stream
        self._reuse = True
        self._in_flight: list = []  # (event, code streams): input bytes nvJPEG may still read
        self._lock = threading.Lock()

    def _decoder(self, device: torch.device):
        codec = nvimgcodec()
        key = (device.type, device.index)
        if key not in self._decoders:
            if device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                only = (
                    [codec.Backend(getattr(codec.BackendKind, self.BACKENDS[self.backend]))] if self.backend else None
                )
                decoder = codec.Decoder(device_id=index, max_num_cpu_threads=host_threads(), backends=only)
                self._probe(codec, decoder, device)
            else:
                decoder = codec.Decoder(
                    device_id=codec.NVIMGCODEC_DEVICE_CPU_ONLY,
                    backends=[codec.Backend(codec.BackendKind.CPU_ONLY)],
                    max_num_cpu_threads=1,
                )
            self._decoders[key] = decoder
        return self._decoders[key]

    def prepare(self, device: torch.device) -> None:
        """Make ``device``'s decoder now (on CUDA: and check that it decodes), not at the first batch."""
        with self._lock:
            self._decoder(device)

    @staticmethod
    def _probe(codec, decoder, device: torch.device) -> None:
        """One small JPEG decoded into device memory, or a ConfigError: nvImageCodec reports a missing
        nvJPEG only by returning no image (and a line on stderr at import), as it would a bad file."""
        tiny = torchvision.io.encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
        stream = torch.cuda.current_stream(device)
        image = decoder.decode(codec.CodeStream(tiny.numpy()), cuda_stream=stream.cuda_stream)
        if image is None or image.buffer_kind != codec.ImageBufferKind.STRIDED_DEVICE:
            raise ConfigError(
                f"data.nvjpeg_library=nvimgcodec: nvImageCodec could not decode a JPEG on {device}, most likely "
                "because it cannot load nvJPEG (pip install 'nvidia-nvimgcodec-cu13[nvjpeg]', -cu12 for a torch built "
                "with CUDA 12; the log says what it could not load). Or set data.nvjpeg_library=torchvision."
            )

    def _decode_on(self, decoder, params, streams: list, stream: int) -> list:
        """nvImageCodec's images for ``streams``, decoded on CUDA stream ``stream`` (a pointer), into the
        last batch's images where they were decoded on the same stream: stream order then puts the
        writes after the reads queued before (on another stream, reusing an image makes nvImageCodec
        wait on the host for the stream it was last decoded on)."""
        spare = None
        if self._reuse and self._spare is not None:
            on, images = self._spare
            spare = images if on == stream and len(images) == len(streams) else None
        self._spare = None
        try:
            images = list(decoder.decode(streams, images=spare, params=params, cuda_stream=stream))
        except Exception as e:  # noqa: BLE001 - a library that will not decode into used images
            if spare is None:
                raise
            log.warning("nvImageCodec would not decode into the last batch's images (%s): allocating anew", e)
            self._reuse = False
            images = list(decoder.decode(streams, params=params, cuda_stream=stream))
        failed = [k for k, image in enumerate(images) if image is None]
        if failed:  # any failure (a file, an allocation, a reuse) comes back as None: those once more, anew
            again = decoder.decode([streams[k] for k in failed], params=params, cuda_stream=stream)
            for k, image in zip(failed, again):
                images[k] = image
        elif self._reuse:
            self._spare = (stream, images)
        return images

    def _keep_inputs(self, streams: list, stream: "torch.cuda.Stream") -> None:
        """Keep the batch's code streams (and the pinned bytes they point into) until ``stream`` has
        passed the decode: nvJPEG may copy the bytes to the device after the call returned, and pinned
        memory let go returns to torch's host allocator for the next batch. Never waits."""
        event = torch.cuda.Event()
        event.record(stream)
        self._in_flight = [(e, kept) for e, kept in self._in_flight if not e.query()] + [(event, streams)]

    def __call__(
        self, files: List[torch.Tensor], device: torch.device, names: Optional[List[str]] = None
    ) -> List[Optional[torch.Tensor]]:
        codec = nvimgcodec()
        params = codec.DecodeParams(sample_format=codec.SampleFormat.P_RGB)  # 3 x H x W, as torchvision's
        streams = [codec.CodeStream(f.numpy()) for f in files]
        with self._lock:
            decoder = self._decoder(device)
            if device.type != "cuda":
                images = decoder.decode(streams, params=params)
                to_tensor = _host_tensor
            else:
                stream = torch.cuda.current_stream(device)
                images = self._decode_on(decoder, params, streams, stream.cuda_stream)
                self._keep_inputs(streams, stream)
                to_tensor = torch.from_dlpack
            out: List[Optional[torch.Tensor]] = []
            for k, image in enumerate(images):
                if image is not None:
                    out.append(to_tensor(image))
                elif _decodes_on_the_cpu(files[k]):
                    name = names[k] if names else f"file {k} of the batch"
                    raise TrainingStopped(
                        f"nvImageCodec could not decode {name} on {device}, though the file decodes on the CPU: the "
                        "decode itself failed (device memory, or nvJPEG not usable here; the log may say which). Set "
                        "data.nvjpeg_library=torchvision, or data.decoder=turbo to decode in the loader workers."
                    )
                else:
                    out.append(None)  # not a decodable JPEG: the caller skips it or stops, as data.on_bad_sample says
            return out
