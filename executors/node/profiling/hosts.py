"""The co-location harness's workloads as long-lived processes it pauses and resumes: the service and the jobs.

A calibration sweep measures dozens of short windows (the service alone, the job alone, both at an SM %).
Starting a process for each would cost seconds of GPU time per window (a CUDA context, the model, the
first iterations) and would measure every solo baseline in a different process (two runs of one service
differed by 3.2 vs 5.6 ms, measured on one H200 on 2026-11-27). Instead each workload is one process for
the whole sweep, told by the harness when to run:

- **the service** (:func:`run_service`) serves the model, the request pool and the batching policy of
  :mod:`executors.job.workloads.serve`: open-loop arrivals; requests that queued while the server was busy
  are served first-come first-served, up to ``max_batch`` at a time (dynamic batching without a queueing
  delay). The harness changes the offered load while it runs (its QPS calibration) and **pauses** arrivals:
  a pause stops admitting arrivals at once, serves what had arrived, then idles; a resume restarts the
  arrival process from that moment (Poisson arrivals are memoryless: no burst of "missed" requests). Every
  served batch is appended to a stream file as it is served, one JSON line
  ``[start_unix, finish_unix, [arrival_unix, ...]]``.
- **a job** (:func:`run_job`) trains the model, optimizer and batches of :mod:`executors.job.workloads.train`
  (one process per MPS share: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` binds at its CUDA context). Paused, it
  finishes the iteration in progress and idles, its context and memory kept; running, it appends every
  iteration to a stream file, one line ``<start_unix> <end_unix>``.

Both are driven through a control file (``{"seq", "paused", "stop"}``, the service's with ``qps``),
rewritten atomically by the harness, and acknowledge in a state file (``{"seq", "paused", "idle"}``): a
pause is acknowledged once the process is idle. ``ready`` is written once the model is warm: the
service's with the service time of a batch of 1 and of ``max_batch`` requests (the harness's first guess
of its capacity), a job's with its iteration time and the GPU memory it holds. A process stops on
``stop``, SIGTERM/SIGINT, ``max_s`` of life, or when its parent goes away.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CONTROL_POLL_S = 0.01   # how often the control file is looked at (and the longest idle sleep)
SERVICE_POOL = 8        # distinct request payloads cycled through (as serve.py)
JOB_POOL = 4            # distinct training batches cycled through (as train.py)


def write_json(path: str | Path, obj: dict) -> None:
    """Atomic replace without fsync: the reader is a process on this machine polling the file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, p)


