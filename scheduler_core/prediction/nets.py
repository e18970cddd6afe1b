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

from scheduler_core.prediction.features import N_FEATURES, OFFLINE_SLICE, ONLINE_SLICE, SM_COLUMN
from scheduler_core.prediction.config import ARCHS  # noqa: F401 - re-exported

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


class MlpPairs:
    """The paper's MLP as a kernel over (GPU row, job row) pairs, its first layer split by owner.

    The first layer is linear, so its pre-activation for a pair is the sum of a GPU
    part (the 9 GPU columns, plus the bias) and a job part (the 7 job columns),
    each computed once per distinct row (:meth:`gpu_part`, :meth:`job_part`); a
    pair then costs its ReLU and the hidden layers (:meth:`pairs`). Every matrix
    product has a fixed shape (``chunk`` rows, the last pass padded), so a pair's
    result depends only on its own two rows: :meth:`SpeedPredictor.predict
    <scheduler_core.prediction.predictor.SpeedPredictor.predict>` goes through this same
    kernel, and a round's pairs and the predictor's answer for them are equal to
    the last bit.
    """

    def __init__(self, net: nn.Sequential, mean: np.ndarray, std: np.ndarray, chunk: int):
        linears = [m for m in net if isinstance(m, nn.Linear)]
        first = linears[0]
        w1 = first.weight.detach().to(torch.float32)
        self.w1_gpu = w1[:, torch.from_numpy(GPU_COLUMNS)].t().contiguous()
        self.w1_job = w1[:, torch.from_numpy(JOB_COLUMNS)].t().contiguous()
        self.b1 = first.bias.detach().to(torch.float32).clone()
        # (weight as in × out, bias) of each hidden layer after the first, each followed by a ReLU.
        self.hidden_layers = [(lin.weight.detach().to(torch.float32).t().contiguous(),
                               lin.bias.detach().to(torch.float32).clone()) for lin in linears[1:-1]]
        # The output layer as (outputs × hidden) @ (hidden × chunk): much faster than chunk × 2.
        self.out_w = linears[-1].weight.detach().to(torch.float32).contiguous()
        self.out_b = linears[-1].bias.detach().to(torch.float32).reshape(-1, 1).clone()
        self.hidden = int(w1.shape[0])
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.chunk = int(chunk)

    def _part(self, x: np.ndarray, cols: np.ndarray, w: torch.Tensor, bias: torch.Tensor | None) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64).reshape(-1, cols.size)
        z = ((x - self.mean[cols]) / self.std[cols]).astype(np.float32)
        out = np.empty((z.shape[0], self.hidden), dtype=np.float32)
        buf = torch.zeros((self.chunk, cols.size), dtype=torch.float32)
        res = torch.empty((self.chunk, self.hidden), dtype=torch.float32)
        with torch.no_grad():
            for start in range(0, z.shape[0], self.chunk):
                k = min(self.chunk, z.shape[0] - start)
                buf[:k] = torch.from_numpy(z[start : start + k])
                buf[k:] = 0.0
                if bias is None:
                    torch.mm(buf, w, out=res)
                else:
                    torch.addmm(bias, buf, w, out=res)
                out[start : start + k] = res[:k].numpy()
        return out

    def gpu_part(self, x_gpu: np.ndarray) -> np.ndarray:
        """(rows, hidden) float32: the first layer's GPU part and bias, per row of the GPU columns."""
        return self._part(x_gpu, GPU_COLUMNS, self.w1_gpu, self.b1)

    def job_part(self, x_job: np.ndarray) -> np.ndarray:
        """(rows, hidden) float32: the first layer's job part, per row of the 7 job columns."""
        return self._part(x_job, JOB_COLUMNS, self.w1_job, None)

    def _layers(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, out: torch.Tensor) -> None:
        """The network after the first layer's pre-activation ``x`` (one pass of ``chunk`` rows): ReLU, the
        hidden layers, then the output layer as a (2 × chunk) product (faster than a chunk × 2 one)."""
        x.relu_()
        cur, nxt = x, y
        for w, bias in self.hidden_layers:
            torch.addmm(bias, cur, w, out=nxt)
            nxt.relu_()
            cur, nxt = nxt, (z if nxt is y else y)
        torch.addmm(self.out_b, self.out_w, cur.t(), out=out)

    def _passes(self, n: int, pre_activation) -> tuple[np.ndarray, np.ndarray]:
        """Raw (tput, slowdown − 1), flat float32, of ``n`` pairs in passes of ``chunk`` rows (the last padded with
        zeros); ``pre_activation(start, k, x)`` writes the first layer's pre-activation of pairs start … start+k−1
        into ``x[:k]``."""
        out_t = np.empty(n, dtype=np.float32)
        out_s = np.empty(n, dtype=np.float32)
        c = self.chunk
        x, y, z, out = (*(torch.zeros((c, self.hidden), dtype=torch.float32) for _ in range(3)),
                        torch.empty((2, c), dtype=torch.float32))
        with torch.no_grad():
            for start in range(0, n, c):
                k = min(c, n - start)
                pre_activation(start, k, x)
                if k < c:
                    x[k:] = 0.0
                self._layers(x, y, z, out)
                o = out.numpy()
                out_t[start : start + k] = o[0, :k]
                out_s[start : start + k] = o[1, :k]
        return out_t, out_s

    def pairs(self, a: np.ndarray, b: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw (tput, slowdown − 1) as float32 of the pairs (a[rows[i]], b[cols[i]])."""
        at, bt = _tensor(a), _tensor(b)
        ri = torch.from_numpy(np.asarray(rows, dtype=np.int64).reshape(-1))
        ci = torch.from_numpy(np.asarray(cols, dtype=np.int64).reshape(-1))
        gathered = torch.empty((self.chunk, self.hidden), dtype=torch.float32)

        def gather(start: int, k: int, x: torch.Tensor) -> None:
            torch.index_select(at, 0, ri[start : start + k], out=gathered[:k])
            torch.index_select(bt, 0, ci[start : start + k], out=x[:k])
            x[:k].add_(gathered[:k])

        return self._passes(int(ri.numel()), gather)

    def grid(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw (tput, slowdown − 1), (len(a), len(b)) float32, of every pair (a[i], b[j]): :meth:`pairs` on the
        row-major grid, each pass's pre-activations added from slices of ``b`` instead of gathered."""
        r, k_cols = a.shape[0], b.shape[0]
        if k_cols < 256:  # short rows: a pass spans many of them; gather instead
            rows, cols = np.divmod(np.arange(r * k_cols, dtype=np.int64), k_cols)
            t, s_ = self.pairs(a, b, rows, cols)
            return t.reshape(r, k_cols), s_.reshape(r, k_cols)
        at, bt = _tensor(a), _tensor(b)

        def slices(start: int, k: int, x: torch.Tensor) -> None:
            pos = start
            while pos < start + k:  # one slice of b per grid row the pass touches
                i, j = divmod(pos, k_cols)
                length = min(k_cols - j, start + k - pos)
                torch.add(bt[j : j + length], at[i], out=x[pos - start : pos - start + length])
                pos += length

        t, s_ = self._passes(r * k_cols, slices)
        return t.reshape(r, k_cols), s_.reshape(r, k_cols)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
