"""``make gpu-check``: one command that proves muxflow's GPU path on one lent GPU, in at most 8 minutes.

    python3 -m executors.dev.gpu_check --out DIR [--budget 480] [--parts xcuda,protection,calibration,gpu_suite]
    python3 -m executors.dev.gpu_check --out DIR --simulate        # the CPU half (make test runs it)

It runs where the GPU is, as the machine comes: the system Python with PyTorch and
nvidia-ml-py, no virtual environment, no database, no Dagster. Nothing it imports needs
SQLAlchemy, Alembic, Dagster or OR-Tools (a test holds it to that).

Each part is a child process with a deadline, which writes its own file as each of its
measurements finishes, so a run cut short (the lease ends, a part hangs and is killed)
still leaves what was measured. After every part this command rewrites ``summary.json``
and ``SUMMARY.md``. The parts, in the order they run (most new evidence first):

``xcuda``        xCUDA preloaded on the real driver (``executors.node.xcuda.realcheck``): fallback
                 rate, overhead under target, tracking at three targets with the record and launch-rate
                 series, the memory quota through three allocators, CUDA graphs, ``mem_get_info``.
``protection``   an online service beside an offline job under each sharing set-up, from time-slicing
                 to the full stack with eviction (``executors.node.profiling.protection``).
``calibration``  the co-location sweep (``executors.node.profiling.calibration_sweep``), with
                 baselines before and after each point and repetitions; it becomes ``colocation.json``
                 (``muxflow.colocation/1``).
``gpu_suite``    the project's GPU tests (``tests/gpu``, failing rather than skipping without a GPU).

The folder holds at most eight files: ``summary.json``, ``SUMMARY.md``, ``colocation.json``,
one file per part (``xcuda.json``, ``protection.json``, ``calibration.json``,
``gpu_suite.json``) and ``gpu-check.log``. Each names the GPU model, driver, date and method.
With ``--simulate`` every part runs on the CPU with simulated metrics and says so: it checks
the code, its files and their formats, and measures nothing about GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executors.job.runtime.timing import write_json_atomic
from executors.node.gpu_check_part import PART_FORMAT, part_document
from executors.node.gpu_check_part import now_iso as _now_iso

FORMAT = "muxflow.gpu-check/1"
SUMMARY_FILE, README_FILE, LOG_FILE, COLOCATION_FILE = "summary.json", "SUMMARY.md", "gpu-check.log", "colocation.json"
DEFAULT_BUDGET_S = 480.0
RESERVE_S = 15.0          # kept back for the summary and the colocation file
GRACE_S = 20.0            # a part past its deadline by this much is killed
MIN_PART_S = 20.0         # a part is not started with less time than this
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Part:
    name: str
    module: str | None     # None: run in this module (the GPU suite)
    planned_s: float       # its share of the 8 minutes on a GPU
    simulated_s: float     # and under --simulate: a ceiling (the simulated sweeps' windows are capped), set so that
                           # a CPU shared with other work, slow to import torch, still measures every point


PARTS: tuple[Part, ...] = (
    Part("xcuda", "executors.node.xcuda.realcheck", 120.0, 40.0),
    Part("protection", "executors.node.profiling.protection", 135.0, 55.0),
    Part("calibration", "executors.node.profiling.calibration_sweep", 100.0, 60.0),
    Part("gpu_suite", None, 110.0, 60.0),
)
PART_NAMES = tuple(p.name for p in PARTS)


def gpu_identity() -> dict[str, Any] | None:
    from executors.node.gpu_type import gpu_identity as identity

    try:
        return identity(0)
    except Exception as exc:  # noqa: BLE001 - the summary says what went wrong; the parts still run
        return {"error": f"{type(exc).__name__}: {exc}"}


def source_revision() -> str | None:
    """The commit the checkout is at, where git and the repository are there (the GPU machine may have neither)."""
    rev = os.environ.get("MUXFLOW_REVISION")
    if rev:
        return rev
    if shutil.which("git") and (REPO / ".git").exists():
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("+changes" if dirty else "")
    return None


class Log:
    def __init__(self, path: Path):
        self.path = path

    def __call__(self, msg: str) -> None:
        line = f"{_now_iso()} {msg}"
        print(line, flush=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def _run_child(argv: list[str], env: dict[str, str], timeout_s: float, log: Log, cwd: Path,
               dump_first: bool = False) -> tuple[int | None, str]:
    """Runs a part in its own process group; kills the group past ``timeout_s``. (exit code or None, output tail).
    ``dump_first``: a Python child started with ``PYTHONFAULTHANDLER=1`` gets SIGABRT first, so that the output
    ends with where each of its threads was (the part cannot keep anything of its own: a test run)."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        log(f"  past its deadline: killed{' (its threads dumped first)' if dump_first else ''}")
        for sig in ((signal.SIGABRT,) if dump_first else ()) + (signal.SIGTERM, signal.SIGKILL):
            try:
                if sig == signal.SIGABRT:
                    os.kill(proc.pid, sig)  # the child itself: its fault handler writes, then it ends
                else:
                    os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, _ = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out = ""
        rc = None
    out = out or ""
    tail = out[-4000:]
    dump = thread_dump(out) if dump_first and rc is None else ""
    with log.path.open("a", encoding="utf-8") as f:
        for text in (tail, f"where it was when killed:\n{dump}" if dump and dump not in tail else ""):
            if text:
                f.write(text + ("\n" if not text.endswith("\n") else ""))
    return rc, out


