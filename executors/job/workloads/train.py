"""An offline training job of a reference family, on the checkpoint/restart runtime helper.

    python -m executors.job.workloads.train --family transformer --size tiny --ckpt DIR --steps 500 [--out RESULT.json]

Checkpoints every ``--every`` steps and on SIGUSR1/SIGTERM (finish the iteration,
save, exit 0 for requeue), resumes from the newest valid checkpoint, and honours
profiling mode from the environment (``MUXFLOW_PROFILE_ITERS`` /
``MUXFLOW_PROFILE_SECONDS``: a dry run that reports mean/p50/p95 iteration time).
Batches cycle through a seeded pool by step, so a resumed run sees the batches an
uninterrupted one sees. Writes ``RESULT.json`` (``{"step", "loss"}``) when all
steps are done. Usable as a Slurm job script (``sbatch -p offline --gres=mps:N``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch

from executors.job.runtime import Runtime, restore_training
from executors.job.runtime.timing import write_json_atomic
from executors.job.workloads.device import describe, resolve_device, set_threads, synchronize
from executors.job.workloads.models import JOB_FAMILIES, SIZES, batch_pool, build_model, loss_fn, workload_size

log = logging.getLogger(__name__)
POOL = 4  # distinct batches cycled through (data generation never dominates an iteration)


def train(family: str, size: str, ckpt: str, steps: int, *, seed: int = 0, every: int = 50, device: str = "auto",
          threads: int | None = 1, lr: float = 0.01, out: str | None = None, runtime: Runtime | None = None) -> dict:
    w = workload_size(family, size)
    if steps < 1:
        raise ValueError("steps: must be >= 1")
    dev = resolve_device(device)
    set_threads(dev, threads)
    torch.manual_seed(seed)
    model = build_model(w).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    rt = runtime or Runtime(os.environ.get("MUXFLOW_CHECKPOINT_DIR") or ckpt, every_steps=every)
    step, state = rt.resume()
    try:
        loss_v = restore_training(state, model, opt)
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:  # another model's checkpoint (or not a training one)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"checkpoint at step {step} is not a {family}/{size} training state ({first}); "
                         "resume it with the model that wrote it, or start in an empty directory") from None
    pool = batch_pool(w, w.train_batch, POOL, seed + 1, dev)
    log.info("%s/%s on %s from step %d%s", family, size, describe(dev), step, " (profiling)" if rt.profiling else "")
    while step < steps:
        with rt.iteration():
            inputs, y = pool[step % POOL]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(w, model(*inputs), y)
            loss.backward()
            opt.step()
            synchronize(dev)
        loss_v = float(loss.detach())
        step += 1
        rt.step_done(step, lambda: {"model": model.state_dict(), "opt": opt.state_dict(), "loss": loss_v})
    if rt.profiling:  # ran out of steps before the profiling limit
        rt.finish_profile()
        return {"step": step, "loss": loss_v}
    result = {"step": step, "loss": loss_v}
    if out:
        write_json_atomic(out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executors.job.workloads.train", description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=JOB_FAMILIES, required=True,
                    help="cnn is ResNet-18, resnet50 ResNet-50 (docs/WORKLOADS.md)")
    ap.add_argument("--size", choices=SIZES, default="tiny")
    ap.add_argument("--ckpt", required=True, help="checkpoint directory ($MUXFLOW_CHECKPOINT_DIR wins)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=50, help="checkpoint interval in steps")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--out", help="write {step, loss} here when all steps are done")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        res = train(a.family, a.size, a.ckpt, a.steps, seed=a.seed, every=a.every, device=a.device,
                    threads=a.threads, lr=a.lr, out=a.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"done: step {res['step']} loss {res['loss']:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
