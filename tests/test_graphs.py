"""CUDA graphs of the networks' passes (models/graphs.py): results equal to eager ones, safe across streams."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from visemz import config, defaults
from visemz.errors import InvalidArgumentError
from visemz.image.codec import ImageCodec
from visemz.models import graphs

from .helpers import symbols_of


@pytest.fixture
def fresh():
    """Graphs on, an empty cache, and a way to change the limits for one test (``defaults.set``: the limits
    come back when the test ends)."""
    graphs.clear()
    with defaults.set(graphs=16, graph_pixels=1 << 22):
        yield defaults.set
    graphs.clear()


def test_settings_are_checked(monkeypatch):
    for env in ("VISEMZ_GRAPHS", "VISEMZ_GRAPH_PIXELS"):
        monkeypatch.setenv(env, "-1")
        with pytest.raises(InvalidArgumentError, match=env):
            config.from_env()
        monkeypatch.setenv(env, "0")
        assert getattr(config.from_env(), env[len("VISEMZ_"):].lower()) == 0
        monkeypatch.delenv(env)


def test_cpu_tensors_run_eagerly(fresh):
    x = torch.arange(6.0)
    assert not graphs.usable((x,), 6)
    assert torch.equal(graphs.run(lambda v: v * 2, (x,), key=("double",), owner=None, pixels=6), x * 2)
    assert graphs.count() == 0


gpu = pytest.mark.gpu


@gpu
def test_replays_follow_their_inputs_and_outputs_outlive_the_next_replay(fresh):
    weights = torch.randn(8, device="cuda")
    fn = lambda v: {"a": v * weights + 1, "b": (v.sum(-1, keepdim=True) - v).to(torch.int32)}  # noqa: E731
    with torch.inference_mode():
        xs = [torch.randn(4, 8, device="cuda") for _ in range(3)]
        outs = [graphs.run(fn, (x,), key=("t",), owner=weights, pixels=32) for x in xs]
        assert graphs.count() == 1
        for x, out in zip(xs, outs):  # each result its own input's, the first (captured) one included
            want = fn(x)
            assert torch.equal(out["a"], want["a"]) and torch.equal(out["b"], want["b"])


@gpu
def test_streams_sharing_a_graph_get_their_own_results(fresh):
    fn = lambda v: torch.nn.functional.conv2d(v, torch.ones(4, 4, 3, 3, device="cuda"), padding=1)  # noqa: E731
    with torch.inference_mode():
        graphs.run(fn, (torch.zeros(1, 4, 64, 64, device="cuda"),), key=("conv",), owner=None, pixels=4096)
    errors = []

    def work(seed: int):
        torch.manual_seed(seed)
        s = torch.cuda.Stream()
        try:
            with torch.inference_mode(), torch.cuda.stream(s):
                for _ in range(20):
                    x = torch.randn(1, 4, 64, 64, device="cuda")
                    got = graphs.run(fn, (x,), key=("conv",), owner=None, pixels=4096)
                    if not torch.allclose(got, fn(x), rtol=1e-5, atol=1e-4):
                        errors.append(seed)
            s.synchronize()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == [] and graphs.count() == 1


@gpu
def test_held_graphs_were_captured_on_streams_of_their_own(fresh):
    """torch keys cuBLAS's workspace by stream: graphs captured on one stream would share it.  A dropped
    graph's stream is taken again, so there are no more streams than graphs held at once, plus one (the pool
    keeps what earlier work left there: ``clear`` gives graphs back, not their streams)."""
    fresh(graphs=2)
    pooled = {id(s.torch) for s in graphs._FREE_STREAMS}
    with torch.inference_mode():
        x = torch.ones(16, device="cuda")
        for k in range(5):
            graphs.run(lambda v: v + k, (x,), key=(k,), owner=None, pixels=16)
            held = [e.stream for e in graphs._GRAPHS.values() if e is not None]
            assert len({id(s.torch) for s in held}) == len(held) == min(k + 1, 2)
        assert len({id(s.torch) for s in held + graphs._FREE_STREAMS}) <= max(len(pooled), 3)


def _split_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Few outputs over a long inner dimension: cuBLAS splits the sum, its partial sums in the workspace."""
    return a @ b


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_different_graphs_replayed_side_by_side_get_their_own_results(fresh, dtype, monkeypatch):
    """Two graphs of GEMMs, each replayed on a thread and stream of its own at the same time, give what the
    eager GEMM gives on that stream (graphs captured on one shared stream overwrote each other's partial sums)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = {"left": (24, 1 << 16, 24), "right": (40, 1 << 15, 40)}
    with torch.inference_mode():
        for key, (m, k, n) in shapes.items():
            a, b = (torch.randn(m, k, device="cuda", dtype=dtype, generator=g),
                    torch.randn(k, n, device="cuda", dtype=dtype, generator=g))
            graphs.run(_split_k, (a, b), key=(key,), owner=None, pixels=m * n)
    errors = []

    def work(key: str):
        m, k, n = shapes[key]
        s = torch.cuda.Stream()
        gen = torch.Generator(device="cuda").manual_seed(len(key))
        try:
            with torch.inference_mode(), torch.cuda.stream(s):
                for _ in range(40):
                    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
                    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
                    got = graphs.run(_split_k, (a, b), key=(key,), owner=None, pixels=m * n)
                    want = _split_k(a, b)
                    if not torch.allclose(got, want, rtol=1e-4, atol=1e-3 * k ** 0.5):
                        errors.append((key, float((got - want).abs().max())))
            s.synchronize()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    pool = [threading.Thread(target=work, args=(key,)) for key in shapes for _ in range(2)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == [] and graphs.count() == 2


@gpu
def test_limits_drop_the_oldest_and_skip_large_inputs(fresh):
    fresh(graphs=2, graph_pixels=100)
    with torch.inference_mode():
        x = torch.ones(10, device="cuda")
        for k in range(3):
            assert torch.equal(graphs.run(lambda v: v + k, (x,), key=(k,), owner=None, pixels=10), x + k)
        assert graphs.count() == 2
        graphs.run(lambda v: v * 3, (x,), key=("big",), owner=None, pixels=101)
        assert graphs.count() == 2
    fresh(graphs=0)
    assert not graphs.usable((x,), 10)


@gpu
def test_a_pass_that_cannot_capture_runs_eagerly(fresh):
    def reads_host(v):  # a host read is not capturable
        return v * float(v.sum().item())

    with torch.inference_mode():
        x = torch.arange(4.0, device="cuda")
        with pytest.warns(RuntimeWarning, match="graphs are off"):
            out = graphs.run(reads_host, (x,), key=("host",), owner=None, pixels=4)
        assert torch.equal(out, x * 6.0)
        # the caller's stream is current again (else torch's work would leave cupy's legacy stream's order)
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        assert not graphs.usable((x,), 4)  # a failed capture turns graphs off for the process
        assert torch.equal(graphs.run(reads_host, (x + 1,), key=("host",), owner=None, pixels=4), (x + 1) * 10.0)
        assert torch.equal(graphs.run(lambda v: v + 1, (x,), key=("other",), owner=None, pixels=4), x + 1)
        assert graphs.count() == 0
        graphs.clear()  # and on again
        assert graphs.usable((x,), 4)


@gpu
def test_a_graph_keeps_what_keep_returns_and_a_retired_graph_runs_eagerly(fresh):
    with torch.inference_mode():
        cached = {"gain": torch.full((8,), 2.0, device="cuda")}
        x = torch.ones(8, device="cuda")
        fn = lambda v: v * cached["gain"]  # noqa: E731 (reads a tensor a cache may drop)
        graphs.run(fn, (x,), key=("kept",), owner=None, pixels=8, keep=lambda: cached["gain"])
        held = cached.pop("gain")
        del held  # the cache let go: the graph still holds the tensor, so its memory is not reused
        junk = [torch.full((8,), 7.0, device="cuda") for _ in range(64)]
        assert torch.equal(graphs.run(fn, (x * 3,), key=("kept",), owner=None, pixels=8), x * 6)
        del junk
        fresh(graphs=1)
        held = next(e for e in graphs._GRAPHS.values() if e is not None)  # as a caller that fetched it holds it
        graphs.run(lambda v: v - 1, (x,), key=("next",), owner=None, pixels=8)  # drops ("kept",)
        assert graphs.count() == 1 and held.retired
        assert graphs._replay(held, (x,)) is None  # no replay on a dropped graph: run() goes eager instead


@gpu
@pytest.mark.usefixtures("model_weights")
@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
def test_codec_with_graphs_matches_the_eager_codec(fresh, model):
    """The same symbols and reconstruction with and without graphs; a file's bytes repeat call after call."""
    rng = np.random.default_rng(3)
    img = (rng.random((96, 160, 3)) * 255).astype(np.uint8)
    codec = ImageCodec("cuda")
    fresh(graphs=0)
    eager = codec.compress(img, model=model, quality=3.5)
    eager_px = codec.decompress(eager)
    fresh(graphs=16)
    graphed = [codec.compress(img, model=model, quality=3.5) for _ in range(3)]
    assert graphs.count() >= 1  # the analysis (and the hyperprior model's scales)
    assert graphed[0] == graphed[1] == graphed[2]
    for k, v in symbols_of(graphed[0]).items():
        np.testing.assert_array_equal(v, symbols_of(eager)[k])
    # the same symbols; pixels within a level: cuDNN may take other kernels under a capture than eagerly
    assert np.abs(codec.decompress(graphed[0]).astype(int) - eager_px).max() <= 1
    assert graphs.count() >= 3  # and the dequantisation and synthesis
