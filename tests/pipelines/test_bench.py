"""``muxflow bench``: the seeded instance generator and the round, predictor and forecast benchmarks at toy sizes.

Speed targets are the benchmarks' business (docs/BENCHMARKS.md); these tests
check that each command runs, reports what it promises, and that the round
benchmark's fast plan equals the dense baseline's optimum.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from executors.simulated.bench import BENCH_GPU_TYPES, N_JOB_TYPES, N_SERVICES, bench_services, make_instance
from pipelines.cli.bench import bench

SMALL = ["--epochs", "2", "--samples", "100", "--json"]


def invoke(*args: str) -> dict:
    result = CliRunner().invoke(bench, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_instance_generator_is_seeded_and_shaped_like_the_issue() -> None:
    gpus, jobs = make_instance(600, 300, seed=4)
    again_gpus, again_jobs = make_instance(600, 300, seed=4)
    assert gpus == again_gpus and jobs == again_jobs
    other, _ = make_instance(600, 300, seed=5)
    assert other != gpus
    assert len(gpus) == 600 and len(jobs) == 300
    assert len({g.gpu_id for g in gpus}) == 600 and len({j.job_id for j in jobs}) == 300
    assert {g.gpu_type for g in gpus} <= set(BENCH_GPU_TYPES)
    assert len({g.service_name for g in gpus}) == N_SERVICES == len(bench_services(4))
    # Jobs of one type share their profile on each GPU type: at most 50 profiles per type.
    for t in BENCH_GPU_TYPES:
        assert len({j.profiles[t] for j in jobs}) <= N_JOB_TYPES
    assert all(j.current_gpu_id is None for j in jobs)


def test_running_jobs_sit_one_per_gpu() -> None:
    gpus, jobs = make_instance(300, 100, seed=1, running_frac=0.5)
    running = [j for j in jobs if j.current_gpu_id is not None]
    assert len(running) == 50
    host = {g.gpu_id: g for g in gpus}
    for j in running:
        assert host[j.current_gpu_id].current_job_id == j.job_id


def test_bench_round_against_the_dense_baseline() -> None:
    out = invoke("round", "--gpus", "120", "--jobs", "60", "--baseline", "dense", *SMALL)
    for key in ("predict_s", "match_s", "total_s", "peak_rss_mb", "objective", "certified_optimal", "machine"):
        assert key in out
    assert out["certified_optimal"] is True and out["optimality_gap_bound"] <= 1e-6
    assert out["plan_violations"] == 0
    assert out["gpus"] == 120 and out["jobs"] == 60 and out["placements"] > 0
    dense = out["dense"]
    assert dense["objectives_equal"] is True and abs(dense["objective_diff"]) <= 1e-6
    assert dense["speedup"] > 0 and dense["placements"] == out["placements"]


def test_bench_round_runs_both_at_baseline_sizes_when_dense_is_too_big() -> None:
    out = invoke("round", "--gpus", "150", "--jobs", "80", "--baseline", "dense", "--dense-max-pairs", "5000",
                 "--baseline-sizes", "40x30,60x40", "--running-frac", "0.3", "--migration-penalty", "0.05", *SMALL)
    assert "skipped" in out["dense"]
    assert [(r["gpus"], r["jobs"]) for r in out["baseline_sizes"]] == [(40, 30), (60, 40)]
    for r in out["baseline_sizes"]:
        assert r["objectives_equal"] is True and r["fast_certified_optimal"] is True
        assert r["dense_within_fast_bound"] is True and r["fast_gap_bound"] <= 1e-6
        assert r["speedup"] > 0


def test_bench_round_reports_both_instance_kinds_side_by_side_with_the_dense_baseline() -> None:
    out = invoke("round", "--gpus", "90", "--jobs", "40", "--profiles", "both", "--baseline", "dense", *SMALL)
    shared, distinct = out["profiles"]["shared"], out["profiles"]["distinct"]
    assert (shared["profile_per_job"], distinct["profile_per_job"]) == (False, True)
    # A profile per job: every job its own class (nothing groups), each checked against every pair.
    assert distinct["job_classes"] == 40 > shared["job_classes"]
    for row in (shared, distinct):
        assert row["certified_optimal"] is True and row["plan_violations"] == 0
        assert row["dense"]["objectives_equal"] is True


def test_bench_round_profile_options_are_one_choice() -> None:
    res = CliRunner().invoke(bench, ["round", "--profiles", "shared", "--distinct-profiles", "--gpus", "10"])
    assert res.exit_code == 2 and "--distinct-profiles is --profiles distinct" in res.output


def test_bench_round_sizes_list() -> None:
    out = invoke("round", "--sizes", "30x20,40x10", "--hidden", "16", *SMALL)
    assert [(r["gpus"], r["jobs"]) for r in out["results"]] == [(30, 20), (40, 10)]
    assert (out["predictor_hidden"], out["predictor_epochs"]) == (16, 2)
    assert all(r["certified_optimal"] for r in out["results"])


def test_bench_predictor_trains_predictors_good_enough_to_promote_and_sweeps_figure_12() -> None:
    out = invoke("predictor", "--hidden", "32,64", "--layers", "2,4", "--epochs", "300", "--samples", "200", "--json")
    assert set(out["per_gpu_type"]) == set(BENCH_GPU_TYPES)
    assert (out["hidden"], out["epochs"]) == (32, 300)
    for row in out["per_gpu_type"].values():
        assert row["n_train"] + row["n_holdout"] == 200
        # 300 epochs on 160 samples: under the promotion bound (max_holdout_mae 0.10); 30 epochs are not
        assert 0 < row["mae_tput"] < 0.10 and 0 < row["mae_slowdown"] < 0.15
        assert row["curve_mae_tput"][-1] == [300, row["mae_tput"]]
    # The paper's network (4 x 64, 250 epochs) beside it, on the same samples.
    assert set(out["paper_network_per_gpu_type"]) == set(BENCH_GPU_TYPES)
    assert all(0 < r["mae_tput"] < 0.10 for r in out["paper_network_per_gpu_type"].values())
    assert [(r["layers"], r["hidden"]) for r in out["figure12"]] == [(4, 32), (4, 64), (2, 64)]
    # The sweep's default architecture is the table's predictor for the same GPU type, trained alike.
    same = out["per_gpu_type"][out["figure12_gpu_type"]]
    assert out["figure12"][0]["mae_tput"] == same["mae_tput"]


def test_bench_forecast_against_last_value() -> None:
    out = invoke("forecast", "--gpus", "3", "--days", "2", "--json")
    methods = out["methods"]
    assert set(methods) >= {"forecaster", "last_value"}
    n = methods["forecaster"]["intervals"]
    # Every 15-minute interval of day 2 for 3 GPUs (an interval whose samples are all missing is skipped).
    assert n == methods["last_value"]["intervals"] and 0.95 * 3 * 96 <= n <= 3 * 96
    for r in methods.values():
        assert 0.0 <= r["shortfall_rate"] <= r["under_peak_rate"] <= 1.0


@pytest.mark.parametrize("cmd", [["round"], ["predictor"], ["forecast"], ["xcuda"]])
def test_bench_help(cmd) -> None:
    result = CliRunner().invoke(bench, [*cmd, "--help"])
    assert result.exit_code == 0 and result.output.startswith("Usage:")


def test_short_help_flag_survives_standalone_use(tmp_path) -> None:
    # Click caches a command's help option the first time it is used; used on its own
    # first, a command must still answer -h under ``muxflow``.
    from pipelines.cli import main

    for cmd in (["round"], ["xcuda"], []):
        assert CliRunner().invoke(bench, [*cmd, "--help"]).exit_code == 0
        result = CliRunner().invoke(main, ["--db", f"sqlite:///{tmp_path / 'h.db'}", "bench", *cmd, "-h"])
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("args", "says"), [
    (["round", "--sizes", "4y3"], "'4y3' is not <GPUs>x<jobs>"),
    (["round", "--sizes", "100x50,0x3"], "'0x3' is not <GPUs>x<jobs>"),
    (["round", "--baseline-sizes", "2000x"], "'2000x' is not <GPUs>x<jobs>"),
    (["round", "--dense-max-pairs", "-1"], "-1 is not in the range"),
    (["predictor", "--hidden", "abc"], "'abc' is not a comma-separated list"),
    (["predictor", "--layers", "2,0"], "'2,0' is not a comma-separated list"),
    (["predictor", "--sweep-type", "h100"], "'h100' is not one of"),
    (["simulate", "--policies", "muxflow,nope"], "unknown policy 'nope'"),
])
def test_bad_benchmark_options_are_refused_before_anything_runs(args, says) -> None:
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 2 and says in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_bench_simulate_refuses_a_bad_trace_in_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("not a trace\n")
    result = CliRunner().invoke(bench, ["simulate", "--trace", str(bad), "--gpus", "2", "--jobs", "2", "--hours", "1"])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.output
    assert f"{bad}: trace line 1" in result.output and "Traceback" not in result.output


def test_simulated_figures_say_so_in_text_and_json() -> None:
    result = CliRunner().invoke(bench, ["forecast", "--gpus", "2", "--days", "2"])
    assert result.exit_code == 0 and result.output.startswith("SIMULATED "), result.output
    assert json.loads(result.output.strip().splitlines()[-1])["simulated"] is True
