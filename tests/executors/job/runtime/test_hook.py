"""The start-up hook (executors/job/runtime/hook/sitecustomize.py): the iteration report of a job that imports nothing
of MuxFlow, from torch's global optimizer step hook. Every test runs a real Python process, as a job would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from executors.node.profile_windows import parse_iteration_report

REPO = Path(__file__).resolve().parents[4]
HOOK_DIR = REPO / "executors" / "job" / "runtime" / "hook"
PYTHON = sys.executable
FIELDS = {"format", "final", "stopped_by", "iterations", "warmup_iterations", "total_iterations", "mean_s", "p50_s",
          "p95_s", "min_s", "max_s", "first_iteration_s", "elapsed_s", "window_start_unix", "window_end_unix",
          "started_unix", "last_step", "max_iterations", "max_seconds", "observed", "host", "pid", "signal"}

# A small deterministic training step; `step()` is one iteration of one optimizer.
PRELUDE = """
import hashlib, json, os, sys, time
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x, y = torch.randn(32, 8), torch.randn(32, 1)

def step(o=opt, sleep=0.0):
    o.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x + 0.01 * torch.randn_like(x)), y)
    loss.backward()
    o.step()
    if sleep:
        time.sleep(sleep)
    return loss

def report_now():
    with open(os.environ["MUXFLOW_ITERATION_REPORT"], "rb") as f:
        return f.read().decode()
"""


def _env(report: Path | None, hook: bool = True, path: tuple[Path, ...] = (), **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUXFLOW_") and k != "PYTHONPATH"}
    paths = ([str(HOOK_DIR)] if hook else []) + [str(p) for p in path]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    if report is not None:
        env["MUXFLOW_ITERATION_REPORT"] = str(report)
    env.update(more)
    return env


def _start(tmp_path: Path, script: str, env: dict[str, str], name: str = "job.py",
           prelude: bool = True) -> subprocess.Popen[str]:
    f = tmp_path / name
    f.write_text((PRELUDE if prelude else "") + textwrap.dedent(script))
    return subprocess.Popen([PYTHON, str(f)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, err
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run(tmp_path: Path, script: str, env: dict[str, str], name: str = "job.py",
         prelude: bool = True) -> subprocess.CompletedProcess[str]:
    return _wait(_start(tmp_path, script, env, name, prelude))


def _run_both(tmp_path: Path, script: str, report: Path,
              path: tuple[Path, ...] = ()) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The same job with the hook (in ``a/``, reporting to ``report``) and without it (in ``b/``), side by side."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    hooked = _start(tmp_path / "a", script, _env(report, path=path))
    plain = _start(tmp_path / "b", script, _env(None, hook=False, path=path))
    return _wait(hooked), _wait(plain)


def _check(data: bytes | str) -> dict:
    """A report the hook wrote: the node agent takes it, and it has the runtime's fields plus the signal."""
    raw = data.encode() if isinstance(data, str) else data
    parse_iteration_report(raw)  # raises ReportRefused for anything the agent refuses
    rep = json.loads(raw)
    assert set(rep) == FIELDS and rep["signal"] == "optimizer-step" and rep["observed"] is True
    return rep


def _final(report: Path) -> dict:
    rep = _check(report.read_bytes())
    assert rep["final"] is True and rep["stopped_by"] == "finished"
    return rep


def _line(out: str, key: str) -> str:
    return next(ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith(key + " "))


PLAIN_LOOP = """
for i in range(30):
    loss = step(sleep=0.01)
h = hashlib.sha256()
for p in model.parameters():
    h.update(json.dumps([v.hex() for v in p.detach().flatten().tolist()]).encode())
import warnings
print("PARAMS", h.hexdigest())
print("LOSS", loss.item().hex())
print("RNG", hashlib.sha256(bytes(torch.get_rng_state().tolist())).hexdigest())
print("THREADS", torch.get_num_threads(), torch.get_num_interop_threads())
print("WARNINGS", len(warnings.filters))
print("PID", os.getpid())
mod = sys.modules["torch.optim.optimizer"]
print("LOADER", type(mod.__loader__).__name__, mod.__spec__.loader is mod.__loader__)
"""