def read_json_file(path: str | Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class ServiceConfig:
    family: str
    size: str
    qps: float
    stream: str
    ready: str
    control: str
    state: str
    device: str = "auto"
    max_batch: int = 1
    seed: int = 0
    threads: int = 1
    paused: bool = True        # start with arrivals paused
    arrivals: str = "poisson"  # or "uniform"
    max_s: float = 6 * 3600.0  # the longest the process lives (an orphaned one must not run forever)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobConfig:
    family: str
    size: str
    stream: str
    ready: str
    control: str
    state: str
    device: str = "auto"
    seed: int = 0
    threads: int = 1
    warmup: int = 3            # iterations before ``ready`` (lazy initialisation, kernel selection)
    max_s: float = 6 * 3600.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Control:
    """The harness's wishes as last read from the control file, and their acknowledgement."""

    def __init__(self, control: str | Path, state: str | Path, clock: Callable[[], float], *,
                 qps: float | None = None, paused: bool = True, max_s: float = 6 * 3600.0):
        self.path, self.state_path = Path(control), Path(state)
        self.clock = clock
        self.qps, self.paused, self.stop = qps, paused, False
        self.seq = 0
        self.idle = False
        self.count = 0  # what the process has done (requests served, iterations)
        self._raw: bytes | None = None
        self._next = 0.0
        self._ppid = os.getppid()
        self._born = clock()
        self.max_s = max_s
        self.acked: tuple | None = None

    def poll(self, now: float) -> bool:
        """Re-read the control file when it changed (at most every CONTROL_POLL_S); True when the rate changed."""
        if now < self._next:
            return False
        self._next = now + CONTROL_POLL_S
        if os.getppid() != self._ppid or now - self._born > self.max_s:
            self.stop = True  # orphaned (the harness is gone) or past its life
            return False
        try:
            raw = self.path.read_bytes()
        except OSError:
            return False
        if raw == self._raw:
            return False
        try:
            data = json.loads(raw)
        except ValueError:
            return False  # a partial file (never with a replace; a hand-edited one): read it again next time
        if not isinstance(data, dict):
            return False
        self._raw = raw
        changed = False
        qps = data.get("qps")
        if (self.qps is not None and isinstance(qps, (int, float)) and math.isfinite(qps) and qps > 0
                and float(qps) != self.qps):
            self.qps, changed = float(qps), True
        self.paused = bool(data.get("paused", self.paused))
        self.stop = self.stop or bool(data.get("stop", False))
        self.seq = int(data.get("seq", self.seq))
        if not self.paused:
            self.idle = False
        return changed

    def ack(self) -> None:
        """The state file, rewritten when something the harness waits for changed."""
        key = (self.seq, self.qps, self.paused, self.idle)
        if key != self.acked:
            write_json(self.state_path, {"seq": self.seq, "qps": self.qps, "paused": self.paused, "idle": self.idle,
                                         "count": self.count, "unix": time.time()})
            self.acked = key


def _on_signals(stop: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _f: stop.append(signum))


# -- the service -----------------------------------------------------------------------------------------

def serve_loop(handle: Callable[[int], None], ctl: Control, out, *, max_batch: int, seed: int = 0,
               arrivals: str = "poisson", clock: Callable[[], float] = time.perf_counter,
               sleep: Callable[[float], None] = time.sleep, wall_offset: float | None = None,
               should_stop: Callable[[], bool] = lambda: False) -> int:
    """Serve until ``ctl.stop`` or ``should_stop()``; every batch is written to ``out`` (a text file) as a JSON
    line with wall-clock times (``clock() + wall_offset``). Returns the number of requests served."""
    if max_batch < 1:
        raise ValueError("max_batch: must be >= 1")
    if arrivals not in ("poisson", "uniform"):
        raise ValueError(f"arrivals: expected poisson or uniform, got {arrivals!r}")
    rng = random.Random(seed)
    off = (time.time() - clock()) if wall_offset is None else wall_offset

    def gap() -> float:
        return rng.expovariate(ctl.qps) if arrivals == "poisson" else 1.0 / ctl.qps

    queue: deque[float] = deque()
    t_next: float | None = None
    while not (ctl.stop or should_stop()):
        now = clock()
        if ctl.poll(now) and t_next is not None:
            t_next = now + gap()  # a new rate from now on (memoryless)
        if ctl.paused:
            t_next = None
            if not queue:
                ctl.idle = True
                ctl.ack()
                sleep(CONTROL_POLL_S)
                continue
        else:
            if t_next is None:
                t_next = now + gap()
            while t_next <= now:
                queue.append(t_next)
                t_next += gap()
        ctl.ack()  # writes only when something changed
        if not queue:
            sleep(max(0.0, min(t_next - now, CONTROL_POLL_S)) if t_next is not None else CONTROL_POLL_S)
            continue
        n = min(len(queue), max_batch)
        batch = [queue.popleft() for _ in range(n)]
        start = clock()
        handle(n)
        finish = clock()
        out.write(json.dumps([start + off, finish + off, [a + off for a in batch]]) + "\n")
        out.flush()
        ctl.count += n
    return ctl.count


def _start(cfg: ServiceConfig | JobConfig):
    """What both processes do first: stop on SIGTERM/SIGINT, the workload, its device and threads, the seeded model.
    (stop flags, workload size, device, model on the device)."""
    import torch

    from executors.job.workloads.device import resolve_device, set_threads
    from executors.job.workloads.models import build_model, workload_size

    stop: list[int] = []
    _on_signals(stop)
    w = workload_size(cfg.family, cfg.size)
    dev = resolve_device(cfg.device)
    set_threads(dev, cfg.threads)
    torch.manual_seed(cfg.seed)
    return stop, w, dev, build_model(w).to(dev)


def run_service(cfg: ServiceConfig) -> int:
    """The service's process: build and warm the model, write ``ready``, serve until stopped. Exit status."""
    import torch

    from executors.job.workloads.device import describe, synchronize
    from executors.job.workloads.models import batch_pool, parameter_count

    stop, w, dev, model = _start(cfg)
    model.eval()
    pool = batch_pool(w, cfg.max_batch, SERVICE_POOL, cfg.seed + 1, dev)
    count = [0]

    def handle(n: int) -> None:
        inputs, _ = pool[count[0] % SERVICE_POOL]
        with torch.inference_mode():
            model(*(x[:n] for x in inputs))
        synchronize(dev)
        count[0] += 1

    # every batch size once (lazy initialisation, kernel selection per shape), then the service times
    for n in [1, 1, 1, *range(2, cfg.max_batch + 1)]:
        handle(n)
    times: dict[str, float] = {}
    for label, n in (("1", 1), ("max", cfg.max_batch)):
        t = []
        for _ in range(5):
            t0 = time.perf_counter()
            handle(n)
            t.append(time.perf_counter() - t0)
        times[label] = sorted(t)[len(t) // 2]
    ctl = Control(cfg.control, cfg.state, time.perf_counter, qps=float(cfg.qps), paused=cfg.paused, max_s=cfg.max_s)
    with open(cfg.stream, "a", buffering=1 << 16) as out:
        write_json(cfg.ready, {"ready_unix": time.time(), "pid": os.getpid(), "device": describe(dev),
                               "device_type": dev.type, "job_type": w.job_type, "family": cfg.family,
                               "size": cfg.size, "max_batch": cfg.max_batch, "parameters": parameter_count(model),
                               "service_time_s": times, **_memory(torch, dev)})
        serve_loop(handle, ctl, out, max_batch=cfg.max_batch, seed=cfg.seed, arrivals=cfg.arrivals,
                   should_stop=lambda: bool(stop))
    return 0


def _memory(torch, dev) -> dict[str, Any]:
    if dev.type != "cuda":
        return {"memory_reserved_bytes": None}
    return {"memory_reserved_bytes": int(torch.cuda.memory_reserved(dev))}


# -- a job -------------------------------------------------------------------------------------------------

def job_loop(step: Callable[[], None], ctl: Control, out, *, clock: Callable[[], float] = time.perf_counter,
             sleep: Callable[[float], None] = time.sleep, wall_offset: float | None = None,
             should_stop: Callable[[], bool] = lambda: False) -> int:
    """Run ``step()`` (one training iteration, synchronised) while not paused, until stopped; every iteration is
    written to ``out`` as ``<start_unix> <end_unix>``. Returns the number of iterations."""
    off = (time.time() - clock()) if wall_offset is None else wall_offset
    while not (ctl.stop or should_stop()):
        ctl.poll(clock())
        if ctl.paused:
            ctl.idle = True
            ctl.ack()
            sleep(CONTROL_POLL_S)
            continue
        ctl.ack()
        t0 = clock()
        step()
        t1 = clock()
        out.write(f"{t0 + off:.6f} {t1 + off:.6f}\n")
        out.flush()
        ctl.count += 1
    return ctl.count


def run_job(cfg: JobConfig) -> int:
    """A job's process: build the model, run ``warmup`` iterations, write ``ready``, train while told to."""
    import torch

    from executors.job.workloads.device import describe, synchronize
    from executors.job.workloads.models import batch_pool, loss_fn

    stop, w, dev, model = _start(cfg)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    pool = batch_pool(w, w.train_batch, JOB_POOL, cfg.seed + 1, dev)
    done = [0]

    def step() -> None:
        inputs, y = pool[done[0] % JOB_POOL]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(w, model(*inputs), y)
        loss.backward()
        opt.step()
        synchronize(dev)
        done[0] += 1

    times = []
    for _ in range(max(1, cfg.warmup)):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    ctl = Control(cfg.control, cfg.state, time.perf_counter, paused=True, max_s=cfg.max_s)
    with open(cfg.stream, "a", buffering=1 << 12) as out:
        write_json(cfg.ready, {"ready_unix": time.time(), "pid": os.getpid(), "device": describe(dev),
                               "device_type": dev.type, "job_type": w.job_type, "family": cfg.family,
                               "size": cfg.size, "train_batch": w.train_batch, "iteration_s": times[-1],
                               "first_iteration_s": times[0],
                               "sm_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), **_memory(torch, dev)})
        job_loop(step, ctl, out, should_stop=lambda: bool(stop))
    return 0


# -- the harness's side of the streams ---------------------------------------------------------------------

class _LineReader:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""

    def _lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the rest
        return [x for x in lines if x.strip()]


class StreamReader(_LineReader):
    """The service's batches, parsed as they appear; old ones dropped."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.batches: deque[tuple[float, float, list[float]]] = deque()

    def read(self) -> int:
        n = 0
        for line in self._lines():
            try:
                s, f, arr = json.loads(line)
                self.batches.append((float(s), float(f), [float(a) for a in arr]))
                n += 1
            except (ValueError, TypeError):
                continue
        return n

    def last_arrival(self) -> float | None:
        return self.batches[-1][2][-1] if self.batches and self.batches[-1][2] else None

    def window(self, start: float, end: float) -> dict[str, Any]:
        """What the service did in [start, end]: ``latencies`` of the requests that arrived in it, ``served``
        (requests of the batches that finished in it), ``busy_s`` and ``batches`` (and their ``batched``
        requests) of the batches that started in it."""
        lat: list[float] = []
        busy, nb, batched, served = 0.0, 0, 0, 0
        for s, f, arr in self.batches:
            if start <= s <= end:
                busy += f - s
                nb += 1
                batched += len(arr)
            if start <= f <= end:
                served += len(arr)
            for a in arr:
                if start <= a <= end:
                    lat.append(f - a)
        return {"latencies": lat, "served": served, "busy_s": busy, "batches": nb, "batched": batched}

    def drop_before(self, t: float) -> None:
        while self.batches and self.batches[0][1] < t:
            self.batches.popleft()


class IterationReader(_LineReader):
    """A job's iterations (start, end), parsed as they appear; old ones dropped."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.iterations: deque[tuple[float, float]] = deque()

    def read(self) -> int:
        n = 0
        for line in self._lines():
            try:
                s, e = (float(x) for x in line.split())
            except ValueError:
                continue
            self.iterations.append((s, e))
            n += 1
        return n

    def started_after(self, t: float) -> list[tuple[float, float]]:
        return [it for it in self.iterations if it[0] >= t]

    def window(self, start: float, end: float) -> list[float]:
        """The durations of the iterations that ran entirely within [start, end]."""
        return [e - s for s, e in self.iterations if s >= start and e <= end]

    def drop_before(self, t: float) -> None:
        while self.iterations and self.iterations[0][1] < t:
            self.iterations.popleft()
