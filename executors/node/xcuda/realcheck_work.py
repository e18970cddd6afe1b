"""The GPU workloads of xCUDA's real-driver check, one per fresh process::

    python -m executors.node.xcuda.realcheck_work launches --seconds 3
    python -m executors.node.xcuda.realcheck_work train --seconds 15 --batch 64
    python -m executors.node.xcuda.realcheck_work quota --quota-bytes 2147483648 [--driver-pool]
    python -m executors.node.xcuda.realcheck_work graphs --replays 200
    python -m executors.node.xcuda.realcheck_work checkpoint --ckpt DIR --batch 64

:mod:`executors.node.xcuda.realcheck` starts them, under ``LD_PRELOAD=libxcuda.so`` or not. Each prints JSON
lines on stdout: ``{"ev": "ready", ...}`` once CUDA is up, ``{"ev": "start", "t": ...}`` and ``{"ev": "step",
"n": ..., "t": ...}`` per training step (``t``: ``time.monotonic()``, the CLOCK_MONOTONIC the parent stamps
with), ``{"ev": "done", ...}`` with the result, or ``{"ev": "error", "error": ...}`` and exit status 1.
Needs torch with CUDA; the CPU half of the check (``--simulate``) never runs this module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

GIB = 2**30


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def preloaded() -> bool:
    """Whether libxcuda.so is mapped into this process (LD_PRELOAD took effect)."""
    try:
        return "libxcuda.so" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def own_stats() -> dict | None:
    """This process's xCUDA counters as it last published them (XCUDA_STATS_DIR), or None."""
    d = os.environ.get("XCUDA_STATS_DIR")
    if not d:
        return None
    from executors.node.xcuda.stats import StatsRefused, decode

    path = Path(d) / f"xcuda-{os.getpid()}.stats"
    for _ in range(4):  # a copy caught mid-update is read again
        try:
            return asdict(decode(path.read_bytes()))
        except FileNotFoundError:
            return None
        except StatsRefused:
            continue
    return None


def fresh_stats(period_s: float = 0.02) -> dict | None:
    """The counters after the controller thread published them at least once more (two periods)."""
    time.sleep(3 * period_s)
    return own_stats()


def _ready(torch: Any, **extra: Any) -> None:
    emit(ev="ready", t=time.monotonic(), preloaded=preloaded(), torch=torch.__version__,
         device=torch.cuda.get_device_name(0), **extra)


# -- 1: launches/s of a tight loop ----------------------------------------------------------------

def launches(seconds: float) -> dict:
    import torch

    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    _ready(torch)
    n = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while True:
        x.add_(1)
        n += 1
        if n % 8 == 0 and time.monotonic() >= end:
            break
    torch.cuda.synchronize()
    elapsed = time.monotonic() - t0
    value = int(x.item())
    return {"launches": n, "seconds": round(elapsed, 4), "launches_per_s": round(n / elapsed, 2),
            "result_correct": value == n, "stats": fresh_stats()}


# -- 2, 3: a training loop ------------------------------------------------------------------------

def _model(torch: Any, batch: int) -> tuple[Any, str, Any, Any]:
    """ResNet-18 (torchvision's, else the project's reference CNN) and a pool of synthetic batches on the GPU."""
    dev = torch.device("cuda")
    try:
        import torchvision

        model = torchvision.models.resnet18(num_classes=1000)
        name = f"torchvision {torchvision.__version__} resnet18"
        g = torch.Generator().manual_seed(0)
        pool = [((torch.randn(batch, 3, 224, 224, generator=g).to(dev),),
                 torch.randint(0, 1000, (batch,), generator=g).to(dev)) for _ in range(4)]
        loss = torch.nn.functional.cross_entropy
    except ImportError:
        from executors.job.workloads.models import batch_pool, build_model, loss_fn, workload_size

        w = workload_size("cnn", "gpu")
        model = build_model(w)
        name = f"executors.job.workloads cnn/gpu ({w.job_type})"
        pool = batch_pool(w, batch, 4, 0, dev)

        def loss(out: Any, y: Any) -> Any:
            return loss_fn(w, out, y)
    return model.to(dev), name, pool, loss


