from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executors.slurm.hostlist import Gres, expand_hostlist, gres_count, parse_gres


@pytest.mark.parametrize("text, expected", [
    ("", ()),
    (None, ()),
    ("(null)", ()),
    ("mx-t4-1", ("mx-t4-1",)),
    ("mx-a10-1,mx-t4-1", ("mx-a10-1", "mx-t4-1")),
    ("mx-t4-[1-3]", ("mx-t4-1", "mx-t4-2", "mx-t4-3")),
    ("n[01-03,7]", ("n01", "n02", "n03", "n7")),
    ("n[1-2],gpu[008-010]", ("n1", "n2", "gpu008", "gpu009", "gpu010")),
    ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
])
def test_expand_hostlist(text, expected) -> None:
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[a-b]", "n[3-1]"])
def test_expand_hostlist_rejects(text) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(text)


@given(st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=20, unique=True))
def test_expand_ranges_roundtrip(numbers) -> None:
    text = "h[" + ",".join(str(n) for n in numbers) + "]"
    assert expand_hostlist(text) == tuple(f"h{n}" for n in numbers)


@pytest.mark.parametrize("text, expected", [
    ("gpu:t4:4,mps:400", (Gres("gpu", "t4", 4), Gres("mps", None, 400))),
    ("gpu:a10:4,mps:a10:400", (Gres("gpu", "a10", 4), Gres("mps", "a10", 400))),
    ("gpu:a10:0(IDX:N/A),mps:a10:1(IDX:0)", (Gres("gpu", "a10", 0), Gres("mps", "a10", 1))),
    ("gpu:t4:2(IDX:0,2),mps:0", (Gres("gpu", "t4", 2), Gres("mps", None, 0))),
    ("gres:mps:30", (Gres("mps", None, 30),)),
    ("gres/mps:30", (Gres("mps", None, 30),)),
    ("gres/mps=30", (Gres("mps", None, 30),)),
    ("gres/gpu:t4:1,gres/mps:50", (Gres("gpu", "t4", 1), Gres("mps", None, 50))),
    ("gpu", (Gres("gpu", None, 1),)),
    ("(null)", ()),
    ("", ()),
])
def test_parse_gres(text, expected) -> None:
    assert parse_gres(text) == expected


def test_gres_count() -> None:
    assert gres_count("gres:mps:70", "mps") == 70
    assert gres_count("gres:mps:70", "gpu") == 0
    assert gres_count(None, "mps") == 0


@pytest.mark.parametrize("text", ["mps:", "gpu:t4:x", ":4"])
def test_parse_gres_rejects(text) -> None:
    with pytest.raises(ValueError):
        parse_gres(text)
