"""The speed predictor's networks: the paper's MLP and a factorized one that scales to a pair per job.

``mlp`` (paper §5, Figure 12): 4 linear layers × 64 over the 16 pair features.
A round that profiles every job separately has to evaluate it on every
(GPU, job) pair — 672 M rows at 20,000 GPUs × 10,000 jobs (docs/BENCHMARKS.md).

``factorized``: the same 16 features split by who owns them. The *GPU side*
(the 8 online features and the offline SM share, which the GPU's dynamic share
sets) and the *job side* (the 7 offline features) each go through their own
tower (the MLP's depth and width); the towers meet in two dot products::

    tput      = a_t · b_t + a_t0 + b_t0          (clipped to [0, 1])
    slowdown  = 1 + max(0, a_s · b_s + a_s0 + b_s0)

So a round embeds each distinct GPU row and each profile once, and every pair
costs one entry of a matrix product (``pair_tables``): a rank-``embed_dim``
interaction instead of three 64×64 layers. Held-out error equals the MLP's
(docs/BENCHMARKS.md, ``bench predictor``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from scheduler_core.features import N_FEATURES, OFFLINE_SLICE, ONLINE_SLICE, SM_COLUMN

ARCHS = ("mlp", "factorized")
# Columns of the 16 features each tower sees: the GPU's (online + its offline share) and the job's.
GPU_COLUMNS = np.r_[np.arange(ONLINE_SLICE.start, ONLINE_SLICE.stop), SM_COLUMN]
JOB_COLUMNS = np.arange(OFFLINE_SLICE.start, OFFLINE_SLICE.stop)


def _stack(n_in: int, hidden: int, layers: int, n_out: int) -> nn.Sequential:
    if layers < 2:
        raise ValueError("an MLP needs at least 2 layers")
    if hidden < 1:
        raise ValueError("hidden size must be >= 1")
    mods: list[nn.Module] = [nn.Linear(n_in, hidden), nn.ReLU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, n_out))
    return nn.Sequential(*mods)


def mlp(hidden: int, layers: int) -> nn.Sequential:
    """The paper's predictor: 16 features → ``layers`` linear layers → (tput, slowdown − 1)."""
    return _stack(N_FEATURES, hidden, layers, 2)


class FactorizedNet(nn.Module):
    """GPU tower and job tower, each ``layers`` linear layers of ``hidden``, meeting in two dot products."""

    def __init__(self, hidden: int, layers: int, embed_dim: int):
        super().__init__()
        if embed_dim < 1:
            raise ValueError("embed_dim must be >= 1")
        self.embed_dim = embed_dim
        self.gpu = _stack(GPU_COLUMNS.size, hidden, layers, 2 * embed_dim + 2)
        self.job = _stack(JOB_COLUMNS.size, hidden, layers, 2 * embed_dim + 2)
        self._gpu_cols = torch.from_numpy(GPU_COLUMNS)
        self._job_cols = torch.from_numpy(JOB_COLUMNS)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        a = self.gpu(z[:, self._gpu_cols])
        b = self.job(z[:, self._job_cols])
        d = self.embed_dim
        t = (a[:, :d] * b[:, :d]).sum(1) + a[:, 2 * d] + b[:, 2 * d]
        s = (a[:, d : 2 * d] * b[:, d : 2 * d]).sum(1) + a[:, 2 * d + 1] + b[:, 2 * d + 1]
        return torch.stack([t, s], 1)


def gpu_sides(a: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """GPU embeddings as the left factors of the two outputs: [a_t, a_t0, 1] and [a_s, a_s0, 1] (float64)."""
    ones = np.ones((a.shape[0], 1))
    return (np.hstack([a[:, :d], a[:, 2 * d : 2 * d + 1], ones]),
            np.hstack([a[:, d : 2 * d], a[:, 2 * d + 1 : 2 * d + 2], ones]))


def job_sides(b: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Job embeddings as the right factors: [b_t, 1, b_t0] and [b_s, 1, b_s0], so each output is one dot product."""
    ones = np.ones((b.shape[0], 1))
    return (np.hstack([b[:, :d], ones, b[:, 2 * d : 2 * d + 1]]),
            np.hstack([b[:, d : 2 * d], ones, b[:, 2 * d + 1 : 2 * d + 2]]))


def combine_rows(a: np.ndarray, b: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw (tput, slowdown − 1) of aligned rows of GPU embeddings ``a`` and job embeddings ``b`` (float64)."""
    (at, as_), (bt, bs) = gpu_sides(a, d), job_sides(b, d)
    return np.einsum("ij,ij->i", at, bt), np.einsum("ij,ij->i", as_, bs)


def combine_tables(a: np.ndarray, b: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw (tput, slowdown − 1) of every (GPU row, job row): two matrix products, (len(a), len(b)) each.

    Equal to :func:`combine_rows` on each pair up to the order of a 34-term sum
    (a few ulps of float64).
    """
    (at, as_), (bt, bs) = gpu_sides(a, d), job_sides(b, d)
    return at @ bt.T, as_ @ bs.T


def finish(raw_t: np.ndarray, raw_s: np.ndarray, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """The outputs' ranges — normalized throughput in [0, 1], slowdown factor ≥ 1 — at float32 precision.

    Float32 like the MLP's outputs: the matrix product and the row-wise sum of
    :func:`combine_tables` / :func:`combine_rows` differ by a few float64 ulps,
    which rounding to float32 removes (short of a tie at a float32 boundary),
    so a round's tables and the predictor's ``predict`` give the same numbers.
    """
    np.clip(raw_t, 0.0, 1.0, out=raw_t)
    np.maximum(raw_s, 0.0, out=raw_s)
    raw_s += 1.0
    return raw_t.astype(np.float32).astype(dtype, copy=False), raw_s.astype(np.float32).astype(dtype, copy=False)


def finish_into(raw_t: np.ndarray, raw_s: np.ndarray, t32: np.ndarray, s32: np.ndarray) -> None:
    """:func:`finish` in place on float64 buffers, the results cast into float32 buffers of the same shape."""
    np.clip(raw_t, 0.0, 1.0, out=raw_t)
    np.maximum(raw_s, 0.0, out=raw_s)
    raw_s += 1.0
    np.copyto(t32, raw_t, casting="same_kind")
    np.copyto(s32, raw_s, casting="same_kind")
