"""GPU encoder against the NumPy reference: identical bytes, cross decoding (marker gpu)."""

import numpy as np
import pytest
import torch

from visemz.encoders import decode_ints, encode_ints, gpu, reference, stream
from visemz.encoders import layout as L
from visemz.errors import DeviceUnavailableError, VisemzError

from .helpers import DISTRIBUTIONS, EDGE_SIZES, damaged_copies, make_ints, parity

pytestmark = pytest.mark.gpu
SIZES = EDGE_SIZES + (65_537, 1_000_003)


@pytest.mark.parametrize("policy", ["global", "block"])
@pytest.mark.parametrize("bitshuffle", [True, False])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_gpu_bytes_equal_reference(cp, policy, bitshuffle, dist):
    with parity() as p:
        for i, n in enumerate(SIZES):
            for scale in (0.1, 0.6, 5.0):
                v = make_ints(dist, n, seed=1000 * i + int(10 * scale), scale=scale)
                case = f"n={n} scale={scale}"
                ref = reference.encode(v, L.POLICIES[policy], bitshuffle)
                p.same_bytes(f"encode {case}", gpu.encode_raw(cp.asarray(v), L.POLICIES[policy],
                                                              bitshuffle).get().tobytes(), ref)
                p.same_array(f"decode {case}", gpu.decode_block_stream(cp.asarray(np.frombuffer(ref, np.uint8))), v)


@pytest.mark.parametrize("policy", ["global", "block"])
def test_ints_streams_cross_decode(cp, nvcomp, policy):
    v = make_ints("latent", 3_000_001, seed=4, scale=0.7)
    with parity() as p:
        for entropy in ("none", "zstd"):
            on_gpu = encode_ints(cp.asarray(v), policy=policy, entropy=entropy)
            on_cpu = encode_ints(v, policy=policy, entropy=entropy)
            if entropy == "none":
                p.same_bytes("entropy none: the whole stream", on_gpu, on_cpu)
            for written, buf in (("GPU", on_gpu), ("CPU", on_cpu)):
                p.same_array(f"{entropy}, written on the {written}, decoded on the CPU", decode_ints(buf), v)
                p.same_array(f"{entropy}, written on the {written}, decoded on the GPU",
                             decode_ints(buf, device="cuda"), v)
            # the zstd frames differ (nvCOMP vs libzstd) but carry the same block stream
            p.same(f"{entropy}: block stream sizes", stream.parse(on_gpu).raw_size == stream.parse(on_cpu).raw_size)


def test_torch_cuda_tensor_input(cp, nvcomp):
    t = torch.randint(-300, 300, (64, 33, 17), device="cuda", dtype=torch.int32)
    with parity() as p:
        p.same_array("zstd stream of a CUDA tensor, decoded on the CPU", decode_ints(encode_ints(t, policy="block")),
                     t.cpu().numpy().reshape(-1))
        p.same_bytes("entropy none", encode_ints(t, entropy="none"), encode_ints(t.cpu().numpy(), entropy="none"))


def test_ans_is_gpu_only(cp, nvcomp):
    v = make_ints("latent", 500_000, seed=9)
    buf = encode_ints(cp.asarray(v), entropy="ans")
    np.testing.assert_array_equal(decode_ints(buf, device="cuda").get(), v)
    with pytest.raises(DeviceUnavailableError, match="ans"):
        decode_ints(buf, device="cpu")


def _decoded_or_refused(buf, device: str):
    try:
        return decode_ints(buf, device=device)
    except VisemzError:
        return None


@pytest.mark.parametrize("policy", [0, 1])
def test_gpu_and_cpu_agree_on_damaged_streams(cp, policy):
    """Each single-byte change, re-checksummed: both decoders reject it, or both return the same values."""
    raw = reference.encode(make_ints("heavy", 3000, seed=2, scale=0.2), policy, True)
    with parity() as p:
        for i, damaged in damaged_copies(raw, seed=policy):
            buf = stream.pack(len(damaged), 0, 0, [damaged])
            want, got = _decoded_or_refused(buf, "cpu"), _decoded_or_refused(buf, "cuda")
            if p.same(f"byte {i}", (want is None) == (got is None),
                      f"the CPU {'rejects' if want is None else 'accepts'} it, the GPU does not") and want is not None:
                p.same_array(f"byte {i}: values", got, want)