def train(seconds: float, batch: int) -> dict:
    import torch

    model, name, pool, loss = _model(torch, batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    torch.cuda.synchronize()
    _ready(torch, model=name, batch=batch)
    t0 = time.monotonic()
    emit(ev="start", t=t0)
    n = 0
    while True:
        xs, y = pool[n % len(pool)]
        out = model(*xs)
        lv = loss(out, y)
        opt.zero_grad(set_to_none=True)
        lv.backward()
        opt.step()
        torch.cuda.synchronize()
        n += 1
        t = time.monotonic()
        emit(ev="step", n=n, t=t)
        if t - t0 >= seconds:
            break
    return {"model": name, "batch": batch, "steps": n, "seconds": round(t - t0, 4),
            "steps_per_s": round(n / (t - t0), 3), "loss_finite": bool(torch.isfinite(lv).item()),
            "stats": fresh_stats()}


def checkpoint(ckpt: str, batch: int) -> dict:
    """The training loop on muxflow's job runtime, until a signal: SIGTERM/SIGUSR1 let the step in progress
    finish, save a checkpoint of the model and optimizer (their GPU tensors copied to the host) and exit 0, as a
    job does when Slurm requeues it. Never returns otherwise."""
    import torch

    from executors.job.runtime import Runtime

    rt = Runtime(ckpt, every_steps=10**9, profiling=None)
    model, name, pool, loss = _model(torch, batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    torch.cuda.synchronize()
    _ready(torch, model=name, batch=batch)
    n = 0
    while True:
        with rt.iteration():
            xs, y = pool[n % len(pool)]
            lv = loss(model(*xs), y)
            opt.zero_grad(set_to_none=True)
            lv.backward()
            opt.step()
            torch.cuda.synchronize()
        n += 1
        emit(ev="step", n=n, t=time.monotonic())
        rt.step_done(n, lambda: {"model": model.state_dict(), "opt": opt.state_dict(), "loss": float(lv.detach())})


# -- 4: the memory quota --------------------------------------------------------------------------

def _attempt(torch: Any, what: str, nbytes: int) -> tuple[Any, dict]:
    try:
        t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        return t, {"what": what, "bytes": nbytes, "ok": True}
    except getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError) as exc:
        return None, {"what": what, "bytes": nbytes, "ok": False, "oom": True, "error": str(exc).splitlines()[0][:300]}
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        return None, {"what": what, "bytes": nbytes, "ok": False, "oom": "out of memory" in msg.lower(), "error": msg}


def _driver_pool(quota_bytes: int) -> dict:
    """The same three steps with cuMemAllocFromPoolAsync on the device's default pool, through the driver's
    exported entry point (dlsym: xCUDA's wrapper)."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    pool = ctypes.c_void_p()
    r = cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), ctypes.c_int(0))
    if r != 0:
        return {"error": f"cuDeviceGetDefaultMemPool returned {r}"}
    stream = ctypes.c_void_p(0)
    steps, live = [], []

    def alloc(what: str, nbytes: int) -> None:
        p = ctypes.c_uint64(0)
        rc = cu.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(nbytes), pool, stream)
        cu.cuStreamSynchronize(stream)
        steps.append({"what": what, "bytes": nbytes, "ok": rc == 0, "rc": rc, "oom": rc == 2})
        if rc == 0:
            live.append(p.value)

    alloc("1 GiB", GIB)
    alloc("+1.5 GiB", 3 * GIB // 2)
    for p in live:
        cu.cuMemFreeAsync(ctypes.c_uint64(p), stream)
    cu.cuStreamSynchronize(stream)
    live.clear()
    alloc("1.8 GiB after freeing", int(1.8 * GIB))
    for p in live:
        cu.cuMemFreeAsync(ctypes.c_uint64(p), stream)
    cu.cuStreamSynchronize(stream)
    return {"entry_point": "cuMemAllocFromPoolAsync", "steps": steps}


def quota(quota_bytes: int, driver_pool: bool) -> dict:
    import torch

    torch.cuda.init()
    free0, total0 = torch.cuda.mem_get_info()
    _ready(torch, allocator=torch.cuda.get_allocator_backend(),
           alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    steps = []
    a, s = _attempt(torch, "1 GiB", GIB)
    steps.append(s)
    b, s = _attempt(torch, "+1.5 GiB", 3 * GIB // 2)
    steps.append(s)
    del a, b
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    c, s = _attempt(torch, "1.8 GiB after freeing", int(1.8 * GIB))
    steps.append(s)
    free1, total1 = torch.cuda.mem_get_info()
    del c
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    out = {"allocator": torch.cuda.get_allocator_backend(), "steps": steps,
           "mem_get_info_before": {"free": free0, "total": total0},
           "mem_get_info_holding_1_8": {"free": free1, "total": total1},
           "quota_bytes": quota_bytes, "stats": fresh_stats()}
    if driver_pool:
        try:
            out["driver_pool"] = _driver_pool(quota_bytes)
        except Exception as exc:  # ctypes or driver trouble: the torch part above still stands
            out["driver_pool"] = {"error": f"{type(exc).__name__}: {exc}"}
        out["driver_pool"]["stats"] = fresh_stats()
    return out


# -- 5: CUDA graphs -------------------------------------------------------------------------------

def graphs(replays: int) -> dict:
    import torch

    torch.manual_seed(0)
    dev = torch.device("cuda")
    w = torch.randn(256, 256, device=dev) / 16.0
    static_x = torch.randn(64, 256, device=dev)

    def f(x: Any) -> Any:
        return torch.tanh(x @ w) * 0.5 + torch.sin(x)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            f(static_x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = f(static_x)
    torch.cuda.synchronize()
    _ready(torch)
    max_err = 0.0
    checked = min(replays, 50)
    for _ in range(checked):
        inp = torch.randn(64, 256, device=dev)
        static_x.copy_(inp)
        g.replay()
        max_err = max(max_err, float((static_y - f(inp)).abs().max().item()))
    torch.cuda.synchronize()
    # Replays alone: each cuGraphLaunch is one token at the gate, whatever the graph holds.
    before = fresh_stats()
    t0 = time.monotonic()
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    elapsed = time.monotonic() - t0
    after = fresh_stats()
    tokens = None if before is None or after is None else after["launches"] - before["launches"]
    return {"checked_replays": checked, "max_abs_error": max_err, "result_correct": max_err <= 1e-3,
            "timed_replays": replays, "seconds": round(elapsed, 4), "replays_per_s": round(replays / elapsed, 1),
            "gate_tokens": tokens, "stats": after}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executors.node.xcuda.realcheck_work")
    sub = ap.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("launches")
    p.add_argument("--seconds", type=float, default=3.0)
    p = sub.add_parser("train")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--batch", type=int, default=64)
    p = sub.add_parser("quota")
    p.add_argument("--quota-bytes", type=int, default=2 * GIB)
    p.add_argument("--driver-pool", action="store_true")
    p = sub.add_parser("graphs")
    p.add_argument("--replays", type=int, default=200)
    p = sub.add_parser("checkpoint")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--batch", type=int, default=64)
    a = ap.parse_args(argv)
    try:
        if a.kind == "launches":
            out = launches(a.seconds)
        elif a.kind == "train":
            out = train(a.seconds, a.batch)
        elif a.kind == "quota":
            out = quota(a.quota_bytes, a.driver_pool)
        elif a.kind == "checkpoint":
            out = checkpoint(a.ckpt, a.batch)
        else:
            out = graphs(a.replays)
    except Exception as exc:
        emit(ev="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
        return 1
    emit(ev="done", preloaded=preloaded(), **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
