"""``muxflow bench xcuda`` (pipelines/cli/bench.py): runs and reports what it promises."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pipelines.cli.bench import bench_xcuda


def test_bench_reports_added_latency_as_json(xcuda) -> None:
    result = CliRunner().invoke(bench_xcuda, ["--calls", "20000", "--rounds", "1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for call in ("cuLaunchKernel", "cuMemAlloc_v2"):
        for key in ("direct_median_ns", "direct_p99_ns", "xcuda_median_ns", "xcuda_p99_ns", "added_median_ns",
                    "added_p99_ns"):
            assert isinstance(out[call][key], float), (call, key)
    for key in ("published_median_ns", "published_p99_ns", "added_by_publishing_median_ns"):
        assert isinstance(out["cuLaunchKernel"][key], float), key
    assert out["calls_per_run"] == 20000
    assert out["pacing"].startswith("closed loop")
    # Loose bound here (a shared 2-core machine); the 100 ns target is in docs/BENCHMARKS.md.
    assert out["cuLaunchKernel"]["added_median_ns"] < 1000


def test_bench_help() -> None:
    for flag in ("-h", "--help"):
        result = CliRunner().invoke(bench_xcuda, [flag])
        assert result.exit_code == 0 and result.output.startswith("Usage:")