def thread_dump(output: str, limit: int = 6000) -> str:
    """The fault handler's dump of a Python child's threads (innermost frame first), from the child's output."""
    at = output.rfind("Fatal Python error")
    return output[at:at + limit] if at >= 0 else ""


# -- the GPU suite ------------------------------------------------------------------------------------

_SUMMARY_RE = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed|deselected)")
_VERBOSE_RE = re.compile(r"::\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
_VERBOSE_KEYS = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "errors", "XFAIL": "xfailed",
                 "XPASS": "xpassed"}


def pytest_counts(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``3 passed, 1 skipped in 2.0s``); without one (the run was killed
    before it ended), the outcomes ``-v`` printed per test so far, with ``"unfinished": 1``."""
    lines = [ln for ln in output.splitlines() if _SUMMARY_RE.search(ln) and (" in " in ln or ln.startswith("="))]
    counts: dict[str, int] = {}
    if lines:
        for n, what in _SUMMARY_RE.findall(lines[-1]):
            counts["errors" if what in ("error", "errors") else what] = int(n)
        return counts
    for what in _VERBOSE_RE.findall(output):
        key = _VERBOSE_KEYS[what]
        counts[key] = counts.get(key, 0) + 1
    return {**counts, "unfinished": 1} if counts else {}


def run_gpu_suite(out: Path, deadline_s: float, simulate: bool, log: Log) -> int | None:
    """``tests/gpu`` with pytest, without the project's conftest and settings (they need the database libraries)."""
    doc = part_document("gpu_suite", "cpu" if simulate else "real-driver")
    path = out / "gpu_suite.json"
    write_json_atomic(path, doc)
    with tempfile.TemporaryDirectory(prefix="gpu-suite-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\naddopts = -ra --import-mode=importlib\n")
        # unbuffered: what pytest printed reaches the log even if it is killed; the fault handler: where it hung
        env = {**os.environ, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
        if not simulate:
            env["MUXFLOW_REQUIRE_GPU"] = "1"   # no GPU is a failure here, not a skip
        argv = [sys.executable, "-m", "pytest", "-v", "-rs", "-c", str(ini), "--rootdir", str(REPO), "--noconftest",
                "-p", "no:cacheprovider", "--durations=0", str(REPO / "tests" / "gpu")]
        t0 = time.monotonic()
        rc, output = _run_child(argv, env, deadline_s, log, REPO, dump_first=True)
    counts = pytest_counts(output)
    doc["results"] = {"exit_code": rc, "counts": counts, "elapsed_s": round(time.monotonic() - t0, 1),
                      "output_tail": output[-2000:]}
    if rc is None:
        doc["results"]["where_it_hung"] = thread_dump(output)
    doc["complete"] = rc is not None
    doc["why_incomplete"] = None if rc is not None else f"killed at its deadline ({deadline_s:.0f} s)"
    if rc not in (0, None):
        doc["errors"].append(f"pytest exit code {rc}")
    doc["ended"] = _now_iso()
    write_json_atomic(path, doc)
    return rc


def _pythonpath() -> str:
    return os.pathsep.join([str(REPO), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])


# -- the summary --------------------------------------------------------------------------------------

def read_part(out: Path, name: str) -> dict[str, Any] | None:
    try:
        doc = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == PART_FORMAT else None


def part_status(doc: dict[str, Any] | None, ran: dict[str, Any] | None) -> str:
    if ran is None:
        return "not run"
    if ran.get("skipped"):
        return "skipped"
    if doc is None:
        return "failed"
    if doc.get("complete") and not doc.get("errors"):
        return "complete"
    return "complete, with errors" if doc.get("complete") else "partial"


def build_summary(out: Path, meta: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    parts = {}
    for p in PARTS:
        doc = read_part(out, p.name)
        ran = runs.get(p.name)
        parts[p.name] = {
            "status": part_status(doc, ran), "method": (doc or {}).get("method"),
            "elapsed_s": (ran or {}).get("elapsed_s"), "deadline_s": (ran or {}).get("deadline_s"),
            "exit_code": (ran or {}).get("exit_code"),
            "why": (ran or {}).get("why") or (doc or {}).get("why_incomplete"),
            "errors": (doc or {}).get("errors", []), "headline": headline(p.name, doc),
        }
    files = sorted(f.name for f in out.iterdir() if f.is_file())
    return {**meta, "format": FORMAT, "updated": _now_iso(), "parts": parts, "files": files}


def headline(name: str, doc: dict[str, Any] | None) -> dict[str, Any]:
    """The few figures of a part that the summary shows (whatever of them the part's file has)."""
    if not doc:
        return {}
    r = doc.get("results") or {}
    if name == "gpu_suite":
        return {"counts": r.get("counts")}
    if name == "xcuda":
        keys = ("fallback", "exit", "overhead", "tracking", "quota", "graphs")
        return {k: _brief(r.get(k)) for k in keys if k in r}
    if name == "protection":
        return {k: r.get(k) for k in ("recommended", "setups_summary", "tally_bar") if k in r}
    if name == "calibration":
        return {k: r.get(k) for k in ("points_summary", "qps", "service", "job") if k in r}
    return {}


_LONG_KEYS = ("series", "samples", "output_tail", "controller")


def _brief(x: Any, depth: int = 0) -> Any:
    """A part's result without its series (kept in the part's own file)."""
    if isinstance(x, dict):
        return {k: _brief(v, depth + 1) for k, v in x.items() if k not in _LONG_KEYS}
    if isinstance(x, list):
        return [_brief(v, depth + 1) for v in x[:12]] if depth < 3 else f"[{len(x)} items]"
    return x


def render_markdown(summary: dict[str, Any]) -> str:
    simulated = summary.get("simulated")
    gpu = summary.get("gpu") or {}
    lines = [f"# muxflow gpu-check — {summary.get('date', '')[:10]}", ""]
    if simulated:
        lines += ["**SIMULATED**: run with `--simulate` on a machine without a GPU. The parts ran on the CPU with "
                  "simulated metrics; no figure below is a GPU measurement.", ""]
    lines += [f"- GPU: {gpu.get('name', 'none')} (driver {gpu.get('driver', '?')}, CUDA {gpu.get('cuda', '?')}, "
              f"{_gib(gpu.get('memory_bytes'))})",
              f"- host: {summary.get('host')}; Python {summary.get('python')}; torch {summary.get('torch')}",
              f"- source: {summary.get('revision') or 'unknown revision'}; budget {summary.get('budget_s')} s; "
              f"elapsed {summary.get('elapsed_s')} s",
              f"- command: `{summary.get('command')}`", "",
              "| part | status | method | time (s) | notes |", "|---|---|---|---|---|"]
    for name, p in summary["parts"].items():
        why = [p["why"]] if p.get("why") and p["why"] != "running" else []
        notes = "; ".join([*(p.get("errors") or [])[:3], *why])
        el = p.get("elapsed_s")
        lines.append(f"| {name} | {p['status']} | {p.get('method') or ''} | {'' if el is None else f'{el:.0f}'} | "
                     f"{notes.replace('|', '/')[:300]} |")
    lines.append("")
    for name, p in summary["parts"].items():
        h = p.get("headline") or {}
        if h:
            lines += [f"## {name}", "", "```json", json.dumps(h, indent=1, default=str)[:6000], "```", ""]
    lines += ["Each part's full results (series included) are in its own file; `colocation.json` is the "
              "calibration sweep in `muxflow.colocation/1` (`muxflow calibrate` reads it).", ""]
    return "\n".join(lines)


def _gib(b: Any) -> str:
    return f"{b / 2**30:.0f} GiB" if isinstance(b, (int, float)) else "? GiB"


def write_summary(out: Path, meta: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    summary = build_summary(out, meta, runs)
    write_json_atomic(out / SUMMARY_FILE, summary)
    tmp = out / f".{README_FILE}.tmp"
    tmp.write_text(render_markdown(summary), encoding="utf-8")
    os.replace(tmp, out / README_FILE)
    return summary


def write_colocation(out: Path, meta: dict[str, Any], log: Log) -> str | None:
    """``colocation.json`` from the calibration part's harness report(s); None, or why not."""
    doc = read_part(out, "calibration")
    reports = _harness_reports((doc or {}).get("results"))
    if not reports:
        return "no harness report in calibration.json"
    try:
        from executors.data.harness_reports import to_colocation
    except ImportError as exc:
        return f"no converter: {exc}"
    gpu = meta.get("gpu") or {}
    try:
        coloc = to_colocation(reports, gpu_model=gpu.get("name") or "none (simulated)",
                              driver=gpu.get("driver") or "none", date=meta["date"][:10],
                              method=(doc or {}).get("method") or "unknown")
    except (ValueError, KeyError, TypeError) as exc:
        return f"conversion failed: {exc}"
    write_json_atomic(out / COLOCATION_FILE, coloc)
    log(f"wrote {COLOCATION_FILE}")
    return None


def _harness_reports(results: Any) -> list[dict[str, Any]]:
    if not isinstance(results, dict):
        return []
    if isinstance(results.get("reports"), list):
        return [r for r in results["reports"] if isinstance(r, dict)]
    if isinstance(results.get("report"), dict):
        return [results["report"]]
    return [results] if "points" in results else []


# -- the run ------------------------------------------------------------------------------------------

def run(out: Path, *, budget_s: float, parts: list[str], simulate: bool, command: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    for f in [*(f"{p}.json" for p in PART_NAMES), SUMMARY_FILE, README_FILE, LOG_FILE, COLOCATION_FILE]:
        (out / f).unlink(missing_ok=True)   # one run's files, never a mix with an earlier run's
    log = Log(out / LOG_FILE)
    t0 = time.monotonic()
    meta: dict[str, Any] = {
        "date": _now_iso(), "simulated": simulate, "method": "simulated" if simulate else "gpu",
        "gpu": None if simulate else gpu_identity(), "host": platform.node(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "torch": _torch_version(), "revision": source_revision(),
        "budget_s": budget_s, "command": command, "elapsed_s": 0.0,
    }
    log(f"gpu-check {'(SIMULATED) ' if simulate else ''}into {out}: parts {', '.join(parts)}; budget {budget_s:.0f} s")
    log(f"GPU: {meta['gpu']}")
    runs: dict[str, dict[str, Any]] = {}
    write_summary(out, meta, runs)
    for p in PARTS:
        if p.name not in parts:
            continue
        left = budget_s - (time.monotonic() - t0) - RESERVE_S
        want = p.simulated_s if simulate else p.planned_s
        deadline = min(want, left)
        if deadline < min(MIN_PART_S, want):
            runs[p.name] = {"skipped": True, "why": f"{max(left, 0):.0f} s left of the budget"}
            log(f"{p.name}: skipped ({runs[p.name]['why']})")
            write_summary(out, meta, runs)
            continue
        log(f"{p.name}: starting, deadline {deadline:.0f} s")
        started = time.monotonic()
        if p.module is None:
            rc: int | None = run_gpu_suite(out, deadline, simulate, log)
        else:
            argv = [sys.executable, "-m", p.module, "--out", str(out), "--deadline", f"{deadline:.0f}"]
            if simulate:
                argv.append("--simulate")
            rc, _ = _run_child(argv, {**os.environ, "PYTHONPATH": _pythonpath()}, deadline + GRACE_S, log, REPO)
        shutil.rmtree(out / f".{p.name}-work", ignore_errors=True)
        elapsed = time.monotonic() - started
        runs[p.name] = {"elapsed_s": round(elapsed, 1), "deadline_s": round(deadline), "exit_code": rc,
                        "why": None if rc is not None else f"killed {GRACE_S:.0f} s past its deadline"}
        log(f"{p.name}: exit {rc} after {elapsed:.0f} s; {part_status(read_part(out, p.name), runs[p.name])}")
        meta["elapsed_s"] = round(time.monotonic() - t0, 1)
        write_summary(out, meta, runs)
    if "calibration" in parts:
        why = write_colocation(out, meta, log)
        if why:
            log(f"{COLOCATION_FILE} not written: {why}")
            meta["colocation"] = why
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    summary = write_summary(out, meta, runs)
    states = ", ".join(f"{k} {v['status']}" for k, v in summary["parts"].items())
    log(f"done in {meta['elapsed_s']:.0f} s: {states}")
    return summary


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    cuda = getattr(torch.version, "cuda", None)
    return f"{torch.__version__}" + (f" (CUDA {cuda})" if cuda else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m executors.dev.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the folder for the results (at most 8 files)")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for the whole run (default 480)")
    ap.add_argument("--parts", default=",".join(PART_NAMES), help=f"comma-separated, of {', '.join(PART_NAMES)}")
    ap.add_argument("--simulate", action="store_true", help="no GPU: the CPU half, simulated metrics")
    a = ap.parse_args(argv)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    unknown = [x for x in parts if x not in PART_NAMES]
    if unknown or not parts:
        print(f"error: --parts: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(PART_NAMES)})",
              file=sys.stderr)
        return 2
    if not a.budget > 0:
        print("error: --budget must be positive", file=sys.stderr)
        return 2
    command = "python3 -m executors.dev.gpu_check " + " ".join(argv if argv is not None else sys.argv[1:])
    summary = run(Path(a.out), budget_s=a.budget, parts=parts, simulate=a.simulate, command=command)
    bad = [k for k, v in summary["parts"].items() if k in parts and v["status"] in ("failed",)]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
