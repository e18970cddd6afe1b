"""A small deterministic CPU PyTorch training job that uses the runtime helper.

    python -m executors.job.runtime.example_train --ckpt DIR --steps 300 --out RESULT.json [--seed 0]

Each step's batch is drawn from a generator seeded by (seed, step), so a run
resumed from a checkpoint sees exactly the batches an uninterrupted run sees;
model and optimizer state are checkpointed. It writes ``RESULT.json``
(``{"step", "loss"}``) when all steps are done, and ``DIR/progress`` (the last
finished step) as it goes. ``--iter-ms`` makes each iteration take at least
that long (a stand-in for real work, so that it can be signalled mid-run).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from executors.job.runtime import Runtime, restore_training


def batch(seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(32, 16, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    return x, y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--iter-ms", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rt = Runtime(a.ckpt, every_steps=a.every)
    step, state = rt.resume()
    loss_v = restore_training(state, model, opt)
    Path(a.ckpt).mkdir(parents=True, exist_ok=True)
    progress = Path(a.ckpt) / "progress"
    while step < a.steps:
        t0 = time.monotonic()
        x, y = batch(a.seed, step)
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        opt.step()
        loss_v = float(loss.item())
        step += 1
        rest = a.iter_ms / 1000 - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)  # simulated work, not synchronisation
        tmp = progress.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(str(step))
        os.replace(tmp, progress)
        rt.step_done(step, lambda: {"model": model.state_dict(), "opt": opt.state_dict(), "loss": loss_v})
    out = Path(a.out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "loss": loss_v}))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
