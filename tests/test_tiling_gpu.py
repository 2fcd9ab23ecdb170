"""Tiled images across devices (marker gpu): the same symbols on both, images within rounding, exact
with an error bound; region reads on the GPU."""


import numpy as np
import pytest
from skimage import data

from visemz import container, defaults
from visemz.image import tiling

from .helpers import cross_device_tolerance, tiled_synthesis

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("model_weights")]

TILE = 128


def _images():
    rng = np.random.default_rng(0)
    return {"rgb 300x517": np.ascontiguousarray(data.coffee()[:300, :517]),
            "uint16 400x333": (np.resize(data.camera(), (400, 333)).astype(np.uint16) * 200
                               + rng.integers(0, 300, (400, 333)).astype(np.uint16))}


def _same_symbols(a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        for k in x:
            assert np.array_equal(x[k].cpu().numpy(), y[k].cpu().numpy()), (i, k)


@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
def test_tiled_files_cross_decode(gpu_cpu_codecs, model):
    gpu, cpu = gpu_cpu_codecs
    for label, img in _images().items():
        for enc in (gpu, cpu):
            buf = enc.compress(img, model=model, quality=3.4, tile=TILE)
            assert container.unpack(buf).meta["tiles"]["grid"][1] >= 3, label
            _same_symbols(gpu.decode_tile_symbols(buf)[1], cpu.decode_tile_symbols(buf)[1])
            on_gpu, on_cpu = gpu.decompress(buf), cpu.decompress(buf)
            diff = np.abs(on_gpu.astype(np.int64) - on_cpu)
            assert diff.max() <= cross_device_tolerance(img), (label, enc.device, diff.max())


def test_region_decode_on_the_gpu(gpu_cpu_codecs):
    gpu, _ = gpu_cpu_codecs
    for label, img in _images().items():
        lossy = gpu.compress(img, quality=4, tile=TILE)
        bounded = gpu.compress(img, quality=4, tile=TILE, max_error=2)
        lossy_full, bounded_full = gpu.decompress(lossy), gpu.decompress(bounded)
        for region in ((70, 201, 100, 290), (128, 256, 128, 256), (299, 300, 0, 333)):
            y0, y1, x0, x1 = region
            got, full = gpu.decompress(lossy, region=region), lossy_full[y0:y1, x0:x1]
            diff = np.abs(got.astype(np.int64) - full)  # other batches of tiles may take other cuDNN kernels
            assert diff.max() <= cross_device_tolerance(img), (label, region, diff.max())
            t = gpu.decompress_tensor(bounded, region=region)
            assert t.is_cuda
            np.testing.assert_array_equal(gpu.decompress(bounded, region=region), bounded_full[y0:y1, x0:x1])
        assert np.abs(bounded_full.astype(np.int64) - img).max() <= 2


def test_error_bounded_tiled_files_decode_alike_on_both_devices(gpu_cpu_codecs):
    gpu, cpu = gpu_cpu_codecs
    img = _images()["uint16 400x333"]
    for enc in (gpu, cpu):
        buf = enc.compress(img, model="mbt2018-mean", quality=2, tile=TILE, max_error=5)
        a, b = gpu.decompress(buf), cpu.decompress(buf)
        np.testing.assert_array_equal(a, b)
        assert np.abs(a.astype(np.int64) - img).max() <= 5


@pytest.fixture
def no_tf32():
    """The networks in full float32 while the test runs."""
    with defaults.set(tf32=0):
        yield


def test_tile_latents_wait_in_pinned_host_memory(gpu_cpu_codecs, no_tf32):
    """On the GPU the latents later batches need wait in pinned host memory (tiling.park_on_host), not on
    the device, during every g_s call; the pixels are those of a synthesis that keeps them on the device
    (within float32 rounding: the synthesis runs without TF32 here, whose rounding would hide less)."""
    gpu, _ = gpu_cpu_codecs
    buf = gpu.compress(_images()["uint16 400x333"], model="mbt2018-mean", quality=3, tile=TILE)  # 4 x 3 tiles
    parked_kinds = []

    def park(t):
        out = tiling.park_on_host(t)
        parked_kinds.append((t.device.type, out.device.type, out.is_pinned()))
        return out

    kept, kept_counts = tiled_synthesis(gpu, buf, None)
    parked, parked_counts = tiled_synthesis(gpu, buf, park)
    # Not bit for bit: cuDNN may pick another convolution algorithm for the same shapes when the free
    # memory differs (measured on an H200: 2.4e-7 at most, far below one level of 16-bit output, 1.5e-5).
    for (i, a), (_, b) in zip(kept, parked):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"tile {i}")
    assert max(kept_counts) > 1 and parked_counts == [0] * len(parked)
    assert parked_kinds and set(parked_kinds) == {("cuda", "cpu", True)}
