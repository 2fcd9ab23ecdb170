"""The one interface every evaluated codec implements."""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ... import config
from ...errors import InvalidArgumentError

# the settings each unit takes (NaN fails every test)
SETTINGS = {"q": lambda v: 0 <= v <= 100, "e": lambda v: v >= 0 and math.isfinite(v) and v.is_integer(),
            "eb": lambda v: 0 < v < math.inf, "bpp": lambda v: 0 < v < math.inf, "d": lambda v: 0 <= v < math.inf}
SETTING_TEXT = {"q": "a quality of 0-100", "e": "a whole number >= 0", "eb": "a finite number > 0",
                "bpp": "a finite number > 0", "d": "a finite number >= 0"}


@dataclass(frozen=True)
class Layout:
    """What every decoder is told besides the bytes: the image's shape and dtype.

    Every codec gets the same side information, so bpp counts only the codec's own output;
    a few bytes of shape would change no bpp in the reports' third decimal.
    """

    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, image: np.ndarray) -> "Layout":
        return cls(tuple(int(s) for s in image.shape), image.dtype.name)

    @property
    def channels(self) -> int:
        return self.shape[2] if len(self.shape) == 3 else 1


class Codec(ABC):
    """A codec over a ladder of settings (qualities, target rates or error bounds).

    ``encode`` returns the codec's real output bytes; ``decode`` returns an array of the
    original's shape and dtype.  ``device`` is where the codec's work runs.
    """

    name: str
    unit: str  # how a setting is labelled: "q", "bpp", "eb", "e"
    ladder: tuple
    device: str = "cpu"
    #: "rate" codecs trade bits for quality; "bound" codecs guarantee a max error per setting
    kind: str = "rate"
    #: the modules whose versions decide this codec's bytes (``identity``)
    modules: tuple[str, ...] = ()

    def supports(self, layout: Layout) -> str | None:
        """None when this codec can code images of ``layout``, else why not."""
        if layout.dtype != "uint8":
            return f"{self.name} codes 8-bit images only"
        if layout.channels not in (1, 3):
            return f"{self.name} codes gray or RGB images only"
        return None

    def label(self, setting) -> str:
        return f"{self.unit}={setting:g}"

    def identity(self, layout: Layout) -> str:
        """What besides a setting decides this codec's output on images of ``layout``: its libraries' versions
        (and a learned codec's weights).  A resumed evaluation computes a point again when this differs from the
        identity its CSV recorded."""
        return "; ".join(f"{m} {module_version(m)}" for m in self.modules)

    @abstractmethod
    def encode(self, image: np.ndarray, setting) -> bytes: ...

    @abstractmethod
    def decode(self, data: bytes, setting, layout: Layout) -> np.ndarray: ...

    def round_trip(self, image: np.ndarray, setting) -> tuple[bytes, np.ndarray]:
        """(``image`` encoded at ``setting``, those bytes decoded)."""
        data = self.encode(image, setting)
        return data, self.decode(data, setting, Layout.of(image))

    def warm_up(self, image: np.ndarray, setting) -> None:
        """Code ``image`` once, untimed: a first use loads models and libraries."""
        self.round_trip(image, setting)

    def sync(self) -> None:  # noqa: B027 (a hook: only device codecs override it)
        """Wait for queued device work, so timings include it (no-op on the CPU)."""

    def with_ladder(self, ladder) -> "Codec":
        """This codec over ``ladder`` (``visemz eval --ladder``), each setting checked before any point."""
        for setting in ladder:
            self.check_setting(setting)
        self.ladder = tuple(ladder)
        return self

    def check_setting(self, setting) -> None:
        """InvalidArgumentError unless ``setting`` is one this codec takes, by its unit: a quality of 0-100, a
        whole bound E >= 0, an error bound or a bit rate > 0, a JPEG XL distance >= 0."""
        ok = SETTINGS.get(self.unit, math.isfinite)
        if not config.real_number(setting) or not ok(float(setting)):
            raise InvalidArgumentError(f"--ladder {self.name}: {setting!r} is not a setting it takes "
                                       f"({self.unit}: {SETTING_TEXT.get(self.unit, 'a finite number')})")


def module_version(name: str) -> str:
    """A module's ``__version__`` ("unknown" without one, "absent" when it does not import)."""
    try:
        return str(getattr(importlib.import_module(name), "__version__", "unknown"))
    except ImportError:
        return "absent"
