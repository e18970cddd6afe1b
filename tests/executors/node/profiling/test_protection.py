"""The protection experiment's CPU half: its statistics and decision rule on constructed inputs, the product's
node-script commands it replays, a simulated run end to end (the part file), a deadline that cuts it short, and
the node agent's core importable where no database library is installed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from executors.node.gpu_check_part import PART_FORMAT
from executors.node.profiling import protection as pr
from scheduler_core.online.latency_budget import DEFAULT_SLOWDOWN_ALLOWANCE

ROOT = Path(__file__).resolve().parents[4]
SCRIPTS = ROOT / "executors" / "node" / "slurm"
# Importing any of these raises, as on a GPU machine that has none of them installed.
BLOCKER = """
import importlib.abc, sys
class _NoDatabase(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sqlalchemy", "dagster", "alembic", "ortools"):
            raise ImportError(f"{name} is not installed here")
        return None
sys.meta_path.insert(0, _NoDatabase())
"""


def _run_blocked(code: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _part(site: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """The part as the orchestrator runs it, with the blocker in every process it starts (``sitecustomize``)."""
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "executors.node.profiling.protection", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


# -- statistics ----------------------------------------------------------------------------------

def test_spread_over_repetitions() -> None:
    s = pr.spread([1.0, 2.0, 3.0, None, math.nan])
    assert s == {"n": 3, "mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0}
    assert pr.spread([5.0]) == {"n": 1, "mean": 5.0, "std": None, "min": 5.0, "max": 5.0}
    assert pr.spread([]) == {"n": 0, "mean": None, "std": None, "min": None, "max": None}


def test_per_second_p99_series() -> None:
    reqs = [(100.0 + 0.01 * k, 0.001 * (k + 1)) for k in range(100)]  # second 0: 1..100 ms
    reqs += [(101.5, 0.5)]                                             # second 1: one request
    reqs += [(99.9, 9.0), (103.5, 9.0)]                                # outside the window
    series = pr.per_second_p99(reqs, 100.0, 103.5)
    assert len(series) == 4                                            # the last bucket is half a second
    assert series[0] == pytest.approx(99.01) and series[1] == pytest.approx(500.0)
    assert series[2] is None and series[3] is None
    # a window a little longer than its nominal 2 s: its last requests join the second bucket
    assert pr.per_second_p99(reqs + [(102.02, 0.002)], 100.0, 102.05) == pytest.approx([99.01, 495.02])
    assert pr.per_second_p99(reqs, 100.0, 100.2) == pytest.approx([19.81])  # shorter than a bucket: one
    assert pr.per_second_p99(reqs, 100.0, 100.0) == []


def test_recovery_time_from_a_series() -> None:
    assert pr.recovery_s([50.0, 30.0, 10.0, 9.0], 12.0) == 2.0          # back within from second 2 on
    assert pr.recovery_s([10.0, 11.0], 12.0) == 0.0                     # never left
    assert pr.recovery_s([10.0, 30.0], 12.0) is None                    # over at the end: not recovered
    assert pr.recovery_s([30.0, 5.0, 40.0, 5.0], 10.0) == 3.0           # a relapse restarts the count
    assert pr.recovery_s([None, 30.0, None, 5.0], 10.0) == 2.0          # empty seconds judge nothing
    assert pr.recovery_s([None, 1.0], 10.0) == 0.0
    assert pr.recovery_s([], 10.0) is None and pr.recovery_s([None], 10.0) is None
    assert pr.recovery_s([50.0, 5.0], 10.0, bucket_s=0.5) == 0.5


def test_tally_bar() -> None:
    assert pr.meets_tally(1.072, 0.5) is True
    assert pr.meets_tally(1.0, 1.0) is True
    assert pr.meets_tally(1.0721, 0.9) is False
    assert pr.meets_tally(1.0, 0.499) is False
    assert pr.meets_tally(None, 0.9) is None and pr.meets_tally(1.0, None) is None


def test_recommendation_rule() -> None:
    rec = pr.recommend({"a": {"p99": 2.0, "tput": 0.9}, "b": {"p99": 1.05, "tput": 0.3},
                        "d": {"p99": 1.1, "tput": 0.6}, "e": {"p99": 1.1, "tput": 0.7},
                        "f": {"p99": None, "tput": 1.0}})
    # b protects best but keeps too little of the job; d and e tie: the earlier key
    assert rec["setup"] == "d" and rec["candidates"] == ["a", "d", "e"] and "throughput >= 0.5" in rec["rule"]
    slow = pr.recommend({"a": {"p99": 2.0, "tput": 0.4}, "d": {"p99": 1.2, "tput": 0.1}, "x": {"p99": 1.3}})
    assert slow["setup"] == "d" and slow["candidates"] == ["a", "d", "x"] and slow["rule"].startswith("no set-up")
    assert pr.recommend({}) is None and pr.recommend({"a": {"p99": None, "tput": 1.0}}) is None


def test_window_figures_from_constructed_requests() -> None:
    before = [(10.0 + 0.1 * k, 0.010) for k in range(10)]              # solo: 10 ms
    after = [(30.0 + 0.1 * k, 0.010) for k in range(10)]
    inside = [(20.0 + 0.1 * k, 0.040 if k < 10 else 0.010) for k in range(30)]  # 40 ms in the first second
    iterations = [20.0 + 0.5 * k for k in range(6)]                     # 6 ends in [20, 23): 2/s
    w = pr.window_figures(before + inside + after, (10.0, 11.0), (30.0, 31.0), 20.0, 23.0, 0.2, iterations, 4.0)
    assert w["solo"]["requests"] == 20 and w["solo"]["from"] == "before and after"
    assert w["solo"]["p99_ms"] == pytest.approx(10.0)
    assert w["colocated"]["requests"] == 30 and w["slowdown_avg"] == pytest.approx(20.0 / 10.0)
    assert w["slowdown_p99"] == pytest.approx(4.0) and w["threshold_p99_ms"] == pytest.approx(12.0)
    assert w["within_allowance"] is False and w["recovery_s"] == 1.0
    assert w["p99_series_ms"] == pytest.approx([40.0, 10.0, 10.0])
    assert w["offline"] == {"iterations": 6, "rate_per_s": 2.0, "norm_tput": 0.5}
    assert w["tally_bar"] is False
    alone = pr.window_figures(before + inside, (10.0, 11.0), None, 20.0, 23.0, 0.2, [], None)
    assert alone["solo"]["from"] == "before" and alone["after"] is None and alone["offline"]["norm_tput"] is None


def test_summary_of_a_setup() -> None:
    def w(p99: float | None, tput: float, within: bool, rec: float | None, ev: bool) -> dict:
        return {"slowdown_avg": p99, "slowdown_p99": p99, "offline": {"norm_tput": tput}, "within_allowance": within,
                "recovery_s": rec, "eviction": {"evicted": ev}}

    s = pr.summarize_setup([w(1.05, 0.8, True, 0.0, False), w(1.09, 0.6, True, 1.0, True),
                            w(None, 0.0, False, None, False)])
    assert s["windows"] == 2 and s["within_allowance"] == "2/2" and s["recovered"] == "2/2" and s["evicted"] == 1
    assert s["slowdown_p99"]["mean"] == pytest.approx(1.07) and s["norm_tput"]["min"] == 0.6
    assert s["meets_tally_bar"] is True


def test_lines_are_read_incrementally(tmp_path) -> None:
    f = tmp_path / "s"
    f.write_text("1.5 0.25\n2.5 0.5")
    lines = pr._Lines(f)
    assert lines.read() == [(1.5, 0.25)]          # the unfinished line waits
    with f.open("a") as out:
        out.write("\n3.0 bad\n")
    assert lines.read() == [(1.5, 0.25), (2.5, 0.5)]


# -- what it configures ----------------------------------------------------------------------------

def test_setups_run_with_what_is_available() -> None:
    everything = {c: "ok" for c in pr.COMPONENTS}
    runnable, status = pr.select_setups(everything)
    assert [s.key for s in runnable] == ["a", "b", "c", "d", "e", "f"] and set(status.values()) == {"planned"}
    runnable, status = pr.select_setups({c: pr.NO_GPU for c in pr.COMPONENTS})
    assert [s.key for s in runnable] == ["a", "d"]  # d keeps SysMonitor's eviction; e would repeat it
    assert {k: status[k] for k in "bcef"} == dict.fromkeys("bcef", pr.NO_GPU)
    assert status["d"].startswith("planned without mps (not available: no GPU); xcuda")
    runnable, status = pr.select_setups({**everything, "static": "unsupported: -S refused",
                                         "xcuda": "not available: libxcuda.so not built"})
    assert [s.key for s in runnable] == ["a", "b", "d", "e"]  # c without xCUDA is b
    assert status["f"] == "static: unsupported: -S refused" and "xcuda: not available" in status["c"]


class _Daemon:
    def __init__(self, servers: list[int]):
        self.sent: list[str] = []
        self._servers = servers

    def ctl(self, command: str) -> dict:
        self.sent.append(command)
        return {"command": command, "rc": 0, "out": ""}

    def servers(self) -> list[int]:
        return self._servers


def test_mps_commands_and_environment_are_the_node_scripts() -> None:
    d = _Daemon([os.getpid()])  # a server of this user
    pr.prolog_caps(d, 3, 20, 6 * 1024**3)
    assert d.sent == ["set_default_active_thread_percentage 20", "set_default_device_pinned_mem_limit 3 6144M",
                      f"set_active_thread_percentage {os.getpid()} 20",
                      f"set_device_pinned_mem_limit {os.getpid()} 3 6144M"]
    prolog = (SCRIPTS / "prolog.sh").read_text()
    for command in d.sent:  # the Prolog sends the same commands, in this order
        assert command.split()[0] in prolog
    assert prolog.index("set_default_active_thread_percentage") < prolog.index("set_active_thread_percentage \"")
    env = pr.task_env(3, 20, {"CUDA_MPS_PIPE_DIRECTORY": "/p"}, Path("/x/libxcuda.so"), 6 * 1024**3,
                      Path("/dev/shm/r/muxflow-gpu-3"), Path("/j/7"), {"kp": 2.0, "ki": None, "kd": 0.0})
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": "/p", "MUXFLOW_PLANNED_GPU": "3",
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20", "LD_PRELOAD": "/x/libxcuda.so",
                   "XCUDA_TEST_ENV_CONFIG": "1", "XCUDA_GPU_INDEX": "3",
                   "XCUDA_STATS_DIR": "/j/7", "XCUDA_MEM_QUOTA_BYTES": str(6 * 1024**3), "XCUDA_KP": "2.0",
                   "XCUDA_KD": "0.0", "XCUDA_SHM_PATH": "/dev/shm/r/muxflow-gpu-3"}
    task_prolog = (SCRIPTS / "task_prolog.sh").read_text()
    # The experiment's own record path, and the test build's switch to take these as its plan, are its additions.
    for name in set(env) - {"XCUDA_SHM_PATH", "XCUDA_TEST_ENV_CONFIG"}:
        assert f"export {name}=" in task_prolog, name
    assert pr.task_env(0, 35, {}) == {"MUXFLOW_PLANNED_GPU": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "35"}


def _experiment(tmp_path, **over) -> pr.Experiment:
    p = pr.Params(simulate=False, service="cnn", job="transformer", size="tiny", device="cpu", qps=40.0, max_batch=1,
                  share=20, mem_quota="40%", target_util=None, gains={"kp": None, "ki": 10.0, "kd": None},
                  window_s=1.0, baseline_s=0.5, reps=3, allowance=0.2, gpu_type="h100", sim_load=0.8, warmup=1,
                  seed=0)
    exp = pr.Experiment(pr.dataclasses.replace(p, **over), tmp_path, 60.0, pr.threading.Event())
    exp.available = {c: "ok" for c in pr.COMPONENTS}
    exp.xcuda_lib, exp.record_dir, exp.mem_bytes, exp.gpu_index = Path("/x/libxcuda.so"), tmp_path, 4 << 30, 2
    exp.gpu_uuid = "GPU-9"
    return exp


def test_plan_interleaves_repetitions_around_the_mps_block(tmp_path) -> None:
    exp = _experiment(tmp_path)
    blocks = exp.plan()
    assert exp.plan_text == ["plain-1: a0 a1", "mps: b0 c0 d0 e0 c1 d1 e1 b1 d2 e2 b2 c2", "static: f0 f1 f2",
                             "plain-2: a2"]
    assert [b.kind for b in blocks] == ["plain", "mps", "static", "plain"]
    assert [it.order for it in blocks[1].items[4:8]] == [0, 1, 2, 3]


class _Pipe(_Daemon):
    def __init__(self, static: bool = False):
        super().__init__([])
        self.static = static
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": "/m/pipe", "CUDA_MPS_LOG_DIRECTORY": "/m/log"}

    def ctl(self, command: str) -> dict:
        super().ctl(command)
        if command == "lspart":
            return {"command": command, "rc": 0, "out": "GPU-9 free chunks 10, used chunks 0, free SM 40, used SM 0"}
        return {"command": command, "rc": 0, "out": f"Partition GPU-9/{command.split()[-1]}c created"}


def test_each_setup_configures_the_job_as_production_would(tmp_path) -> None:
    exp = _experiment(tmp_path)
    daemon = _Pipe()
    env = {k: exp.job_env(pr.SETUP[k], daemon if k != "a" else None, None, tmp_path / "7") for k in "abcde"}
    mine = {k: {n: v for n, v in e.items() if n.startswith(("CUDA_MPS_", "XCUDA_", "LD_PRELOAD"))}
            for k, e in env.items()}
    assert mine["a"] == {} and env["a"]["PYTHONPATH"].split(os.pathsep)[0] == str(pr.ROOT)
    assert mine["b"] == {**daemon.env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}
    assert mine["c"] == mine["d"] == {**mine["b"], "LD_PRELOAD": "/x/libxcuda.so", "XCUDA_TEST_ENV_CONFIG": "1",
                                      "XCUDA_GPU_INDEX": "2",
                                      "XCUDA_STATS_DIR": str(tmp_path / "7"), "XCUDA_MEM_QUOTA_BYTES": str(4 << 30),
                                      "XCUDA_KI": "10.0", "XCUDA_SHM_PATH": str(tmp_path / "muxflow-gpu-2")}
    assert mine["e"] == {**mine["d"], "CUDA_MPS_CLIENT_PRIORITY": "1"}
    static = _Pipe(static=True)
    job, service = exp._partitions(static)
    assert static.sent == ["lspart", "sm_partition add GPU-9 2", "sm_partition add GPU-9 8"]  # 20 % of 10 chunks
    assert (job, service) == ("GPU-9/2c", "GPU-9/8c") and exp.partitions["chunks"] == 10
    f = exp.job_env(pr.SETUP["f"], static, job, tmp_path / "8")
    assert f["CUDA_MPS_SM_PARTITION"] == "GPU-9/2c" and "LD_PRELOAD" not in f and "XCUDA_GPU_INDEX" not in f


def test_static_partition_answers_are_parsed() -> None:
    lspart = "GPU-f6b31fa7 free chunks 33, used chunks 0, free SM 132, used SM 0\n"
    assert pr.parse_lspart(lspart) == (33, 0)
    assert pr.parse_lspart("Unknown command lspart") is None
    assert pr.parse_partition("Partition GPU-f6b31fa7-854b/AbCd+9== created\n") == "GPU-f6b31fa7-854b/AbCd+9=="
    assert pr.parse_partition("GPU-f6b31fa7-854b/Zz1") == "GPU-f6b31fa7-854b/Zz1"
    assert pr.parse_partition("Failed: not in static partitioning mode") is None


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys) -> None:
    for args in (["--deadline", "0"], ["--deadline", "10", "--share", "0"], ["--deadline", "10", "--job", "lm"],
                 ["--deadline", "10", "--mem-quota", "120%"], ["--deadline", "x"]):
        with pytest.raises(SystemExit) as exc:
            pr.main(["--out", str(tmp_path), *args])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / pr.REPORT_FILE).exists()


# -- runs ------------------------------------------------------------------------------------------

def test_node_agent_core_imports_without_database_libraries() -> None:
    r = _run_blocked("import executors.node.agent, executors.node.profiling.protection, "
                     "executors.node.profiling.protection_child\n"
                     "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'dagster', 'alembic'))\n"
                     "print('loaded:', bad)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "loaded: []" in r.stdout
    r = _run_blocked("import executors.node.store_sink")  # the store writer itself still needs the database
    assert r.returncode != 0 and "sqlalchemy is not installed here" in r.stderr


def test_simulated_run_end_to_end(tmp_path) -> None:
    out = tmp_path / "out"
    r = _part(tmp_path / "site", "--out", str(out), "--deadline", "90", "--simulate", "--reps", "1", "--window", "1",
              "--baseline", "0.5", "--warmup", "1", timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not installed here" not in r.stderr  # nor in the service's and the job's processes
    assert sorted(p.name for p in out.iterdir()) == [".protection-work", "protection.json"]
    doc = json.loads((out / "protection.json").read_text())
    assert (doc["format"], doc["part"], doc["method"], doc["gpu"]) == (PART_FORMAT, "protection", "simulated", None)
    assert doc["complete"] is True and doc["why_incomplete"] is None and doc["ended"] and doc["errors"] == []
    res = doc["results"]
    assert res["simulated"] is True and res["parameters"]["allowance"] == pytest.approx(DEFAULT_SLOWDOWN_ALLOWANCE)
    assert set(res["availability"].values()) == {pr.NO_GPU}
    assert res["solo_job"]["iterations"] > 0 and res["plan"] == ["plain-1: a0 d0"]
    setups = res["setups"]
    assert {k: setups[k]["status"] for k in "bcef"} == dict.fromkeys("bcef", pr.NO_GPU)
    assert setups["a"]["status"] == "ran" and setups["d"]["status"].startswith("ran without mps")
    for key in "ad":
        (w,) = setups[key]["windows"]
        assert w["error"] is None and w["solo"]["from"] == "before and after"
        assert w["before"]["requests"] > 0 and w["after"]["requests"] > 0 and w["colocated"]["requests"] > 0
        threshold = w["solo"]["p99_ms"] * (1 + DEFAULT_SLOWDOWN_ALLOWANCE)
        assert w["slowdown_p99"] > 0 and w["threshold_p99_ms"] == pytest.approx(threshold)
        assert len(w["p99_series_ms"]) == len(w["gpu"]["sm_activity_series_pct"]) == 1
        assert w["gpu"]["sm_activity_source"] == "simulated" and w["gpu"]["samples"] > 0
        assert w["health"][0][1] == "Healthy"
        summary = setups[key]["summary"]
        assert summary["windows"] == 1 and summary["slowdown_p99"]["mean"] == w["slowdown_p99"]
        assert summary["slowdown_p99"]["std"] is None
    a, d = setups["a"]["windows"][0], setups["d"]["windows"][0]
    # the simulated GPU with the job unrestricted is over SysMonitor's limit: d evicts it, a only notes it
    assert d["eviction"]["evicted"] is True and 0 <= d["eviction"]["at_s"] < 0.5
    assert "Overlimit" in d["eviction"]["reason"] and d["offline"]["norm_tput"] < a["offline"]["norm_tput"]
    assert a["eviction"]["evicted"] is False and a["eviction"]["would_evict_at_s"]
    assert a["offline"]["iterations"] > 0
    means = {k: {"p99": setups[k]["summary"]["slowdown_p99"]["mean"], "tput": setups[k]["summary"]["norm_tput"]["mean"]}
             for k in "ad"}
    assert res["recommended"] == pr.recommend(means)
    head = res["setups_summary"]
    assert head["b"]["status"] == pr.NO_GPU and head["b"]["windows"] == 0
    assert head["a"]["slowdown_p99"] == means["a"]["p99"] and head["d"]["evicted"] == 1
    assert res["tally_bar"]["met_by"] == [k for k in "ad" if head[k]["meets_tally_bar"]]


def test_deadline_cut_leaves_a_valid_partial_file(tmp_path) -> None:
    out = tmp_path / "out"
    r = _part(tmp_path / "site", "--out", str(out), "--deadline", "6", "--simulate", timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "protection.json").read_text())
    assert doc["format"] == PART_FORMAT and doc["complete"] is False and doc["ended"]
    assert doc["why_incomplete"].startswith("deadline")
    res = doc["results"]
    assert res["solo_job"] is None and res["recommended"] is None
    assert res["setups"]["a"]["status"].startswith("not run: deadline")
    assert res["setups"]["b"]["status"] == pr.NO_GPU
