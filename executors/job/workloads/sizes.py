"""Parameters and FLOPs of every reference workload size: the table in docs/WORKLOADS.md.

    python -m executors.job.workloads.sizes

FLOPs are what ``torch.utils.flop_counter.FlopCounterMode`` counts (two per multiply-add) on the
meta device, where no arithmetic runs and attention takes the path that shows its matrix
products: convolutions, matrix products (attention's included) and their gradients. Elementwise
operations, normalisation, pooling, the loss and embedding-bag lookups are not counted. A
training step is the forward and backward pass at the size's training batch (the optimizer's
update is not counted); a request is one forward pass of one sample in eval mode, as ``serve``
handles it without batching, for the families that are online services.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from executors.job.workloads.models import (
    JOB_FAMILIES,
    SERVICE_FAMILIES,
    SIZES,
    CnnSize,
    RecommenderSize,
    TransformerSize,
    WorkloadSize,
    batch_pool,
    build_model,
    loss_fn,
    parameter_count,
    workload_size,
)

META = torch.device("meta")


@dataclass(frozen=True)
class SizeFigures:
    family: str
    size: str
    architecture: str
    job_type: str
    train_batch: int
    parameters: int
    train_flops: int                # forward + backward of one training step
    request_flops: int | None       # forward of one request (None: not an online service family)


def architecture(w: WorkloadSize) -> str:
    a = w.arch
    if isinstance(a, CnnSize):
        name = {("basic", (2, 2, 2, 2)): "ResNet-18", ("bottleneck", (3, 4, 6, 3)): "ResNet-50"}.get(
            (a.block, a.blocks), "ResNet")
        block = "BasicBlock" if a.block == "basic" else "Bottleneck"
        scaled = "" if a.width == 64 and a.image == 224 and a.classes == 1000 else ", scaled"
        return (f"{name}{scaled}: {block} [{','.join(map(str, a.blocks))}], width {a.width}, "
                f"{a.image}×{a.image} images, {a.classes:,} classes")
    if isinstance(a, TransformerSize):
        return (f"pre-norm encoder: {a.layers} layers, d {a.d_model}, {a.heads} heads, ff {a.ff}, "
                f"vocab {a.vocab:,}, sequence {a.seq}, {a.classes} classes")
    assert isinstance(a, RecommenderSize)
    return (f"DLRM-style: {a.tables} tables × {a.rows:,} rows × {a.dim}, {a.lookups} lookups each; "
            f"{a.dense} dense → {'→'.join(map(str, a.bottom))}; top {'→'.join(map(str, a.top))}")


def _flops(run) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return int(counter.get_total_flops())


def figures(family: str, size: str) -> SizeFigures:
    w = workload_size(family, size)
    with torch.device(META):
        model = build_model(w)
    (inputs, y), = batch_pool(w, w.train_batch, 1, 0, META)
    model.train()
    train = _flops(lambda: loss_fn(w, model(*inputs), y).backward())
    request = None
    if family in SERVICE_FAMILIES:
        model.eval()
        (one, _), = batch_pool(w, 1, 1, 0, META)
        # with autograd on: torch's fused inference path of the encoder would hide its matrix products
        request = _flops(lambda: model(*one))
    return SizeFigures(family, size, architecture(w), w.job_type, w.train_batch, parameter_count(model), train,
                       request)


def all_figures() -> list[SizeFigures]:
    return [figures(f, s) for f in JOB_FAMILIES for s in SIZES]


def flops_text(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} FLOP"


HEADER = ("| family | size | architecture | job type | training batch | parameters | training FLOPs / step "
          "| inference FLOPs / request |")


def table(rows: list[SizeFigures] | None = None) -> str:
    lines = [HEADER, "|---|---|---|---|---|---|---|---|"]
    for r in rows if rows is not None else all_figures():
        lines.append(f"| `{r.family}` | `{r.size}` | {r.architecture} | {r.job_type} | {r.train_batch} | "
                     f"{r.parameters:,} | {flops_text(r.train_flops)} | {flops_text(r.request_flops)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        print(f"error: no arguments expected, got {' '.join(args)}", file=sys.stderr)
        return 2
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
