"""How a folder job judges a reconstruction: PSNR against the data's own peak, and lost range.

Scientific integer images often fill fewer bits than their dtype (12-bit X-rays in uint16 files),
so PSNR against the dtype's peak (65535) flatters them by 24 dB.  Here an integer image's peak
is that of the bits its values use (``data_peak``: 4095 for 12-bit data, at least 255), and
every comparison says which peak it used.
"""

from __future__ import annotations

import numpy as np

from .. import measure

#: A lossy encode whose maximum error exceeds this share of the data's peak is worth a warning:
#: on 16-bit data the learned codec's error is not bounded, and a lost star or edge may hide in a
#: good PSNR.
LOST_RANGE_WARNING = 0.01


def data_peak(ref: np.ndarray) -> float:
    """The PSNR peak of ``ref``: for integers, 2^bits - 1 for the bits its largest value uses (at
    least 8; for signed data, the bits its span from the smallest value uses: CT's -1024..3071 is
    12-bit); for floats, ``measure.peak`` (the value range)."""
    if np.issubdtype(ref.dtype, np.integer) and ref.size:
        low = min(0, int(ref.min())) if np.issubdtype(ref.dtype, np.signedinteger) else 0
        bits = max(8, (int(ref.max()) - low).bit_length())
        return float(min((1 << bits) - 1, measure.integer_peak(ref.dtype)))
    return measure.peak(ref)


def compare(ref: np.ndarray, rec: np.ndarray) -> dict:
    """{"psnr": dB (a string "inf" when equal), "peak": the peak used, "max_error": ...}."""
    peak = data_peak(ref)
    psnr = measure.psnr(ref, rec, data_range=peak)
    return {"psnr": round(psnr, 3) if np.isfinite(psnr) else "inf", "peak": peak,
            "max_error": measure.max_abs_error(ref, rec)}


def lost_range(name: str, ref: np.ndarray, rec: np.ndarray) -> str | None:
    """A warning when a lossy reconstruction's largest error exceeds ``LOST_RANGE_WARNING`` of
    the data's peak, else None."""
    row = compare(ref, rec)
    share = row["max_error"] / row["peak"]
    if share <= LOST_RANGE_WARNING:
        return None
    return (f"{name}: lossy coding of {ref.dtype} data lost up to {row['max_error']:g} of its peak {row['peak']:g} "
            f"({100 * share:.1f}%; PSNR {row['psnr']} dB); the learned codec's error is not bounded without "
            "--max-error: pass --max-error N for a guaranteed bound (0: lossless)")
