"""The two processes of the protection experiment (``executors.node.profiling.protection``), as it starts them.

- ``serve``: the online reference service (:func:`executors.job.workloads.serve.serve`, open-loop arrivals at
  ``--qps``, dynamic batching up to ``--max-batch``) until SIGTERM, writing every served request to ``--stream``
  as it is served: one line ``<arrival, unix s> <latency, s>`` per request, flushed per batch, so the experiment
  reads any window while the service runs on. ``--ready`` is written once the model is warm and arrivals begin.
- ``job``: the offline reference job (:func:`executors.job.workloads.train.train`, on the checkpoint/restart
  runtime in profiling mode: a dry run that neither reads nor writes checkpoints and stops cleanly on SIGTERM).
  It is held at two gates so that starting a process costs no co-located time: after its imports (``--imported``
  written) it waits for the first SIGUSR2 before touching the GPU; then it creates its CUDA context — the moment
  an MPS client takes its share, priority and partition — builds the model, runs ``--warmup`` iterations, writes
  ``--ready`` and waits for the second SIGUSR2. From then on it trains until SIGTERM, appending each iteration's
  end (unix s) to ``--iterations``.

SIGUSR2 is blocked before anything else runs (the command line the experiment uses starts with that), so a gate
signal is never lost nor fatal; the experiment sends the first only once ``--imported`` exists, the second only
once ``--ready`` exists. The environment is the experiment's: MPS pipe, share, priority, partition, xCUDA preload.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

# The command line the experiment starts a child with: SIGUSR2 blocked in the main thread before any import, so
# every thread started later (torch's, xCUDA's) inherits the mask and the gates' signals wait for ``sigwait``.
BOOT = ("import signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2}); "
        "from executors.node.profiling.protection_child import main; raise SystemExit(main(sys.argv[1:]))")
GATE = signal.SIGUSR2


def _mark(path: str, **fields: object) -> None:
    from executors.job.runtime.timing import write_json_atomic

    write_json_atomic(path, {"unix": time.time(), **fields})


def _gate(stop=lambda: False) -> None:
    """Wait for the gate's signal (or, at the second gate, for the runtime's stop request: SIGTERM)."""
    while not stop():
        if signal.sigtimedwait({GATE}, 0.1) is not None:
            return


class _Stream:
    """Receives every served batch (``run_open_loop``'s ``on_batch``) and appends its requests to a file."""

    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1 << 16)  # noqa: SIM115 (closed by close())
        self.wall0: float | None = None
        self.perf0 = 0.0

    def started(self) -> None:
        # the open loop's offsets count from (within microseconds of) this moment
        self.wall0, self.perf0 = time.time(), time.perf_counter()

    def on_batch(self, arrivals: list[float], start: float, finish: float) -> None:
        w = self.wall0 if self.wall0 is not None else time.time()
        self.f.write("".join(f"{w + a:.6f} {finish - a:.6f}\n" for a in arrivals))
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _serve(a: argparse.Namespace) -> int:
    from executors.job.workloads.endpoint import TargetQps
    from executors.job.workloads.serve import serve

    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _f: stop.append(signum))
    stream = _Stream(a.stream)

    def ready() -> None:
        stream.started()
        _mark(a.ready, pid=os.getpid())

    try:
        rep = serve(a.family, a.size, TargetQps(a.qps), None, seed=a.seed, device=a.device, max_batch=a.max_batch,
                    threads=1, should_stop=lambda: bool(stop), on_ready=ready, metrics=stream)
    finally:
        stream.close()
    if a.report:
        from executors.job.runtime.timing import write_json_atomic

        write_json_atomic(a.report, rep)
    return 0


def _job(a: argparse.Namespace) -> int:
    from executors.job.runtime import Runtime
    from executors.job.runtime.profiling import ProfilingMode
    from executors.job.workloads.train import train

    class GatedRuntime(Runtime):
        """The runtime helper, held before the first measured iteration and reporting each iteration's end."""

        def __init__(self) -> None:
            super().__init__(str(Path(a.iterations).parent / f"ckpt-{os.getpid()}"), every_steps=10**9,
                             profiling=ProfilingMode(max_seconds=a.max_seconds, warmup_iterations=0))
            self.out = open(a.iterations, "a", buffering=1 << 12)  # noqa: SIM115 (lives as long as the process)

        def step_done(self, step: int, state) -> None:
            if step > a.warmup:
                self.out.write(f"{time.time():.6f}\n")
                self.out.flush()
            elif step == a.warmup:
                _mark(a.ready, pid=os.getpid())
                _gate(lambda: self.stop_requested is not None)  # go: the co-located window starts
            super().step_done(step, state)

    _mark(a.imported, pid=os.getpid())
    _gate()  # init: the CUDA context, the model, the warm-up iterations
    train(a.family, a.size, str(Path(a.iterations).parent), 10**9, seed=a.seed, every=10**9, device=a.device,
          threads=1, runtime=GatedRuntime())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="protection child", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--family", required=True)
    s.add_argument("--size", required=True)
    s.add_argument("--qps", type=float, required=True)
    s.add_argument("--max-batch", type=int, default=1)
    s.add_argument("--device", default="auto")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--stream", required=True)
    s.add_argument("--ready", required=True)
    s.add_argument("--report")
    j = sub.add_parser("job")
    j.add_argument("--family", required=True)
    j.add_argument("--size", required=True)
    j.add_argument("--device", default="auto")
    j.add_argument("--seed", type=int, default=0)
    j.add_argument("--warmup", type=int, default=2)
    j.add_argument("--max-seconds", type=float, default=3600.0)
    j.add_argument("--imported", required=True)
    j.add_argument("--ready", required=True)
    j.add_argument("--iterations", required=True)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"%(levelname)s {a.kind}: %(message)s")
    return _serve(a) if a.kind == "serve" else _job(a)


if __name__ == "__main__":
    sys.exit(main())