def test_a_plain_loop_writes_the_final_report(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, PLAIN_LOOP, _env(report))
    rep = _final(report)
    assert rep["total_iterations"] == 30 and rep["iterations"] == 28 and rep["warmup_iterations"] == 2
    assert 0.01 <= rep["mean_s"] < 0.5  # each iteration sleeps 10 ms
    assert rep["min_s"] <= rep["p50_s"] <= rep["p95_s"] <= rep["max_s"]
    assert rep["window_start_unix"] <= rep["window_end_unix"]
    assert rep["window_end_unix"] - rep["window_start_unix"] == pytest.approx(rep["mean_s"] * 28, rel=1e-6)
    assert rep["pid"] == int(_line(p.stdout, "PID")) and rep["last_step"] is None
    assert sorted(os.listdir(tmp_path)) == ["iteration.json", "job.py"]  # no temporary file left behind
    assert p.stderr == ""


def test_the_hook_changes_nothing_the_job_computes(tmp_path: Path) -> None:
    hooked, plain = _run_both(tmp_path, PLAIN_LOOP, tmp_path / "a" / "iteration.json")
    assert _final(tmp_path / "a" / "iteration.json")["total_iterations"] == 30
    for key in ("PARAMS", "LOSS", "RNG", "THREADS", "WARNINGS", "LOADER"):
        assert _line(hooked.stdout, key) == _line(plain.stdout, key), key
    assert hooked.stderr == plain.stderr == ""


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    _run(tmp_path, """
    for micro in range(40):
        loss = torch.nn.functional.mse_loss(model(x), y) / 4
        loss.backward()
        if (micro + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
    """, _env(report))
    rep = _final(report)
    assert rep["total_iterations"] == 10 and rep["iterations"] == 8


