import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from visemz import cuda
from visemz.encoders import EncoderConfig, decode_ints, encode_ints, reference
from visemz.encoders import layout as L
from visemz.errors import DeviceUnavailableError, UnsupportedFormatError

from .helpers import DISTRIBUTIONS, EDGE_SIZES, check_roundtrip, make_ints

CONFIGS = [
    dict(policy=p, bitshuffle=b, entropy=e) for p in ("global", "block") for b in (True, False)
    for e in ("none", "zstd")
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.one_of(st.sampled_from(EDGE_SIZES), st.integers(0, 70_000)),
    dist=st.sampled_from(DISTRIBUTIONS),
    scale=st.floats(0.05, 40.0),
    seed=st.integers(0, 2**32 - 1),
)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_roundtrip_property(cfg, n, dist, scale, seed):
    check_roundtrip(make_ints(dist, n, seed, scale), **cfg)


@pytest.mark.parametrize("dist", ["latent", "heavy", "extremes"])
@pytest.mark.parametrize("policy", ["global", "block"])
def test_roundtrip_over_a_million(dist, policy):
    v = make_ints(dist, 1_048_577, seed=7)
    for bitshuffle in (True, False):
        check_roundtrip(v, policy=policy, bitshuffle=bitshuffle, entropy="zstd")


def test_shapes_and_small_dtypes_flatten():
    v = np.arange(-30, 30, dtype=np.int16).reshape(3, 4, 5)
    out = decode_ints(encode_ints(v))
    np.testing.assert_array_equal(out, v.reshape(-1).astype(np.int32))


@pytest.mark.parametrize("dtype", ["int64", "uint32", "float32", "bool"])
def test_unsafe_dtypes_are_rejected(dtype):
    with pytest.raises(UnsupportedFormatError, match=np.dtype(dtype).name):
        encode_ints(np.zeros(4, dtype))


def test_bad_options_name_the_value():
    with pytest.raises(UnsupportedFormatError, match="'lz4'"):
        encode_ints(np.zeros(4, np.int32), entropy="lz4")
    with pytest.raises(UnsupportedFormatError, match="'fixed'"):
        EncoderConfig(policy="fixed")


def test_ans_needs_a_gpu_on_cpu_machines(monkeypatch):
    monkeypatch.setattr(cuda, "cuda_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="ans"):
        encode_ints(np.zeros(10, np.int32), entropy="ans")


def test_global_width_follows_the_data():
    """The chosen width is the one whose exact size is smallest (checked by brute force)."""
    rng = np.random.default_rng(3)
    for scale in (0.1, 0.6, 3.0, 30.0):
        v = np.round(rng.laplace(0, scale, 50_000)).astype(np.int32)
        raw = reference.encode(v, L.POLICIES["global"], True)
        chosen = raw[7]
        assert chosen in L.GLOBAL_WIDTHS
        blocks = reference._padded(reference.zigzag(v), 64)
        sizes = {}
        for t in L.GLOBAL_WIDTHS:  # the bitshuffled layout: non-empty 8-byte planes, t + 1 flag bits a block
            fits = blocks < (1 << t)
            planes = np.bitwise_or.reduce(np.where(fits, blocks, 0), axis=1)
            chunks = 8 * sum(bin(int(p)).count("1") for p in planes)
            out = ~fits
            nbytes = np.ceil(reference.bit_length(blocks[out]).astype(int) / 8).astype(int)
            meta = -(-len(blocks) * (t + 1) // 8)
            sizes[t] = chunks + int(out.any(1).sum()) + int(out.sum()) + int(nbytes.sum()) + meta
        assert sizes[chosen] == min(sizes.values())


def test_sparse_latents_compress_below_one_bit_per_value():
    v = make_ints("latent", 200_000, seed=1, scale=0.1)  # about 0.7% non-zero
    assert 8 * len(encode_ints(v, entropy="none")) / v.size < 1.0
    denser = make_ints("latent", 200_000, seed=1, scale=0.3)
    assert len(encode_ints(denser, entropy="zstd")) < len(encode_ints(denser, entropy="none"))
