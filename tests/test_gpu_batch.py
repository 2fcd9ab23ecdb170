"""The grouped entropy stage on a GPU (marker gpu): one nvCOMP launch for many ints streams, and for
the streams of several threads at once, writes the bytes that one launch per stream writes."""

import threading

import numpy as np
import pytest
import torch
from skimage import data

import visemz
from visemz import cuda, defaults
from visemz.encoders import EncoderConfig, decode_ints, encode_ints_many, gpu, stream
from visemz.encoders import entropy as E
from visemz.encoders import layout as L

from .helpers import make_ints, parity

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("nvcomp")]  # the tests' cp: cupy and nvCOMP
THREADS = 4
WAIT = 120.0  # seconds a thread may take before the test fails (never reached when the code is right)


def _on_lanes(task) -> None:
    """task(t) in THREADS threads at once, each on its own torch/cupy CUDA stream (as the pipeline's
    lanes), after a common start; any thread's exception fails the test with its number."""
    errors = []
    start = threading.Barrier(THREADS)

    def lane(t: int):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s), cuda.external_stream(s.cuda_stream, s.device.index):
                task(t, lambda: start.wait(WAIT))
                s.synchronize()
        except BaseException as e:  # noqa: BLE001 - reported below with the thread's number
            errors.append((t, e))

    threads = [threading.Thread(target=lane, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT)
    assert not errors, errors


def per_stream(cp, arr, cfg: EncoderConfig) -> bytes:
    """The ints stream as the entropy stage wrote it before grouping: one nvCOMP launch for it alone."""
    raw = gpu.encode_raw(cp.asarray(arr), L.POLICIES[cfg.policy], cfg.bitshuffle)
    kind, chunk = E.KINDS[cfg.entropy], defaults.get("entropy_chunk")
    if kind == E.KINDS["none"]:
        return stream.pack(raw.size, kind, chunk, [raw.get().tobytes()])
    return stream.pack(raw.size, kind, chunk, [f.get().tobytes() for f in gpu.compress_frames(raw, kind, chunk)])


def _grouped_kinds(cp, items) -> int:
    """Entropy kinds of ``items`` with a block stream of at least one frame (those go to the grouped launch)."""
    chunk = defaults.get("entropy_chunk")
    big = {cfg.entropy for a, cfg in items
           if gpu.encode_raw(cp.asarray(a), L.POLICIES[cfg.policy], cfg.bitshuffle).size >= chunk}
    return len(big & {"zstd"})  # ANS streams are always launched alone


# (policy, entropy, distribution, values): streams of many frames, of one frame or more, and shorter than a frame
SHAPES = [("block", "zstd", "dense", 60_000), ("global", "zstd", "latent", 300_001), ("block", "zstd", "latent", 700),
          ("global", "zstd", "dense", 5_000), ("block", "zstd", "latent", 1), ("block", "ans", "latent", 300_001),
          ("global", "ans", "dense", 20_000), ("block", "ans", "latent", 900), ("global", "none", "latent", 1_000)]


def _items(seed: int) -> list:
    """Arrays with configs (SHAPES), their values drawn from ``seed``."""
    return [(make_ints(dist, n, seed=100 * seed + i, scale=0.7), EncoderConfig(policy, True, entropy))
            for i, (policy, entropy, dist, n) in enumerate(SHAPES)]


def _check(p, label: str, got: list, items: list, want: list) -> None:
    for k, (b, w, (a, cfg)) in enumerate(zip(got, want, items)):
        case = f"{label} item {k} ({a.size} values, {cfg.policy}, {cfg.entropy})"
        if cfg.entropy == "ans":  # nvCOMP's ANS frames differ between launches of the same stream
            p.same_bytes(f"{case} length", len(b).to_bytes(8, "little"), len(w).to_bytes(8, "little"))
        else:
            p.same_bytes(case, b, w)
        p.same_array(f"{case} decoded", decode_ints(b, device="cuda"), a.reshape(-1))


def test_one_launch_for_many_streams_writes_the_per_stream_bytes(cp):
    items = [(cp.asarray(a), cfg) for a, cfg in _items(0) + _items(1)]
    assert _grouped_kinds(cp, items) == 1  # zstd streams of several frames share their launches
    want = [per_stream(cp, a, cfg) for a, cfg in items]
    with parity() as p:
        _check(p, "grouped", encode_ints_many(items), [(a.get(), c) for a, c in items], want)
        # a torch CUDA tensor is encoded like the cupy array it views
        t = torch.as_tensor(items[0][0], device="cuda")
        p.same_bytes("torch input", encode_ints_many([(t, items[0][1])])[0], want[0])


def test_threads_on_their_own_streams_share_launches_and_keep_their_bytes(cp):
    """THREADS threads, each on its own torch/cupy stream (as pipeline lanes), encode at once, many times:
    their calls are grouped into shared launches, and every stream keeps its per-stream bytes."""
    work = {t: _items(10 + t) for t in range(THREADS)}
    want = {t: [per_stream(cp, a, cfg) for a, cfg in items] for t, items in work.items()}
    got = {}
    before = gpu.group_counts()

    def task(t: int, start):
        items = [(torch.as_tensor(a).cuda(), cfg) for a, cfg in work[t]]  # uploaded on this lane's stream
        start()
        got[t] = [encode_ints_many(items) for _ in range(5)]

    _on_lanes(task)
    with parity() as p:
        for t in range(THREADS):
            for r, out in enumerate(got[t]):
                _check(p, f"thread {t} round {r}", out, work[t], want[t])
    if defaults.get("entropy_batch"):  # each call asks once per entropy kind that has a stream of a frame or more
        after = gpu.group_counts()
        requests = sum(v[1] for v in after.values()) - sum(v[1] for v in before.values())
        assert requests == 5 * sum(_grouped_kinds(cp, items) for items in work.values())


def test_codec_in_several_threads_writes_the_bytes_of_one(cp, model_weights):
    """ImageCodec.compress from several threads on their own streams (the pipeline's lanes, whose entropy
    stages now share launches) writes, image by image, the bytes that one thread writes; with and
    without an error bound (the residual's sections go through the same grouped stage)."""
    rng = np.random.default_rng(3)
    images = [data.astronaut(), data.camera(), rng.integers(0, 4096, (300, 257), dtype=np.uint16),
              data.coffee(), data.moon()]
    codec = visemz.ImageCodec("cuda")
    settings = [{"model": m, "quality": q, "max_error": e} for m, q, e in
                (("mbt2018-mean", 4.0, None), ("balle2016", 2.5, None), ("mbt2018-mean", 6.0, 2))]
    want = {(i, k): codec.compress(img, **s) for i, img in enumerate(images) for k, s in enumerate(settings)}
    jobs = sorted(want)
    got = {}

    def task(t: int, start):
        start()
        for i, k in jobs[t::THREADS]:
            got[i, k] = codec.compress(images[i], **settings[k])

    _on_lanes(task)
    with parity() as p:
        for key in jobs:
            p.same_bytes(f"image {key[0]} setting {settings[key[1]]}", got[key], want[key])