def test_two_optimizers_stepping_each_iteration_count_once(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    _run(tmp_path, """
    disc = torch.nn.Linear(1, 1)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    for i in range(12):
        opt_d.zero_grad()
        disc(model(x).detach()).mean().backward()
        opt_d.step()          # the discriminator steps first: the counted optimizer
        step()                # then the generator
    """, _env(report))
    assert _final(report)["total_iterations"] == 12


def test_the_next_optimizer_is_counted_once_the_first_is_gone(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    _run(tmp_path, """
    import gc
    for i in range(3):
        step()
    del opt, step  # the default argument held it
    gc.collect()
    opt2 = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(4):
        opt2.zero_grad(); model(x).mean().backward(); opt2.step()
    """, _env(report))
    assert _final(report)["total_iterations"] == 7


TRAINER = """
class Trainer:
    '''Library-style: the optimizer and the scheduler are made and stepped out of the user's sight.'''

    def __init__(self, model, epochs):
        self.model, self.epochs = model, epochs
        self.optimizer = self.lr_scheduler = None

    def create_optimizer_and_scheduler(self, steps):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.01)
        self.lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=1e-2, total_steps=steps)

    def training_step(self, batch):
        xb, yb = batch
        return torch.nn.functional.mse_loss(self.model(xb), yb)

    def train(self, loader):
        self.create_optimizer_and_scheduler(self.epochs * len(loader))
        for epoch in range(self.epochs):
            for batch in loader:
                loss = self.training_step(batch)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.lr_scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        return loss

data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
loss = Trainer(model, epochs=3).train(loader)
print("LOSS", loss.item().hex())
"""


def test_a_trainer_like_class_with_a_scheduler(tmp_path: Path) -> None:
    hooked, plain = _run_both(tmp_path, TRAINER, tmp_path / "a" / "iteration.json")
    rep = _final(tmp_path / "a" / "iteration.json")
    assert rep["total_iterations"] == 15 and rep["iterations"] == 13  # 3 epochs of 5 batches
    assert _line(hooked.stdout, "LOSS") == _line(plain.stdout, "LOSS")
    assert hooked.stderr == plain.stderr == ""  # no scheduler warning ("lr_scheduler.step() before ...")


def test_lr_schedulers_keep_working(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    import warnings
    warnings.simplefilter("error")  # the "scheduler before optimizer" warning would fail the job
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=100)
    for i in range(20):
        loss = step()
        sched.step()
        plateau.step(loss.item())
    print("LR", opt.param_groups[0]["lr"])
    """, _env(report))
    assert float(_line(p.stdout, "LR")) == pytest.approx(0.05 * 0.5 ** 4)
    assert _final(report)["total_iterations"] == 20


def test_the_report_is_kept_up_to_date_while_iterating(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    for i in range(24):
        step(sleep=0.06)
        if i == 19:
            print("MID", report_now().replace(chr(10), " "))
    """, _env(report))
    mid = _check(_line(p.stdout, "MID"))
    assert mid["final"] is False and mid["stopped_by"] is None
    assert 1 <= mid["total_iterations"] < 20  # written at the first step, then at most once a second
    assert _final(report)["total_iterations"] == 24


@pytest.mark.parametrize(("warmup", "left_out"), [("0", 0), ("5", 5), ("junk", 2)])
def test_warm_up_iterations_follow_the_profiling_setting(tmp_path: Path, warmup: str, left_out: int) -> None:
    report = tmp_path / "iteration.json"
    _run(tmp_path, "for i in range(8):\n    step()\n", _env(report, MUXFLOW_PROFILE_WARMUP=warmup))
    rep = _final(report)
    assert rep["warmup_iterations"] == left_out and rep["iterations"] == 8 - left_out


def test_at_most_ten_thousand_iterations_are_recorded(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    _run(tmp_path, """
    w = torch.nn.Parameter(torch.ones(1))
    w.grad = torch.ones(1)
    tiny = torch.optim.SGD([w], lr=0.0)
    for i in range(10_050):
        tiny.step()
    """, _env(report))
    rep = _final(report)
    assert rep["total_iterations"] == 10_000 and rep["iterations"] == 9_998


def test_a_job_that_never_imports_torch_pays_nothing(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    import sys, json
    hook = sys.modules["_muxflow_iteration_hook"]
    print("STATE", json.dumps([hook._hook is not None, "torch" in sys.modules,
                               sorted(m for m in sys.modules if m.startswith("torch"))]))
    """, _env(report), prelude=False)
    assert json.loads(_line(p.stdout, "STATE")) == [True, False, []]
    assert not report.exists() and p.stderr == ""


def test_without_the_variable_nothing_happens(tmp_path: Path) -> None:
    p = _run(tmp_path, """
    for i in range(5):
        step()
    print("STATE", json.dumps(["_muxflow_iteration_hook" in sys.modules,
                               len(sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks),
                               [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_Finder"]]))
    """, _env(None))
    assert json.loads(_line(p.stdout, "STATE")) == [False, 0, []]
    assert sorted(os.listdir(tmp_path)) == ["job.py"] and p.stderr == ""


@pytest.mark.parametrize("observed", [True, False])
def test_the_next_sitecustomize_still_runs(tmp_path: Path, observed: bool) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(textwrap.dedent("""
        import os
        os.environ["OTHER_SITECUSTOMIZE"] = __name__
        with open(os.environ["CHAIN_MARK"], "a") as f:
            f.write("ran\\n")
    """))
    report = tmp_path / "iteration.json"
    mark = tmp_path / "mark.txt"
    p = _run(tmp_path, """
    for i in range(4):
        step()
    import sitecustomize
    print("OTHER", os.environ.get("OTHER_SITECUSTOMIZE"), sitecustomize.__file__)
    """, _env(report if observed else None, path=(other,), CHAIN_MARK=str(mark)))
    assert _line(p.stdout, "OTHER") == f"sitecustomize {other / 'sitecustomize.py'}"
    assert mark.read_text() == "ran\n"  # once
    if observed:
        assert _final(report)["total_iterations"] == 4
    else:
        assert not report.exists()


def test_a_failing_next_sitecustomize_is_reported_as_python_does(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('boom')\n")
    report = tmp_path / "a" / "iteration.json"
    hooked, plain = _run_both(tmp_path, "for i in range(3):\n    step()\n", report, path=(other,))
    assert hooked.stderr == plain.stderr == ("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                                             "RuntimeError: boom\n")
    assert _final(report)["total_iterations"] == 3


@pytest.mark.parametrize("when", ["before-torch", "after-torch"])
def test_the_hook_defers_to_the_runtime_owner_variable(tmp_path: Path, when: str) -> None:
    report = tmp_path / "iteration.json"
    owner = f'import os\nos.environ["MUXFLOW_ITERATION_REPORT_OWNER"] = {str(report)!r}\n'
    _run(tmp_path, (owner if when == "before-torch" else "") + PRELUDE + (owner if when == "after-torch" else "") + """
for i in range(5):
    step()
""", _env(report), prelude=False)
    if when == "before-torch":
        assert not report.exists()  # not even the announcement
    else:  # the announcement stays, no step counted
        rep = _check(report.read_bytes())
        assert rep["total_iterations"] == 0 and rep["final"] is False


def test_an_owner_of_another_report_inherited_from_the_submitting_shell_is_ignored(tmp_path: Path) -> None:
    """sbatch passes the submitter's environment on: an owner variable naming another report (a process that
    observed another window, a test runner) must not silence this job's report."""
    report = tmp_path / "iteration.json"
    _run(tmp_path, """
    for i in range(5):
        step()
    """, _env(report, MUXFLOW_ITERATION_REPORT_OWNER=str(tmp_path / "other" / "iteration.json")))
    assert _final(report)["total_iterations"] == 5


def test_a_job_still_starting_up_has_announced_its_steps(tmp_path: Path) -> None:
    """Once torch's optimizer module is loaded, before any step: the report with no iteration, which the agent
    takes; then the steps replace it."""
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    print("BEFORE", report_now().replace(chr(10), " "))
    for i in range(5):
        step()
    print("PID", os.getpid())
    """, _env(report))
    before = _check(_line(p.stdout, "BEFORE"))
    assert (before["iterations"], before["total_iterations"], before["final"], before["mean_s"], before["pid"]) == (
        0, 0, False, None, int(_line(p.stdout, "PID")))
    assert _final(report)["total_iterations"] == 5
    assert sorted(os.listdir(tmp_path)) == ["iteration.json", "job.py"]  # no temporary file left


def test_the_announcement_never_replaces_a_report(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    report.write_text("someone else's\n")
    _run(tmp_path, """
    print("LOADED", "torch.optim.optimizer" in sys.modules)
    """, _env(report))
    assert report.read_text() == "someone else's\n"
    assert sorted(os.listdir(tmp_path)) == ["iteration.json", "job.py"]


def test_a_launcher_that_imports_torch_but_never_steps_leaves_the_report_to_its_worker(tmp_path: Path) -> None:
    """torchrun's way: the launcher loads torch (its announcement is on disk, its process alive and older), the
    worker steps: the worker holds the report."""
    (tmp_path / "child.py").write_text(PRELUDE + CHILD)
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    import subprocess
    print("ANNOUNCED", json.loads(report_now())["pid"] == os.getpid())
    out = subprocess.run([sys.executable, "child.py"], capture_output=True, text=True, check=True).stdout
    print(out.strip())
    """, _env(report))
    assert _line(p.stdout, "ANNOUNCED") == "True"
    child, quiet = _line(p.stdout, "CHILD").split()
    assert quiet == "False"
    rep = _final(report)
    assert rep["pid"] == int(child) and rep["total_iterations"] == 20


def test_a_runtime_job_writes_its_own_report(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    _run(tmp_path, f"""
    from executors.job.runtime import Runtime
    rt = Runtime({str(tmp_path / "ckpt")!r}, every_steps=1000)
    for s in range(1, 7):
        step()
        step()  # two optimizer steps per runtime step
        rt.step_done(s, lambda: {{}})
    """, _env(report, path=(REPO,)))
    raw = report.read_bytes()
    parse_iteration_report(raw)
    rep = json.loads(raw)
    assert rep["signal"] == "runtime" and rep["total_iterations"] == 6 and rep["final"] is True


@pytest.mark.parametrize("where", ["missing-dir", "a-directory"])
def test_an_unwritable_report_path_never_stops_the_job(tmp_path: Path, where: str) -> None:
    target = tmp_path / "missing" / "iteration.json" if where == "missing-dir" else tmp_path / "adir"
    if where == "a-directory":
        target.mkdir()
    p = _run(tmp_path, """
    for i in range(10):
        step()
    print("DONE")
    """, _env(target))
    assert "DONE" in p.stdout
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("muxflow iteration hook: cannot write")
    assert sorted(os.listdir(tmp_path)) == (["job.py"] if where == "missing-dir" else ["adir", "job.py"])
    if where == "a-directory":
        assert os.listdir(target) == []


def test_a_forked_child_neither_counts_nor_writes(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    torch.set_num_threads(1)
    for i in range(5):
        step()
    pid = os.fork()
    if pid == 0:
        time.sleep(1.1)  # a progress write would be due
        for i in range(50):
            step()
        sys.stdout.flush()
        sys.exit(0)  # atexit runs in the child too
    _, status = os.waitpid(pid, 0)
    assert status == 0
    print("MID", report_now().replace(chr(10), " "))
    for i in range(5):
        step()
    print("PID", os.getpid())
    """, _env(report))
    parent = int(_line(p.stdout, "PID"))
    mid = _check(_line(p.stdout, "MID"))
    assert mid["pid"] == parent and mid["total_iterations"] <= 5 and mid["final"] is False
    rep = _final(report)
    assert rep["pid"] == parent and rep["total_iterations"] == 10


def test_dataloader_workers_neither_count_nor_write(tmp_path: Path) -> None:
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    torch.set_num_threads(1)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            w = torch.nn.Parameter(torch.ones(1))
            w.grad = torch.ones(1)
            torch.optim.SGD([w], lr=0.1).step()  # a worker stepping an optimizer of its own
            return torch.full((8,), float(i)), torch.ones(1)

    loader = torch.utils.data.DataLoader(Data(), batch_size=4, num_workers=2)
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
    print("PID", os.getpid())
    """, _env(report))
    rep = _final(report)
    assert rep["pid"] == int(_line(p.stdout, "PID")) and rep["total_iterations"] == 8
    assert sorted(os.listdir(tmp_path)) == ["iteration.json", "job.py"]


CHILD = """
for i in range(20):
    step(sleep=0.06)
print("CHILD", os.getpid(), sys.modules["_muxflow_iteration_hook"]._hook.quiet)
"""


def test_a_subprocess_defers_to_the_main_process_that_steps(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(PRELUDE + CHILD)
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    import subprocess
    for i in range(5):
        step()
    out = subprocess.run([sys.executable, "child.py"], capture_output=True, text=True, check=True).stdout
    print(out.strip())
    print("MID", report_now().replace(chr(10), " "))
    for i in range(5):
        step()
    print("PID", os.getpid())
    """, _env(report))
    parent = int(_line(p.stdout, "PID"))
    assert _line(p.stdout, "CHILD").split()[1] == "True"  # the child went quiet
    assert _check(_line(p.stdout, "MID"))["pid"] == parent
    rep = _final(report)
    assert rep["pid"] == parent and rep["total_iterations"] == 10


def test_a_launcher_that_never_steps_leaves_the_report_to_its_worker(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(PRELUDE + CHILD)
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    import subprocess, sys
    out = subprocess.run([sys.executable, "child.py"], capture_output=True, text=True, check=True).stdout
    print(out.strip())
    """, _env(report), prelude=False)
    child, quiet = _line(p.stdout, "CHILD").split()
    assert quiet == "False"
    rep = _final(report)
    assert rep["pid"] == int(child) and rep["total_iterations"] == 20


def test_a_torch_without_the_global_step_hook_is_left_alone(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "torch" / "optim").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("from torch import optim\n")
    (fake / "torch" / "optim" / "__init__.py").write_text("from torch.optim.optimizer import Optimizer\n")
    (fake / "torch" / "optim" / "optimizer.py").write_text("class Optimizer:\n    pass\n")  # torch < 2.0
    report = tmp_path / "iteration.json"
    p = _run(tmp_path, """
    import sys, torch
    print("LOADER", type(sys.modules["torch.optim.optimizer"].__loader__).__name__)
    """, _env(report, path=(fake,)), prelude=False)
    assert _line(p.stdout, "LOADER") == "SourceFileLoader"
    assert p.stderr == ("muxflow iteration hook: this torch has no global optimizer step hook (torch >= 2.0 has); "
                        "iterations are not reported\n")
    assert not report.exists()
