"""Maximum-weight bipartite matching (paper §5, Alg. 1): worked example and brute-force property."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.matching.dense import max_weight_matching


def test_paper_figure_9_example() -> None:
    # Rows: online A, B. Columns: offline C, D, E.
    w = np.array([[0.3, 0.8, 0.0], [0.8, 0.0, 0.4]])
    ok = np.array([[True, True, False], [True, False, True]])
    match = max_weight_matching(w, ok)
    assert sorted(match.pairs) == [(0, 1), (1, 0)]  # A–D, B–C
    assert match.total == pytest.approx(1.6)


def _brute_force(w: np.ndarray, ok: np.ndarray) -> float:
    """Best total over every matching that uses only feasible, positive edges."""
    n, m = w.shape
    best = 0.0
    # Each row picks a distinct column or nothing (None).
    for choice in itertools.product([None, *range(m)], repeat=n):
        cols = [c for c in choice if c is not None]
        if len(cols) != len(set(cols)):
            continue
        total = 0.0
        valid = True
        for r, c in enumerate(choice):
            if c is None:
                continue
            if not ok[r, c]:
                valid = False
                break
            total += w[r, c]
        if valid:
            best = max(best, total)
    return best


@st.composite
def instances(draw):
    n = draw(st.integers(0, 5))
    m = draw(st.integers(0, 5))
    weights = draw(
        st.lists(st.floats(min_value=1e-3, max_value=1.0, allow_nan=False), min_size=n * m, max_size=n * m)
    )
    mask = draw(st.lists(st.booleans(), min_size=n * m, max_size=n * m))
    return np.array(weights, dtype=float).reshape(n, m), np.array(mask, dtype=bool).reshape(n, m)


@settings(max_examples=150, deadline=None)
@given(instances())
def test_matches_brute_force(inst) -> None:
    w, ok = inst
    match = max_weight_matching(w, ok)
    rows = [r for r, _ in match.pairs]
    cols = [c for _, c in match.pairs]
    assert len(rows) == len(set(rows)), "a GPU is used twice"
    assert len(cols) == len(set(cols)), "a job is placed twice"
    assert all(ok[r, c] for r, c in match.pairs), "an infeasible pair is used"
    assert match.total == pytest.approx(sum(w[r, c] for r, c in match.pairs))
    assert match.total == pytest.approx(_brute_force(w, ok), abs=1e-9)


@pytest.mark.parametrize("shape", [(3, 1), (1, 4), (2, 5)])
def test_rectangular_uses_min_side(shape) -> None:
    w = np.full(shape, 0.5)
    ok = np.ones(shape, dtype=bool)
    match = max_weight_matching(w, ok)
    assert len(match.pairs) == min(shape)
    assert match.total == pytest.approx(0.5 * min(shape))


@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (4, 0)])
def test_empty_shapes(shape) -> None:
    match = max_weight_matching(np.zeros(shape), np.zeros(shape, dtype=bool))
    assert match.pairs == [] and match.total == 0.0


def test_all_infeasible_gives_empty_matching() -> None:
    match = max_weight_matching(np.ones((3, 3)), np.zeros((3, 3), dtype=bool))
    assert match.pairs == [] and match.total == 0.0


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        max_weight_matching(np.ones((2, 3)), np.ones((3, 2), dtype=bool))
    with pytest.raises(ValueError):
        max_weight_matching(np.ones(3), np.ones(3, dtype=bool))


def test_nan_on_feasible_edge_raises() -> None:
    w = np.array([[0.5, math.nan], [0.2, 0.3]])
    with pytest.raises(ValueError):
        max_weight_matching(w, np.ones((2, 2), dtype=bool))


def test_nan_on_infeasible_edge_is_ignored() -> None:
    w = np.array([[0.5, math.nan], [0.2, 0.3]])
    ok = np.array([[True, False], [True, True]])
    match = max_weight_matching(w, ok)
    assert sorted(match.pairs) == [(0, 0), (1, 1)]
    assert match.total == pytest.approx(0.8)
