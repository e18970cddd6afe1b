"""Reproducible random streams: one independent stream per named purpose, all from one seed (Gavel's practice)."""

from __future__ import annotations

import numpy as np


def rng_stream(seed: int, purpose: str) -> np.random.Generator:
    """An independent, reproducible random stream per purpose: adding a draw elsewhere changes nothing here."""
    return np.random.default_rng([seed, *purpose.encode()])
