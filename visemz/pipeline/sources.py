"""Which loader reads which file: chosen by the request, the device, what is installed, the file.

``--loader`` (``CompressConfig.loader``, ``VISEMZ_LOADER``):

* ``cpu``: the CPU loader's thread pool (OpenCV, tifffile, NumPy, pydicom) for every file.
* ``dali``: DALI for the files it decodes exactly like the CPU loader (``probe.decode_target``:
  PNG, even-sized RGB JPEG, JPEG 2000, TIFF), the CPU loader for the rest.  Needs DALI and a GPU.
* ``kvikio``: kvikio for files whose pixels lie raw at one offset (``probe.raw_layout``: .npy,
  uncompressed TIFF), read straight into GPU memory; the CPU loader for the rest.
* ``auto`` (default): on a GPU, kvikio when installed, then the CPU loader; on a CPU, the CPU
  loader.  ``auto`` does not use DALI: on an H200 with 16 cores DALI fed the codec at 0.56-0.58x
  the CPU loader's rate on PNG and 0.55x on JPEG (docs/results/pipeline/loaders.json).

An explicit GPU loader that cannot run is an error naming what is missing (exit code 2 on the
command line), never a silent fallback; files a GPU loader turns down per item go to the CPU
loader and are listed as fallbacks with the reason.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from ..config import LOADERS
from ..defaults import cpu_threads
from ..errors import DeviceUnavailableError, InvalidArgumentError, VisemzError
from ..io import loaders
from ..io.files import Item
from . import dali_source, kvikio_io, probe
from .executor import parallel_feed
from .results import ItemResult

KVIKIO_THREADS = 4  # kvikio splits large reads over its own thread pool; a few files in flight suffice


@dataclass(frozen=True)
class LoaderPlan:
    dali: bool = False
    kvikio: bool = False

    @property
    def names(self) -> list[str]:
        return [n for n, on in (("kvikio", self.kvikio), ("dali", self.dali)) if on] + ["cpu"]


def plan_loaders(requested: str, device: str, have_dali: bool, have_kvikio: bool) -> LoaderPlan:
    """The loaders a job uses; raises when an explicitly requested one cannot run."""
    if requested not in LOADERS:
        raise InvalidArgumentError(f"loader {requested!r}: expected one of {', '.join(LOADERS)}")
    if requested == "cpu" or (requested == "auto" and device != "cuda"):
        return LoaderPlan()
    if requested == "dali" and not have_dali:
        raise DeviceUnavailableError("loader 'dali' was requested but DALI is not installed (pip install "
                                     "nvidia-dali-cuda130)")
    if requested == "kvikio" and not have_kvikio:
        raise DeviceUnavailableError("loader 'kvikio' was requested but kvikio is not installed (pip install "
                                     "'visemz[gpu]')")
    if device != "cuda":
        raise InvalidArgumentError(f"loader {requested!r} reads into GPU memory: it needs device 'cuda', not "
                                   f"{device!r}")
    return LoaderPlan(dali=requested == "dali", kvikio=have_kvikio and requested in ("auto", "kvikio"))


def installed_plan(requested: str, device: str) -> LoaderPlan:
    return plan_loaders(requested, device, dali_source.available(), kvikio_io.available())


@dataclass(frozen=True)
class _Route:
    loader: str  # "finished", "kvikio", "dali" or "cpu"
    detail: object = None  # the finished item's result (or exception), the RawLayout or DecodeTarget from the probe


def _route(i: int, item: Item, plan: LoaderPlan, triage: Callable[[int], ItemResult | None] | None) -> _Route:
    if triage is not None and (finished := triage(i)) is not None:
        return _Route("finished", finished)
    if plan.kvikio and (layout := probe.raw_layout(item.src)) is not None:
        return _Route("kvikio", layout)
    if plan.dali and (target := probe.decode_target(item.src)) is not None:
        return _Route("dali", target)
    return _Route("cpu")


def load_cpu(item: Item, note: str = "") -> loaders.Picture:
    pic = loaders.load(item.src)
    return loaders.Picture(pic.pixels, pic.paged, "cpu", note, pic.source)


def _routed(i: int, item: Item, plan: LoaderPlan, triage) -> _Route:
    """``_route``, with an exception (a probe's, the triage's) failing the item alone."""
    try:
        return _route(i, item, plan, triage)
    except Exception as e:  # noqa: BLE001
        return _Route("finished", e)


def feeds(items: list[Item], plan: LoaderPlan, device_index: int | None,
          triage: Callable[[int], ItemResult | None] | None = None) -> list[Iterable]:
    """The executor's feeds for ``items``: the items ``triage`` finished (skipped or refused: it
    returns their result, None for an item to do), then one feed per loader in use.

    Files are triaged in a thread pool: the resume check and the header probes read from disk."""
    with ThreadPoolExecutor(cpu_threads(), thread_name_prefix="visemz-probe") as pool:
        routes = list(pool.map(lambda i: _routed(i, items[i], plan, triage), range(len(items))))
    by = {name: [i for i, r in enumerate(routes) if r.loader == name] for name in ("finished", "kvikio", "dali", "cpu")}

    def cpu(i: int, note: str = ""):
        try:
            return load_cpu(items[i], note)
        except Exception as e:  # noqa: BLE001 (the item fails with it)
            return e

    def kvikio(i: int):
        try:
            return loaders.Picture(kvikio_io.read(items[i].src, routes[i].detail, device_index), loader="kvikio")
        except VisemzError as e:  # e.g. an I/O error kvikio reports: the CPU loader says what is wrong
            return cpu(i, f"kvikio: {e}")

    out: list[Iterable] = [[(i, routes[i].detail) for i in by["finished"]]]
    if by["kvikio"]:
        out.append(parallel_feed(by["kvikio"], kvikio, KVIKIO_THREADS))
    if by["dali"]:
        entries = [(i, items[i].src, routes[i].detail) for i in by["dali"]]
        out.append(dali_source.DaliFeed(entries, device_index, cpu))
    if by["cpu"]:
        out.append(parallel_feed(by["cpu"], cpu, cpu_threads()))
    return out
