"""Speed predictor: one model per GPU type (paper §5–6, Figure 12).

Inputs are the 16 pair features of :mod:`scheduler_core.prediction.features`; outputs are
the offline job's normalized throughput and the online service's latency
slowdown factor. Two networks (:mod:`scheduler_core.prediction.nets`): the
paper's MLP (4 linear layers, hidden 64×64, momentum SGD; ``arch="mlp"``, the
default) and a ``factorized`` one — a GPU tower and a job tower of the same depth
and width meeting in dot products, trained with Adam — whose pairs cost one
entry of a matrix product, so a round can evaluate every (GPU, job) pair even
when every job has its own profile. The factorized net is opt-in: its job tower
sees only the job profiles it was trained on (a dozen job types in a sampling
run) and extrapolates poorly to a new job's profile, where the MLP, which sees
every feature together, does not (docs/BENCHMARKS.md, "Predictor"). The saved model carries its architecture,
input normalization and the range of its training data; training is
reproducible from its seed.

A model refuses input it cannot vouch for: NaN or infinite values, values no
GPU can report (:data:`~scheduler_core.prediction.features.PHYSICAL_BOUNDS`), and values
far outside its training data (the training range widened by
``range_margin_frac`` of its width on each side).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from scheduler_core.prediction.features import FEATURE_NAMES, N_FEATURES, PHYSICAL_BOUNDS, FeatureError, describe_bad_rows
from scheduler_core.prediction.config import PredictorConfig
from scheduler_core.prediction.nets import (
    GPU_COLUMNS,
    JOB_COLUMNS,
    FactorizedNet,
    MlpPairs,
    combine_rows,
    combine_tables,
    finish,
    mlp,
)

# 3: the architecture is saved with the model (blobs without one are MLPs).
BLOB_FORMAT = 3
# Rows per forward pass. Every pass has exactly this shape (the last one is
# padded): BLAS kernels are chosen by matrix shape, and a row's result may
# differ in the last bit between shapes. With one shape, a row's prediction
# depends only on the row, so predicting de-duplicated rows (the round) and
# every pair (the dense reference) give identical numbers.
PREDICT_CHUNK_ROWS = 8192
# Normalized throughput below this counts as this in MAPE (a job at 1 % of its
# solo speed would otherwise dominate the mean).
MAPE_FLOOR = 0.05

_PHYS_LO = np.array([PHYSICAL_BOUNDS[n][0] for n in FEATURE_NAMES])
_PHYS_HI = np.array([PHYSICAL_BOUNDS[n][1] for n in FEATURE_NAMES])


@contextlib.contextmanager
def one_torch_thread():
    """Train with one intra-op thread: batches of 64 gain nothing from a second thread and lose a lot when
    the machine is shared (spinning OpenMP workers); the previous setting is restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _mlp(cfg: PredictorConfig) -> nn.Module:
    """The network of ``cfg.arch`` (the name predates the factorized one)."""
    if cfg.arch == "mlp":
        return mlp(cfg.hidden, cfg.layers)
    return FactorizedNet(cfg.hidden, cfg.layers, cfg.embed_dim)


def _optimizer(cfg: PredictorConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer_name == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate, momentum=cfg.momentum)
    return torch.optim.Adam(params, lr=cfg.learning_rate)


def _fixed_shape(net: nn.Module, z: np.ndarray, n_out: int) -> np.ndarray:
    """``net`` over the rows of ``z`` in passes of exactly PREDICT_CHUNK_ROWS rows (the last one padded)."""
    rows = PREDICT_CHUNK_ROWS
    out = np.empty((z.shape[0], n_out), dtype=np.float32)
    buf = np.zeros((rows, z.shape[1]), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, z.shape[0], rows):
            k = min(rows, z.shape[0] - start)
            buf[:k] = z[start : start + k]
            buf[k:] = 0.0
            out[start : start + k] = net(torch.from_numpy(buf)).numpy()[:k]
    return out


