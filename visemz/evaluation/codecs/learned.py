"""Learned codecs with visemz's shipped weights: CompressAI's own rANS coder, and visemz."""

from __future__ import annotations

import struct

import numpy as np

from ...errors import CorruptStreamError, InvalidArgumentError
from ...models import registry
from .base import Codec, Layout
from .lossless import NEAR_LOSSLESS, gray_or_rgb

QUALITIES = (1, 2, 3, 4, 5, 6, 7, 8)  # CompressAI's ladder; the variable-rate models take any float in [1, 8]
#: the model quality under visemz's error-bounded ladder unless a codec name says another
#: (``visemz-<arch>-maxerr-q<Q>``): the library's default
MAXERR_QUALITY = registry.DEFAULT_QUALITY
WARM_UP_STEPS = 2  # refinement steps of a refined codec's untimed first encode


def bounded_name(arch: str, quality) -> str:
    """The codec name of visemz's ``arch`` with ``max_error`` at model quality ``quality``."""
    base = f"visemz-{arch}-maxerr"
    return base if quality == MAXERR_QUALITY else f"{base}-q{quality_text(quality)}"


def quality_text(quality) -> str:
    """A model quality as a name or a table shows it: 4, 4.5 (or a word the library takes, as is)."""
    return f"{quality:g}" if isinstance(quality, (int, float)) else str(quality)


def bounded_description(arch: str, quality) -> str:
    return f"visemz {arch}, max_error = E, model quality {quality_text(quality)}"


def refined_name(arch: str, steps: int) -> str:
    """The codec name of visemz's ``arch`` with ``steps`` refinement steps."""
    return f"visemz-{arch}-refine{steps}"


def _variant(layout: Layout) -> str:
    return "rgb" if layout.channels == 3 else "gray"


class LearnedCodec(Codec):
    unit = "q"
    ladder = QUALITIES

    def __init__(self, arch: str, device: str):
        self.arch, self.device = arch, device

    def check_setting(self, setting) -> None:
        if self.unit != "q":  # a bound E
            return super().check_setting(setting)
        try:
            registry.check_quality(setting)  # the model's qualities
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"--ladder {self.name}: {e}") from None

    def identity(self, layout) -> str:
        """The libraries' versions and the id of the weights that code images of ``layout``."""
        from ...models import weights as W

        path = W.weights_path(registry.spec(self.arch, _variant(layout)))
        return f"{super().identity(layout)}; weights {_file_id(path)}"

    def supports(self, layout):
        return gray_or_rgb(layout, self.name)

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


def _file_id(path) -> str:
    """A weights file's id, or "none" where there is no such file."""
    from ...models.weights import file_id

    return file_id(path) if path.is_file() else "none"


def _to_numpy(t) -> np.ndarray:
    import torch

    if t.dtype == torch.uint16:  # torch cannot hand uint16 to NumPy directly
        return t.to(torch.int32).cpu().numpy().astype(np.uint16)
    return t.cpu().numpy()


def compressai_model(spec, device: str):
    """CompressAI's model class of ``spec`` with visemz's weights on ``device``, its CDF tables built
    (``update(force=True)``) for CompressAI's own rANS coder."""
    from ...models import architectures
    from ...models import weights as W

    loaded, _ = W.load(spec, device)
    net = architectures.build(spec).to(device).eval()
    net.load_state_dict(loaded.state_dict())
    net.update(force=True)
    return net


