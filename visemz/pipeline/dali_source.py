"""The DALI loader: image files decoded in batches straight into CUDA tensors.

One DALI pipeline per output dtype::

    fn.readers.file(files=...) -> fn.decoders.image(device="mixed", output_type=ANY_DATA,
                                                    dtype=UINT8 | UINT16, adjust_orientation=False)

JPEG and JPEG 2000 decode on the GPU (nvJPEG, nvJPEG2000), PNG and TIFF on DALI's CPU
threads.  ``ANY_DATA`` keeps the file's channels and ``adjust_orientation=False`` ignores
EXIF, as the CPU loader (OpenCV) does; the dtype matches the file's depth because DALI would
rescale 8-bit samples decoded to UINT16.  Only files that ``probe.decode_target`` vouches for
come here, and every decoded image is checked against that probe.  A file DALI decodes to
another shape, and every file of a batch DALI fails on, goes to the CPU loader with the
reason (a "fallback" in the job's summary); the pipeline is rebuilt for the files after it.

DALI is optional (``pip install nvidia-dali-cuda130``) and imported only when used.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Callable, Iterator

import torch

from .. import defaults
from ..defaults import cpu_threads
from ..errors import DeviceUnavailableError
from ..io.loaders import Picture
from ..models import graphs
from .probe import DecodeTarget

Entry = tuple[int, Path, DecodeTarget]  # (item index, file, what the probe says it decodes to)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


@functools.lru_cache(maxsize=None)
def available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except Exception:  # absent, or built for another CUDA
        return False
    return True


def require():
    if not available():
        raise DeviceUnavailableError("DALI is not installed: pip install nvidia-dali-cuda130")
    import nvidia.dali

    return nvidia.dali


def _pipeline(files: list[str], dtype: str, device_index: int, batch: int):
    require()
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def decode():
        raw, _ = fn.readers.file(files=files, name="reader", pad_last_batch=True, random_shuffle=False)
        return fn.decoders.image(raw, device="mixed", output_type=types.ANY_DATA, adjust_orientation=False,
                                 dtype=types.UINT16 if dtype == "uint16" else types.UINT8)

    pipe = decode(batch_size=batch, num_threads=max(1, min(cpu_threads(), 8)), device_id=device_index,
                  prefetch_queue_depth=2)
    pipe.build()
    return pipe


class DaliFeed:
    """Iterate ``(index, Picture)`` for DALI-decodable entries; ``fallback(index, reason)`` loads
    an entry on the CPU instead (it returns the payload: a Picture or a VisemzError)."""

    def __init__(self, entries: list[Entry], device_index: int, fallback: Callable[[int, str], object],
                 batch: int = 0):
        self.entries, self.device_index, self.fallback = entries, device_index, fallback
        self.batch = batch or defaults.get("dali_batch")

    def __iter__(self) -> Iterator[tuple[int, object]]:
        torch.cuda.set_device(self.device_index)
        stream = torch.cuda.Stream(device=self.device_index)  # DALI's outputs are copied out on it
        for dtype in ("uint8", "uint16"):
            group = [e for e in self.entries if e[2].dtype == dtype]
            yield from self._group(group, dtype, stream)

    def _group(self, group: list[Entry], dtype: str, stream) -> Iterator[tuple[int, object]]:
        pos = 0
        while pos < len(group):
            try:
                pipe = _pipeline([str(p) for _, p, _ in group[pos:]], dtype, self.device_index, self.batch)
            except Exception as e:  # e.g. DALI without its image codec library: the CPU loader takes over
                yield from self._to_cpu(group[pos:], f"DALI pipeline: {_first_line(e)}")
                return
            for start in range(pos, len(group), self.batch):
                batch = group[start : start + self.batch]
                pos = start + len(batch)
                try:
                    with graphs.outside_capture():  # DALI may synchronise or free device memory
                        (out,) = pipe.run()
                except Exception as e:  # DALI raises on a file it cannot decode; the batch goes to the CPU
                    yield from self._to_cpu(batch, f"DALI failed on a batch: {_first_line(e)}")
                    break  # rebuild the pipeline for the files after this batch
                yield from self._deliver(out, batch, dtype, stream)
            del pipe

    def _to_cpu(self, entries: list[Entry], reason: str) -> Iterator[tuple[int, object]]:
        for i, _, _ in entries:
            yield i, self.fallback(i, reason)

    def _deliver(self, out, batch: list[Entry], dtype: str, stream) -> Iterator[tuple[int, object]]:
        try:
            graphs.synchronize(self.device_index)  # DALI decodes on its own streams: let the batch finish
            copies = self._copy_out(out, batch, dtype, stream)
        except Exception as e:  # an interface DALI changed: the CPU loader takes the batch, the reason is listed
            yield from self._to_cpu(batch, f"DALI copy-out: {_first_line(e)}")
            return
        for (i, _, target), pixels in zip(batch, copies):
            if pixels is None:
                yield i, self.fallback(i, f"DALI decoded another shape than the header's {target.shape}")
            else:
                yield i, Picture(pixels, loader="dali")

    def _copy_out(self, out, batch: list[Entry], dtype: str, stream) -> list:
        """CUDA tensors owned by torch (DALI reuses its buffers at the next run); None where the
        decoded shape is not the probed one."""
        tensors = []
        with torch.cuda.stream(stream):
            for k, (_, _, target) in enumerate(batch):
                sample = out[k]
                want = (target.height, target.width, target.channels)
                if tuple(sample.shape()) != want:
                    tensors.append(None)
                    continue
                dst = torch.empty(want, dtype=getattr(torch, dtype), device=f"cuda:{self.device_index}")
                sample.copy_to_external(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(stream.cuda_stream),
                                        non_blocking=True)
                tensors.append(dst if target.channels > 1 else dst[..., 0])  # HxWx1 -> HxW, as the CPU loader
        stream.synchronize()
        return tensors