@dataclass(frozen=True)
class TrainingReport:
    n_train: int
    n_holdout: int
    holdout_mae_tput: float
    holdout_mae_slowdown: float
    train_mae_tput: float
    feature_ranges: dict[str, list[float]]
    holdout_mape_tput: float = float("nan")
    holdout_mape_slowdown: float = float("nan")
    # (epoch, held-out MAE of normalized throughput) when cfg.eval_every > 0.
    curve: tuple[tuple[int, float], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class PredictionErrors:
    mae_tput: float
    mape_tput: float
    mae_slowdown: float
    mape_slowdown: float


class SpeedPredictor:
    """A trained network with its input normalization and accepted input range."""

    def __init__(
        self,
        cfg: PredictorConfig,
        net: nn.Module,
        mean: np.ndarray,
        std: np.ndarray,
        train_min: np.ndarray | None = None,
        train_max: np.ndarray | None = None,
    ):
        self.cfg = cfg
        self.net = net.eval()
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.train_min = None if train_min is None else np.asarray(train_min, dtype=np.float64)
        self.train_max = None if train_max is None else np.asarray(train_max, dtype=np.float64)
        self.accept_lo, self.accept_hi = self._accepted_range()

    def _accepted_range(self) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = _PHYS_LO.copy(), _PHYS_HI.copy()
        if self.train_min is not None and self.train_max is not None:
            margin = self.cfg.range_margin_frac * (self.train_max - self.train_min)
            lo = np.maximum(lo, self.train_min - margin)
            hi = np.minimum(hi, self.train_max + margin)
        return lo, hi

    def accepts(self, x: np.ndarray) -> np.ndarray:
        """Per row: True when every feature is finite and inside the accepted range."""
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(x) & (x >= self.accept_lo) & (x <= self.accept_hi)
        return ok.all(axis=1)

    def check(self, x: np.ndarray) -> np.ndarray:
        """``x`` as float64 if the model accepts every row; :class:`FeatureError` naming the bad cells otherwise."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != N_FEATURES:
            raise FeatureError(f"expected an (n, {N_FEATURES}) feature matrix, got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise FeatureError("feature matrix contains NaN or infinite values: "
                               + describe_bad_rows(x, self.accept_lo, self.accept_hi))
        if not self.accepts(x).all():
            raise FeatureError("features outside the range this model accepts (training range widened by "
                               f"{self.cfg.range_margin_frac:.0%} per side, within physical bounds): "
                               + describe_bad_rows(x, self.accept_lo, self.accept_hi))
        return x

    @property
    def factorized(self) -> bool:
        """Whether pairs can be predicted as matrix products of per-row embeddings (:meth:`pair_tables`)."""
        return self.cfg.arch == "factorized"

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(normalized throughput in [0, 1], online slowdown factor ≥ 1) for each row.

        Bit for bit, each row's result depends only on that row (fixed-shape
        passes, see ``PREDICT_CHUNK_ROWS``), so de-duplicated rows predict the same.
        """
        x = self.check(x)
        if x.shape[0] == 0:
            return np.zeros(0), np.ones(0)
        if self.factorized:
            a = self.embed_gpu(x[:, GPU_COLUMNS])
            b = self.embed_job(x[:, JOB_COLUMNS])
            return finish(*combine_rows(a, b, self.cfg.embed_dim))
        kernel = self.pair_kernel
        idx = np.arange(x.shape[0])
        raw_t, raw_s = kernel.pairs(kernel.gpu_part(x[:, GPU_COLUMNS]), kernel.job_part(x[:, JOB_COLUMNS]), idx, idx)
        return finish(raw_t.astype(np.float64), raw_s.astype(np.float64))

    @property
    def pair_kernel(self) -> MlpPairs:
        """The MLP as a pair kernel (first layer split into a GPU part and a job part): what :meth:`predict` runs,
        and what a round runs on (GPU row, profile) pairs without building each pair's feature row."""
        if self.factorized:
            raise TypeError("a factorized predictor has per-side embeddings, not an MLP pair kernel")
        kernel = self.__dict__.get("_pair_kernel")
        if kernel is None or kernel.chunk != PREDICT_CHUNK_ROWS:
            kernel = self.__dict__["_pair_kernel"] = MlpPairs(self.net, self.mean, self.std, PREDICT_CHUNK_ROWS)
        return kernel

    def embed_gpu(self, x_gpu: np.ndarray) -> np.ndarray:
        """GPU-side embeddings (float64) of rows of the GPU columns (8 online features, then the SM share)."""
        return self._embed("gpu", x_gpu, GPU_COLUMNS)

    def embed_job(self, x_job: np.ndarray) -> np.ndarray:
        """Job-side embeddings (float64) of rows of the 7 offline features."""
        return self._embed("job", x_job, JOB_COLUMNS)

    def _embed(self, side: str, x_side: np.ndarray, cols: np.ndarray) -> np.ndarray:
        if not self.factorized:
            raise TypeError("only a factorized predictor has per-side embeddings")
        tower = getattr(self.net, side)
        x_side = np.asarray(x_side, dtype=np.float64).reshape(-1, cols.size)
        z = ((x_side - self.mean[cols]) / self.std[cols]).astype(np.float32)
        return _fixed_shape(tower, z, 2 * self.cfg.embed_dim + 2).astype(np.float64)

    def pair_tables(self, gpu_emb: np.ndarray, job_emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tput, slowdown) as float32 of every (GPU row, job row) of two embedding blocks: two matrix products.

        Equal to :meth:`predict` on the same pairs (both are rounded to float32, see
        :func:`~scheduler_core.prediction.nets.finish`).
        """
        return finish(*combine_tables(gpu_emb, job_emb, self.cfg.embed_dim), dtype=np.float32)

    def errors(self, x: np.ndarray, y_tput: np.ndarray, y_slowdown: np.ndarray) -> PredictionErrors:
        """Held-out style errors of this model on labelled samples."""
        p_t, p_s = self.predict(x)
        return _errors(p_t, p_s, np.asarray(y_tput, dtype=float), np.asarray(y_slowdown, dtype=float))

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        obj = {
            "format": BLOB_FORMAT,
            "config": asdict(self.cfg),
            "state": self.net.state_dict(),
            "mean": torch.from_numpy(self.mean),
            "std": torch.from_numpy(self.std),
        }
        if self.train_min is not None and self.train_max is not None:
            obj["train_min"] = torch.from_numpy(self.train_min)
            obj["train_max"] = torch.from_numpy(self.train_max)
        torch.save(obj, buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> SpeedPredictor:
        """Load a saved model; blobs from before format 2 carry no training range (physical bounds only),
        from before format 3 no architecture (they are MLPs)."""
        obj = torch.load(io.BytesIO(blob), weights_only=True)
        known = PredictorConfig.__dataclass_fields__
        saved = {"arch": "mlp", **obj["config"]}
        cfg = PredictorConfig(**{k: v for k, v in saved.items() if k in known})
        net = _mlp(cfg)
        net.load_state_dict(obj["state"])
        lo = obj["train_min"].numpy() if "train_min" in obj else None
        hi = obj["train_max"].numpy() if "train_max" in obj else None
        return cls(cfg, net, obj["mean"].numpy(), obj["std"].numpy(), lo, hi)


def _errors(p_t: np.ndarray, p_s: np.ndarray, y_t: np.ndarray, y_s: np.ndarray) -> PredictionErrors:
    e_t = np.abs(p_t - y_t)
    e_s = np.abs(p_s - y_s)
    return PredictionErrors(
        mae_tput=float(np.mean(e_t)),
        mape_tput=float(np.mean(e_t / np.maximum(np.abs(y_t), MAPE_FLOOR))),
        mae_slowdown=float(np.mean(e_s)),
        mape_slowdown=float(np.mean(e_s / np.maximum(np.abs(y_s), 1.0))),
    )


def train(
    x: np.ndarray, y_tput: np.ndarray, y_slowdown: np.ndarray, cfg: PredictorConfig = PredictorConfig()
) -> tuple[SpeedPredictor, TrainingReport]:
    """Train on samples; score on a held-out split drawn from ``cfg.seed``."""
    x = np.asarray(x, dtype=np.float64)
    targets = np.column_stack([y_tput, np.asarray(y_slowdown) - 1.0]).astype(np.float64)
    if x.ndim != 2 or x.shape[1] != N_FEATURES:
        raise FeatureError(f"expected an (n, {N_FEATURES}) feature matrix, got {x.shape}")
    if x.shape[0] < 10:
        raise ValueError(f"need at least 10 co-location samples to train, got {x.shape[0]}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(targets))):
        raise FeatureError("training data contains NaN or infinite values")
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(x.shape[0])
    n_hold = max(1, int(round(x.shape[0] * cfg.holdout_frac)))
    hold, tr = order[:n_hold], order[n_hold:]
    mean = x[tr].mean(axis=0)
    std = x[tr].std(axis=0)
    std[std < 1e-9] = 1.0

    torch.manual_seed(cfg.seed)
    net = _mlp(cfg)
    opt = _optimizer(cfg, net.parameters())
    xt = torch.from_numpy(((x[tr] - mean) / std).astype(np.float32))
    yt = torch.from_numpy(targets[tr].astype(np.float32))
    xh = torch.from_numpy(((x[hold] - mean) / std).astype(np.float32))
    gen = torch.Generator().manual_seed(cfg.seed)
    loss_fn = nn.MSELoss()
    curve: list[tuple[int, float]] = []
    net.train()
    for epoch in range(1, cfg.epochs + 1):
        perm = torch.randperm(xt.shape[0], generator=gen)
        for start in range(0, xt.shape[0], cfg.batch_size):
            idx = perm[start : start + cfg.batch_size]
            opt.zero_grad()
            loss = loss_fn(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
        if cfg.eval_every and (epoch % cfg.eval_every == 0 or epoch == cfg.epochs):
            with torch.no_grad():
                p = np.clip(net(xh)[:, 0].numpy().astype(np.float64), 0.0, 1.0)
            curve.append((epoch, float(np.mean(np.abs(p - targets[hold, 0])))))
            net.train()
    # The accepted range is that of every sample (the stored feature_ranges).
    model = SpeedPredictor(cfg, net, mean, std, x.min(axis=0), x.max(axis=0))
    p_tput, p_slow = _predict_unchecked(model, x[hold])
    t_tput, _ = _predict_unchecked(model, x[tr])
    held = _errors(p_tput, p_slow, targets[hold, 0], targets[hold, 1] + 1.0)
    report = TrainingReport(
        n_train=int(tr.size),
        n_holdout=int(hold.size),
        holdout_mae_tput=held.mae_tput,
        holdout_mae_slowdown=held.mae_slowdown,
        train_mae_tput=float(np.mean(np.abs(t_tput - targets[tr, 0]))),
        feature_ranges={
            name: [float(x[:, j].min()), float(x[:, j].max())] for j, name in enumerate(FEATURE_NAMES)
        },
        holdout_mape_tput=held.mape_tput,
        holdout_mape_slowdown=held.mape_slowdown,
        curve=tuple(curve),
    )
    return model, report


def _predict_unchecked(model: SpeedPredictor, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        out = model.net(torch.from_numpy(((x - model.mean) / model.std).astype(np.float32))).numpy()
    out = out.astype(np.float64)
    return finish(out[:, 0].copy(), out[:, 1].copy())


def should_promote(candidate: TrainingReport, current_holdout_mae: float | None, tolerance: float = 0.0) -> bool:
    """A model replaces the current one only if its held-out error is no worse (docs/DESIGN.md §3.4).

    Compare on the same held-out samples where possible: score the current
    model with :meth:`SpeedPredictor.errors` on the candidate's held-out split.
    """
    return current_holdout_mae is None or candidate.holdout_mae_tput <= current_holdout_mae + tolerance
