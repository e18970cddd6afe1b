"""Speed predictor: one MLP per GPU type (paper §5–6).

Inputs are the 16 pair features of :mod:`scheduler_core.features`; outputs are
the offline job's normalized throughput and the online service's latency
slowdown factor. Paper default: 4 linear layers, hidden 64×64, momentum SGD.
Input normalization is part of the saved model, and training is reproducible
from its seed.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from scheduler_core.features import FEATURE_NAMES, N_FEATURES, FeatureError


@dataclass(frozen=True)
class PredictorConfig:
    layers: int = 4
    hidden: int = 64
    lr: float = 0.02
    momentum: float = 0.9
    epochs: int = 250
    batch_size: int = 64
    holdout_frac: float = 0.2
    seed: int = 0


def _mlp(cfg: PredictorConfig) -> nn.Sequential:
    if cfg.layers < 2:
        raise ValueError("an MLP needs at least 2 layers")
    mods: list[nn.Module] = [nn.Linear(N_FEATURES, cfg.hidden), nn.ReLU()]
    for _ in range(cfg.layers - 2):
        mods += [nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU()]
    mods.append(nn.Linear(cfg.hidden, 2))
    return nn.Sequential(*mods)


@dataclass(frozen=True)
class TrainingReport:
    n_train: int
    n_holdout: int
    holdout_mae_tput: float
    holdout_mae_slowdown: float
    train_mae_tput: float
    feature_ranges: dict[str, list[float]]


class SpeedPredictor:
    """A trained MLP with its input normalization."""

    def __init__(self, cfg: PredictorConfig, net: nn.Sequential, mean: np.ndarray, std: np.ndarray):
        self.cfg = cfg
        self.net = net.eval()
        self.mean = mean.astype(np.float32)
        self.std = std.astype(np.float32)

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(normalized throughput in [0, 1], online slowdown factor ≥ 1) for each row."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != N_FEATURES:
            raise FeatureError(f"expected an (n, {N_FEATURES}) feature matrix, got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise FeatureError("feature matrix contains NaN or infinite values")
        if x.shape[0] == 0:
            return np.zeros(0), np.ones(0)
        z = torch.from_numpy(((x - self.mean) / self.std).astype(np.float32))
        with torch.no_grad():
            out = self.net(z).numpy().astype(np.float64)
        return np.clip(out[:, 0], 0.0, 1.0), 1.0 + np.maximum(out[:, 1], 0.0)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(
            {
                "config": asdict(self.cfg),
                "state": self.net.state_dict(),
                "mean": torch.from_numpy(self.mean),
                "std": torch.from_numpy(self.std),
            },
            buf,
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> SpeedPredictor:
        obj = torch.load(io.BytesIO(blob), weights_only=True)
        cfg = PredictorConfig(**obj["config"])
        net = _mlp(cfg)
        net.load_state_dict(obj["state"])
        return cls(cfg, net, obj["mean"].numpy(), obj["std"].numpy())


def train(
    x: np.ndarray, y_tput: np.ndarray, y_slowdown: np.ndarray, cfg: PredictorConfig = PredictorConfig()
) -> tuple[SpeedPredictor, TrainingReport]:
    """Train on samples; score on a held-out split drawn from ``cfg.seed``."""
    x = np.asarray(x, dtype=np.float64)
    targets = np.column_stack([y_tput, np.asarray(y_slowdown) - 1.0]).astype(np.float64)
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
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    xt = torch.from_numpy(((x[tr] - mean) / std).astype(np.float32))
    yt = torch.from_numpy(targets[tr].astype(np.float32))
    gen = torch.Generator().manual_seed(cfg.seed)
    loss_fn = nn.MSELoss()
    net.train()
    for _ in range(cfg.epochs):
        perm = torch.randperm(xt.shape[0], generator=gen)
        for start in range(0, xt.shape[0], cfg.batch_size):
            idx = perm[start : start + cfg.batch_size]
            opt.zero_grad()
            loss = loss_fn(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    model = SpeedPredictor(cfg, net, mean, std)
    p_tput, p_slow = model.predict(x[hold])
    t_tput, _ = model.predict(x[tr])
    report = TrainingReport(
        n_train=int(tr.size),
        n_holdout=int(hold.size),
        holdout_mae_tput=float(np.mean(np.abs(p_tput - targets[hold, 0]))),
        holdout_mae_slowdown=float(np.mean(np.abs(p_slow - 1.0 - targets[hold, 1]))),
        train_mae_tput=float(np.mean(np.abs(t_tput - targets[tr, 0]))),
        feature_ranges={
            name: [float(x[:, j].min()), float(x[:, j].max())] for j, name in enumerate(FEATURE_NAMES)
        },
    )
    return model, report


def should_promote(candidate: TrainingReport, current_holdout_mae: float | None) -> bool:
    """A model replaces the current one only if its held-out error is no worse (DESIGN §3.4)."""
    return current_holdout_mae is None or candidate.holdout_mae_tput <= current_holdout_mae
