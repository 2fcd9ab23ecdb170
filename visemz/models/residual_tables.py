"""The table family the residual coder codes pixels with: logistic distributions on a grid of scales and
centres, and uniform tables for the low bits of wide distributions.

A pixel's distribution (mean, scale, in units of the near-lossless bin) is coded by a scale index
si = round(STEPS log2(scale / SCALE_MIN)) in 0..SI_MAX and a centre index in 0..CENTRES - 1
(``visemz/image/residual_coder.py``).  Scales up to the grid's top (index TOP, about 31.6) have a logistic table
each; a wider one is coded as its value shifted right by k bits (k = ceil((si - TOP) / STEPS)) under
the table of si - k STEPS, and its k low bits under the uniform table of k bits.  Tables are
numbered ``si * CENTRES + centre`` for si in 0..TOP, then ``UNIFORM + k - 1`` for k in 1..MAX_SHIFT.
"""

from __future__ import annotations

import numpy as np

from ..encoders.cdf_tables import CdfTables, concatenate, logistic_tables, uniform_tables

PREFIX = "tables/residual/"
SCALE_MIN = 0.04  # a narrower distribution makes its most likely value all but certain anyway
STEPS = 16  # scale indexes per octave
TOP = 154  # the widest logistic table: SCALE_MIN * 2**(154 / 16), about 31.6
MAX_SHIFT = 15  # low bits a wide distribution may leave to a uniform table
SI_MAX = TOP + STEPS * MAX_SHIFT
CENTRES = 16  # centres (c + 0.5) / 16 - 0.5 of a table, for means between two integers
TAIL_MASS = 1e-6
UNIFORM = (TOP + 1) * CENTRES  # the first uniform table


def scales() -> np.ndarray:
    return SCALE_MIN * 2.0 ** (np.arange(TOP + 1) / STEPS)


def centres() -> np.ndarray:
    return (np.arange(CENTRES) + 0.5) / CENTRES - 0.5


def build() -> CdfTables:
    """The family's integer tables, computed in float64 (once, when a prior's weights are written)."""
    return concatenate(logistic_tables(scales(), centres(), TAIL_MASS), uniform_tables(MAX_SHIFT))
