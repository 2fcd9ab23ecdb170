"""The channel-context model (image format 7) across devices (marker gpu): a file written on a GPU decodes on the
CPU to the same symbols and back, the slices' rANS sections re-encoded on the other device are the same bytes, and
the float64 slice scales agree to float64 rounding."""

import numpy as np
import pytest
import torch

from visemz import container
from visemz.image import codec, latents, tile_index
from visemz.models import architectures, registry

from .helpers import cross_device_images, cross_device_tolerance, parity, symbols_of

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("model_weights")]
MODEL = "minnen2020"
IMAGES = dict(astronaut=(200, 264), camera=(190, 300), noise=(150, 129), floats=(70, 90, 2))  # cross_device_images


def _tile_parts(buf: bytes) -> list[tuple[dict, dict]]:
    """Each tile's (parts, coding) of a tiled file."""
    c = container.unpack(buf)
    t = c.meta["tiles"]
    index = tile_index.TileIndex(c.sections, t["grid"][0] * t["grid"][1], t["parts"], t["symbols"], c.meta["format"])
    return [(index.sections(i), index.coding(i)) for i in range(t["grid"][0] * t["grid"][1])]


def _reencoded_on(device: str, buf: bytes) -> list[dict]:
    """Each tile's rANS sections (and y_scales) written again on ``device`` from the symbols it decodes there."""
    h = container.unpack(buf).meta
    spec = registry.parse(h["model"])
    net, _ = codec.W.load(spec, device)
    _, tiles = codec.ImageCodec(device).decode_tile_symbols(buf)
    out = []
    with codec.network_math():
        for symbols, (_, coding) in zip(tiles, _tile_parts(buf)):
            sections = latents._encode_rans(net, codec._model64(spec, device), symbols, h["quality"])
            out.append({k: v for k, v in sections.items() if coding.get(k) == "rans" or k == latents.SCALES})
    return out


@pytest.mark.parametrize("tile", [None, 128])
def test_files_decode_on_the_other_device_to_the_same_symbols(gpu_cpu_codecs, tile):
    gpu, cpu = gpu_cpu_codecs
    with parity() as p:
        for label, img in cross_device_images(**IMAGES).items():
            for enc in (gpu, cpu):
                buf = enc.compress(img, model=MODEL, quality=3.4, tile=tile)
                at = f"{label} written on {enc.device}"
                on_gpu, on_cpu = symbols_of(buf, "cuda"), symbols_of(buf, "cpu")
                for name in ("y", "z"):
                    p.same_array(f"{at}: symbols {name}", on_gpu[name], on_cpu[name])
                other = "cpu" if enc is gpu else "cuda"
                for i, (again, (parts, _)) in enumerate(zip(_reencoded_on(other, buf), _tile_parts(buf))):
                    for name, body in again.items():
                        p.same_bytes(f"{at}: tile {i} section {name} re-encoded on {other}", body, bytes(parts[name]))
                a, b = cpu.decompress(buf), gpu.decompress(buf)
                p.same(f"{at}: CPU decode dtype and shape", a.dtype == img.dtype and a.shape == img.shape,
                       f"{a.dtype} {a.shape}")
                tol = cross_device_tolerance(img)
                p.same_array(f"{at}: GPU and CPU images within {tol:g}", a, b, atol=tol)


def test_error_bound_holds_across_devices(gpu_cpu_codecs):
    gpu, cpu = gpu_cpu_codecs
    with parity() as p:
        for label, img in cross_device_images(**IMAGES).items():
            for e in (0, 0.01) if img.dtype == np.float32 else (0, 2):
                for enc, dec in ((gpu, cpu), (cpu, gpu), (gpu, gpu)):
                    out = dec.decompress(enc.compress(img, model=MODEL, quality=2, max_error=e))
                    p.same_array(f"{label} E={e} written on {enc.device}, read on {dec.device}", out, img,
                                 atol=e or 0.0)


def test_float64_slice_scales_on_the_gpu_match_the_cpu():
    """The GPU's float64 slice walk (ATen's GEMM convolutions) agrees with the CPU's to float64 rounding: the
    scale exceptions only have last bits to absorb."""
    spec = registry.spec(MODEL, "rgb")
    cpu64 = codec._model64(spec, "cpu")
    gpu64 = codec._model64(spec, "cuda")
    rng = np.random.default_rng(2)
    symbols = {"y": torch.from_numpy(rng.integers(-4, 5, (1, spec.M, 12, 16), dtype=np.int32)),
               "z": torch.from_numpy(rng.integers(-2, 3, (1, spec.N, 3, 4), dtype=np.int32))}
    with torch.no_grad():
        a = architectures.context_scales(cpu64, symbols, 4.5)
        b = architectures.context_scales(gpu64, {k: v.cuda() for k, v in symbols.items()}, 4.5)
    for k, (x, y) in enumerate(zip(a, b)):
        rel = ((x - y.cpu()).abs() / x.abs().clamp_min(1e-3)).max().item()
        assert rel < 1e-11, (k, rel)
