"""The codec across devices (marker gpu): same symbols, same error bound, images within rounding."""

import numpy as np
import pytest

import visemz
from visemz import container
from visemz.encoders import decode_ints

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _weights(model_weights):
    return model_weights


@pytest.fixture(scope="module")
def codecs():
    return visemz.ImageCodec("cuda"), visemz.ImageCodec("cpu")


def _images():
    from skimage import data

    rng = np.random.default_rng(0)
    return [data.astronaut(), data.camera(), rng.integers(0, 4096, (300, 257), dtype=np.uint16),
            (rng.standard_normal((130, 70, 2)) * 3).astype(np.float32)]


@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
def test_gpu_files_decode_on_the_cpu_to_the_same_symbols(codecs, model):
    gpu, cpu = codecs
    for img in _images():
        buf = gpu.compress(img, model=model, quality=3)
        c = container.unpack(buf)
        for name in c.meta["symbols"]:
            np.testing.assert_array_equal(decode_ints(c.sections[name]), decode_ints(c.sections[name], device="cuda").get())
        a, b = cpu.decompress(buf), gpu.decompress(buf)
        assert a.dtype == img.dtype and a.shape == img.shape
        tol = 1.0 if img.dtype == np.uint8 else 1e-3 * max(1.0, float(np.ptp(img)))
        assert np.abs(a.astype(np.float64) - b.astype(np.float64)).max() <= tol


@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
def test_error_bound_holds_across_devices(codecs, model):
    gpu, cpu = codecs
    for img in _images():
        bounds = (0, 0.01) if img.dtype == np.float32 else (0, 2)
        for e in bounds:
            for enc, dec in ((gpu, cpu), (cpu, gpu), (gpu, gpu)):
                out = dec.decompress(enc.compress(img, model=model, quality=2, max_error=e))
                assert np.abs(out.astype(np.float64) - img.astype(np.float64)).max() <= e


def test_cupy_input(codecs):
    import cupy

    gpu, _ = codecs
    img = np.random.default_rng(1).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    np.testing.assert_array_equal(gpu.decompress(gpu.compress(cupy.asarray(img), max_error=0)), img)
