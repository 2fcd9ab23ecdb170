"""The codec across devices (marker gpu): same symbols, same error bound, images within rounding."""

import numpy as np
import pytest
from skimage import data

import visemz
from visemz import container
from visemz.encoders import decode_ints

from .helpers import optional, parity

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _weights(model_weights):
    return model_weights


@pytest.fixture(scope="module")
def codecs():
    optional("nvidia.nvcomp")  # the GPU's entropy stage
    return visemz.ImageCodec("cuda"), visemz.ImageCodec("cpu")


def _images():
    rng = np.random.default_rng(0)
    return {"astronaut": data.astronaut(), "camera": data.camera(),
            "uint16 noise": rng.integers(0, 4096, (300, 257), dtype=np.uint16),
            "float32 2-channel": (rng.standard_normal((130, 70, 2)) * 3).astype(np.float32)}


@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
def test_gpu_files_decode_on_the_cpu_to_the_same_symbols(codecs, model):
    gpu, cpu = codecs
    with parity() as p:
        for label, img in _images().items():
            buf = gpu.compress(img, model=model, quality=3)
            c = container.unpack(buf)
            for name in c.meta["symbols"]:
                p.same_array(f"{label}: symbols {name}", decode_ints(c.sections[name], device="cuda"), decode_ints(c.sections[name]))
            a, b = cpu.decompress(buf), gpu.decompress(buf)
            p.same(f"{label}: CPU decode dtype and shape", a.dtype == img.dtype and a.shape == img.shape, f"{a.dtype} {a.shape}")
            tol = 1.0 if img.dtype == np.uint8 else 1e-3 * max(1.0, float(np.ptp(img)))
            p.same_array(f"{label}: GPU and CPU images within {tol:g}", a, b, atol=tol)


@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
def test_error_bound_holds_across_devices(codecs, model):
    gpu, cpu = codecs
    with parity() as p:
        for label, img in _images().items():
            for e in (0, 0.01) if img.dtype == np.float32 else (0, 2):
                for enc, dec in ((gpu, cpu), (cpu, gpu), (gpu, gpu)):
                    out = dec.decompress(enc.compress(img, model=model, quality=2, max_error=e))
                    p.same_array(f"{label} E={e} written on {enc.device}, read on {dec.device}", out, img, atol=e or 0.0)


def test_cupy_input(codecs):
    cp = optional("cupy")
    gpu, _ = codecs
    img = np.random.default_rng(1).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    np.testing.assert_array_equal(gpu.decompress(gpu.compress(cp.asarray(img), max_error=0)), img)
