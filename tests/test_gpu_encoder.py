"""GPU encoder against the NumPy reference: identical bytes, cross decoding (marker gpu)."""

import numpy as np
import pytest

from visemz.encoders import decode_ints, encode_ints, reference
from visemz.encoders import layout as L
from visemz.encoders import stream
from visemz.errors import DeviceUnavailableError, VisemzError

from .helpers import DISTRIBUTIONS, EDGE_SIZES, damaged_copies, make_ints

pytestmark = pytest.mark.gpu
SIZES = EDGE_SIZES + (65_537, 1_000_003)


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


@pytest.fixture(scope="module")
def gpu():
    from visemz.encoders import gpu

    return gpu


@pytest.mark.parametrize("policy", ["global", "block"])
@pytest.mark.parametrize("bitshuffle", [True, False])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_gpu_bytes_equal_reference(cp, gpu, policy, bitshuffle, dist):
    for i, n in enumerate(SIZES):
        for scale in (0.1, 0.6, 5.0):
            v = make_ints(dist, n, seed=1000 * i + int(10 * scale), scale=scale)
            ref = reference.encode(v, L.POLICIES[policy], bitshuffle)
            got = gpu.encode_raw(cp.asarray(v), L.POLICIES[policy], bitshuffle).get().tobytes()
            assert got == ref, f"n={n} dist={dist} scale={scale}"
            back = gpu.decode_block_stream(cp.asarray(np.frombuffer(ref, np.uint8)))
            np.testing.assert_array_equal(back.get(), v)


@pytest.mark.parametrize("policy", ["global", "block"])
def test_ints_streams_cross_decode(cp, policy):
    v = make_ints("latent", 3_000_001, seed=4, scale=0.7)
    for entropy in ("none", "zstd"):
        on_gpu = encode_ints(cp.asarray(v), policy=policy, entropy=entropy)
        on_cpu = encode_ints(v, policy=policy, entropy=entropy)
        if entropy == "none":
            assert on_gpu == on_cpu
        for buf in (on_gpu, on_cpu):
            np.testing.assert_array_equal(decode_ints(buf), v)
            np.testing.assert_array_equal(decode_ints(buf, device="cuda").get(), v)
        # the zstd frames differ (nvCOMP vs libzstd) but carry the same block stream
        assert stream.parse(on_gpu).raw_size == stream.parse(on_cpu).raw_size


def test_torch_cuda_tensor_input(cp):
    import torch

    t = torch.randint(-300, 300, (64, 33, 17), device="cuda", dtype=torch.int32)
    buf = encode_ints(t, policy="block")
    np.testing.assert_array_equal(decode_ints(buf), t.cpu().numpy().reshape(-1))
    assert encode_ints(t, entropy="none") == encode_ints(t.cpu().numpy(), entropy="none")


def test_ans_is_gpu_only(cp):
    v = make_ints("latent", 500_000, seed=9)
    buf = encode_ints(cp.asarray(v), entropy="ans")
    np.testing.assert_array_equal(decode_ints(buf, device="cuda").get(), v)
    with pytest.raises(DeviceUnavailableError, match="ans"):
        decode_ints(buf, device="cpu")


@pytest.mark.parametrize("policy", [0, 1])
def test_gpu_and_cpu_agree_on_damaged_streams(cp, gpu, policy):
    """Each single-byte change, re-checksummed: both decoders reject it, or both return the same values."""
    raw = reference.encode(make_ints("heavy", 3000, seed=2, scale=0.2), policy, True)
    for i, damaged in damaged_copies(raw, seed=policy):
        buf = stream.pack(len(damaged), 0, 0, [damaged])
        try:
            want = decode_ints(buf)
        except VisemzError:
            want = None
        try:
            got = decode_ints(buf, device="cuda").get()
        except VisemzError:
            got = None
        assert (want is None) == (got is None), f"byte {i}: CPU {'rejects' if want is None else 'accepts'}"
        if want is not None:
            np.testing.assert_array_equal(got, want)
