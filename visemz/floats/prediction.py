"""Prediction of the error-bounded codec's integer steps: none, 1-D or 2-D Lorenzo, with the int32 range checks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError, LimitExceededError

PREDICTORS = ("none", "lorenzo", "lorenzo2d")  # index = the header's predictor code
STEP_LIMIT = 2**31 - 1  # every integer a stream holds (steps, residuals, sums) has |v| < this


@dataclass(frozen=True)
class Prediction:
    """How a stream's integers relate to the steps q = round(x / 2 eb): ``predictor`` and, for
    ``lorenzo2d``, the row length (the array is (n / row, row) in C order).

    Every predictor is linear in q, so residual streams add homomorphically: the residuals of
    qa + qb are the sum of the residuals of qa and of qb, and decoding (a prefix sum) gives qa + qb."""

    predictor: str = "none"
    row: int = 0

    def __post_init__(self):
        if self.predictor not in PREDICTORS:
            raise InvalidArgumentError(f"predictor={self.predictor!r}: expected one of {list(PREDICTORS)}")
        if (self.predictor == "lorenzo2d") != (self.row > 0) or self.row < 0:
            raise InvalidArgumentError(f"row length {self.row} does not fit predictor {self.predictor!r} (lorenzo2d "
                                       "needs one >= 1)")

    @property
    def code(self) -> int:
        """The header's (and the GPU kernels') predictor code."""
        return PREDICTORS.index(self.predictor)

    def check_count(self, n: int) -> None:
        if self.row and n % self.row:
            raise InvalidArgumentError(f"{n} values are not whole rows of {self.row} (2-D Lorenzo prediction)")

    def residuals(self, q: np.ndarray) -> np.ndarray:
        """int32 steps -> int32 residuals (int64 arithmetic; LimitExceededError where one leaves int32)."""
        self.check_count(q.size)
        if self.predictor == "none":
            return q
        q = q.astype(np.int64)
        if self.predictor == "lorenzo":
            r = np.diff(q, prepend=0)
        else:
            g = q.reshape(-1, self.row)
            r = g.copy()
            r[1:] -= g[:-1]
            r[:, 1:] -= g[:, :-1]
            r[1:, 1:] += g[:-1, :-1]
            r = r.reshape(-1)
        if r.size and np.abs(r).max() >= STEP_LIMIT:
            raise LimitExceededError(f"{self.predictor} prediction residuals up to {np.abs(r).max()} leave int32: "
                                     "use a larger error bound or predictor='none'")
        return r.astype(np.int32)

    def steps(self, r: np.ndarray) -> np.ndarray:
        """Residuals -> int64 steps (prefix sums); LimitExceededError where a step leaves int32
        (a sum of streams beyond int32, or a damaged stream)."""
        self.check_count(r.size)
        if self.predictor == "none":
            return r.astype(np.int64)
        if self.predictor == "lorenzo":
            q = np.cumsum(r, dtype=np.int64)
        else:
            q = np.cumsum(np.cumsum(r.reshape(-1, self.row), axis=1, dtype=np.int64), axis=0).reshape(-1)
        if q.size and np.abs(q).max() >= STEP_LIMIT:
            raise LimitExceededError(f"decoded steps up to {np.abs(q).max()} leave int32: a sum of streams that int32 "
                                     "cannot hold, or a damaged stream")
        return q