class CompressAIRans(LearnedCodec):
    """CompressAI's ``compress()`` / ``decompress()`` (its rANS on the CPU, the model on ``device``).

    The weights are visemz's shipped ones; the output bytes are CompressAI's strings, each
    behind a 4-byte length, after the 4-byte latent shape (and, for 16-bit images, the
    8-byte value range that the normalisation needs): a real, decodable stream.  This is the
    one round trip through CompressAI's coder: the evaluation and the benchmarks all call it.
    """

    modules = ("visemz", "compressai")

    def __init__(self, arch: str, device: str):
        super().__init__(arch, device)
        self.name = f"compressai-{arch}"
        self._nets: dict = {}

    def _net(self, layout: Layout):
        spec = registry.spec(self.arch, _variant(layout))
        if spec not in self._nets:
            self._nets[spec] = compressai_model(spec, self.device)
        return self._nets[spec]

    def encode(self, image, setting) -> bytes:
        import torch

        from ...image import pixels

        t = pixels.as_tensor(image, self.device)
        meta = pixels.describe(t)
        from ...models import architectures

        with torch.inference_mode():
            enc = architectures.compressai_compress(self._net(Layout.of(image)), pixels.to_batch(t, meta),
                                                    float(setting))
        head = struct.pack("<HH", *enc["shape"])
        if meta.dtype != "uint8":
            head += struct.pack("<dd", meta.lo, meta.hi)
        body = b"".join(struct.pack("<I", len(s)) + s for group in enc["strings"] for s in group)
        return head + body

    def decode(self, data, setting, layout) -> np.ndarray:
        import torch

        from ...image import pixels

        pos, shape = 4, struct.unpack_from("<HH", data, 0)
        lo, hi = 0.0, 255.0
        if layout.dtype != "uint8":
            lo, hi = struct.unpack_from("<dd", data, pos)
            pos += 16
        strings = []
        while pos < len(data):
            if pos + 4 > len(data):
                raise CorruptStreamError("CompressAI stream ends inside a length field")
            (n,) = struct.unpack_from("<I", data, pos)
            strings.append([data[pos + 4: pos + 4 + n]])
            pos += 4 + n
        meta = pixels.ImageMeta(layout.dtype, layout.shape, lo, hi)
        from ...models import architectures

        with torch.inference_mode():
            x_hat = architectures.compressai_decompress(self._net(layout), strings, list(shape), float(setting))
        return _to_numpy(pixels.denormalise(pixels.from_batch(x_hat, meta), meta))


class Visemz(LearnedCodec):
    """visemz's learned codec at qualities 1-8 (``max_error=None``) with ``refine`` steps of encoder-side
    latent refinement (0: none, whatever ``VISEMZ_REFINE`` says, so the row is what its name claims)."""

    modules = ("visemz",)

    def __init__(self, arch: str, device: str, refine: int = 0):
        super().__init__(arch, device)
        from ...image.codec import ImageCodec

        self.refine, self._codec = refine, ImageCodec(device)
        self.name = refined_name(arch, refine) if refine else f"visemz-{arch}"

    def encode(self, image, setting) -> bytes:
        return self._codec.compress(image, model=self.arch, quality=float(setting), refine=self.refine)

    def warm_up(self, image, setting) -> None:
        """Untimed; a refined codec's with WARM_UP_STEPS steps, which load the model and run every kernel
        of refinement once as well as all its steps would."""
        if not self.refine:
            return super().warm_up(image, setting)
        data = self._codec.compress(image, model=self.arch, quality=float(setting), refine=WARM_UP_STEPS)
        self.decode(data, setting, Layout.of(image))

    def decode(self, data, setting, layout) -> np.ndarray:
        return self._codec.decompress(data)


class VisemzBounded(Visemz):
    """visemz with ``max_error=E`` (E in levels of the image's own dtype; 0: lossless) at model quality
    ``quality`` (default MAXERR_QUALITY)."""

    unit, kind = "e", "bound"
    ladder = NEAR_LOSSLESS

    def __init__(self, arch: str, device: str, quality=MAXERR_QUALITY):
        super().__init__(arch, device)
        self.quality = quality if quality == "auto" else registry.check_quality(quality)  # "auto": per image
        self.name = bounded_name(arch, self.quality)
        self.description = bounded_description(arch, self.quality)

    def identity(self, layout) -> str:
        """Visemz's, and the id of the residual prior that codes images of ``layout``."""
        from ...models import residual_weights

        return f"{super().identity(layout)}; residual prior {_file_id(residual_weights.path_of(_variant(layout)))}"

    def encode(self, image, setting) -> bytes:
        return self._codec.compress(image, model=self.arch, quality=self.quality, max_error=int(setting),
                                    refine=self.refine)
