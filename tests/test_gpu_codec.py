"""The codec across devices (marker gpu): same symbols, same error bound, images within rounding."""

import numpy as np
import pytest

from visemz import container
from visemz.image import codec, latents

from .helpers import cross_device_images, cross_device_tolerance, optional, parity, symbols_of

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("model_weights")]
IMAGES = dict(astronaut=None, camera=None, noise=(300, 257), floats=(130, 70, 2))  # cross_device_images


def _reencoded_on(device: str, buf: bytes) -> dict:
    """The rANS sections of ``buf`` (and y_scales) written again on ``device`` from the symbols it decodes there."""
    c = container.unpack(buf)
    h = c.meta
    spec = codec.registry.parse(h["model"])
    net, _ = codec.W.load(spec, device)
    with codec.network_math():
        # the rANS coding alone: which coding wins a section may differ between libzstd and nvCOMP sizes
        sections = latents._encode_rans(net, codec._model64(spec, device), symbols_of(buf, device), h["quality"])
    return {k: v for k, v in sections.items() if k in latents.rans_sections(h) or k == latents.SCALES}


@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
@pytest.mark.parametrize("image_format", [3, 2])
def test_files_decode_on_the_other_device_to_the_same_symbols(gpu_cpu_codecs, model, image_format):
    """Every shipped model (RGB and gray images), written on either device and read on both: the
    same symbols, images within rounding; format 3's rANS sections re-encoded on the other device
    are the same bytes (the coder's bytes do not depend on the device)."""
    gpu, cpu = gpu_cpu_codecs
    with parity() as p:
        for label, img in cross_device_images(**IMAGES).items():
            for enc in (gpu, cpu):
                buf = enc.compress(img, model=model, quality=3.4, image_format=image_format)
                c = container.unpack(buf)
                at = f"{label} written on {enc.device}"
                on_gpu, on_cpu = symbols_of(buf, "cuda"), symbols_of(buf, "cpu")
                for name in c.meta["symbols"]:
                    p.same_array(f"{at}: symbols {name}", on_gpu[name], on_cpu[name])
                if image_format == 3:
                    other = "cpu" if enc is gpu else "cuda"
                    for name, body in _reencoded_on(other, buf).items():
                        p.same_bytes(f"{at}: section {name} re-encoded on {other}", body, bytes(c.sections[name]))
                a, b = cpu.decompress(buf), gpu.decompress(buf)
                p.same(f"{at}: CPU decode dtype and shape", a.dtype == img.dtype and a.shape == img.shape,
                       f"{a.dtype} {a.shape}")
                tol = cross_device_tolerance(img)
                p.same_array(f"{at}: GPU and CPU images within {tol:g}", a, b, atol=tol)


@pytest.mark.parametrize("model", ["balle2016", "mbt2018-mean"])
def test_error_bound_holds_across_devices(gpu_cpu_codecs, model):
    gpu, cpu = gpu_cpu_codecs
    with parity() as p:
        for label, img in cross_device_images(**IMAGES).items():
            for e in (0, 0.01) if img.dtype == np.float32 else (0, 2):
                for enc, dec in ((gpu, cpu), (cpu, gpu), (gpu, gpu)):
                    out = dec.decompress(enc.compress(img, model=model, quality=2, max_error=e))
                    p.same_array(f"{label} E={e} written on {enc.device}, read on {dec.device}", out, img,
                                 atol=e or 0.0)


def test_int16_images_across_devices(gpu_cpu_codecs):
    """An int16 image (CUDA tensor or NumPy) written on either device reads back int16 within its bound on both,
    the ends of the signed range included; the GPU's tensor decode is int16 too."""
    import torch

    gpu, cpu = gpu_cpu_codecs
    img = np.random.default_rng(5).integers(-1024, 3072, (70, 90)).astype(np.int16)
    img[0, :2] = (-32768, 32767)
    with parity() as p:
        for e in (0, 2):
            for enc, dec in ((gpu, cpu), (cpu, gpu)):
                src = torch.from_numpy(img).cuda() if enc is gpu else img
                buf = enc.compress(src, max_error=e)
                out = dec.decompress(buf)
                p.same(f"E={e} written on {enc.device}: int16 on {dec.device}", out.dtype == np.int16, str(out.dtype))
                p.same_array(f"E={e} written on {enc.device}, read on {dec.device}", out, img, atol=e)
            t = gpu.decompress_tensor(buf)
            p.same(f"E={e}: the GPU's tensor decode is an int16 CUDA tensor", t.is_cuda and t.dtype == torch.int16,
                   f"{t.device} {t.dtype}")


def test_cupy_input(gpu_cpu_codecs):
    cp = optional("cupy")
    gpu, _ = gpu_cpu_codecs
    img = np.random.default_rng(1).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    np.testing.assert_array_equal(gpu.decompress(gpu.compress(cp.asarray(img), max_error=0)), img)


def test_float64_hyper_synthesis_on_the_gpu_matches_the_cpu():
    """The GPU's float64 h_s (ATen's GEMM convolutions, not cuDNN's) agrees with the CPU's to float64
    rounding: the scale-index exceptions only have last bits to absorb."""
    import copy

    import torch

    from visemz.models import architectures, registry
    from visemz.models import weights as W

    net, _ = W.load(registry.parse("mbt2018-mean-rgb"), "cpu")
    n64 = copy.deepcopy(net).double()
    z = torch.randn(1, n64.h_s[0].in_channels, 24, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = n64.h_s(z)
        got = architectures.hyper_synthesis(n64.to("cuda"), z.to("cuda")).cpu()
    assert torch.allclose(got, ref, rtol=1e-11, atol=1e-11), float((got - ref).abs().max())
