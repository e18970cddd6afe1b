"""docs/WORKLOADS.md's table is what ``python -m executors.job.workloads.sizes`` prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from executors.job.workloads.models import JOB_FAMILIES, SIZES
from executors.job.workloads.sizes import HEADER, figures, flops_text, table

REPO = Path(__file__).resolve().parents[4]
DOC = REPO / "docs" / "WORKLOADS.md"


def _doc_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"<!-- sizes table: python -m executors.job.workloads.sizes -->\n(.*?)\n<!-- end of sizes table -->",
                  text, re.S)
    assert m, "docs/WORKLOADS.md lacks the marked sizes table"
    return m.group(1)


def test_the_documented_table_is_the_commands_output() -> None:
    """Every row: parameters, training FLOPs a step and inference FLOPs a request (counted on the meta device)."""
    out = subprocess.run([sys.executable, "-m", "executors.job.workloads.sizes"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = _doc_table()
    assert doc == out.stdout.strip(), \
        "docs/WORKLOADS.md is stale: paste `python -m executors.job.workloads.sizes` into it"
    rows = doc.splitlines()[2:]
    assert [tuple(c.strip(" `") for c in r.split("|")[1:3]) for r in rows] == [(f, s) for f in JOB_FAMILIES
                                                                               for s in SIZES]
    assert table([figures("cnn", "tiny")]).splitlines()[2] == rows[0]  # the command prints table()
    bad = subprocess.run([sys.executable, "-m", "executors.job.workloads.sizes", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_tiny_figures_follow_the_shapes() -> None:
    """Hand-checkable: the tiny recommender's request; no request for a family that is not a service."""
    rec = figures("recommender", "tiny")
    # one sample: bottom 8→32→16, 5×5 dot products of dim 16, top (16 + 10)→64→1: 2 FLOPs a multiply-add
    assert rec.request_flops == 2 * (8 * 32 + 32 * 16 + 5 * 5 * 16 + 26 * 64 + 64 * 1)
    assert figures("resnet50", "tiny").request_flops is None


def test_flops_text_and_header() -> None:
    assert [flops_text(n) for n in (None, 12, 5_792, 1_094_912, 681_000_000_000, 10_439_836_041_216)] == [
        "—", "12 FLOP", "5.79 kFLOP", "1.09 MFLOP", "681 GFLOP", "10.4 TFLOP"]
    assert HEADER.startswith("| family | size |")
