"""The speed predictor's settings (torch-free, so that command-line defaults and settings can name them).

The MLP's defaults: 4 linear layers of 32 units, 400 epochs of momentum SGD.
The paper's network is 4 × 64 (its Figure 12 sweep: width hardly matters);
4 × 32 trained 400 epochs is no less accurate — on the held-out split and on job
types it was not trained on — at a quarter of the cost per (GPU, job) pair, which
is what a round with a profile per job pays ~400 M times at 20,000 GPUs ×
10,000 jobs (docs/BENCHMARKS.md, "Predictor"). ``hidden=64, epochs=250`` is the
paper's (the deployment setting ``predictor_hidden``, ``muxflow train --hidden``).
The factorized network keeps 64-unit towers and 250 epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

ARCHS = ("mlp", "factorized")
# Per architecture: (hidden units, epochs) when the config leaves them out.
ARCH_DEFAULTS = {"mlp": (32, 400), "factorized": (64, 250)}


@dataclass(frozen=True)
class PredictorConfig:
    # "mlp" (default): the paper's network; "factorized": GPU and job towers meeting in dot products.
    arch: str = "mlp"
    layers: int = 4  # per tower for "factorized"
    hidden: int | None = None  # None: the architecture's (ARCH_DEFAULTS)
    embed_dim: int = 32  # "factorized": rank of each output's GPU × job interaction
    # None: the architecture's own — momentum SGD at 0.02 for "mlp" (paper), Adam at 0.003 for "factorized".
    optimizer: str | None = None
    lr: float | None = None
    momentum: float = 0.9
    epochs: int | None = None  # None: the architecture's (ARCH_DEFAULTS)
    batch_size: int = 64
    holdout_frac: float = 0.2
    seed: int = 0
    # Accepted input: training range widened by this fraction of its width per side.
    range_margin_frac: float = 0.5
    # Record the held-out error every this many epochs (0 = only at the end), for Figure 12's curves.
    eval_every: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if self.optimizer not in (None, "sgd", "adam"):
            raise ValueError(f"optimizer must be sgd or adam, got {self.optimizer!r}")
        hidden, epochs = ARCH_DEFAULTS[self.arch]
        if self.hidden is None:
            object.__setattr__(self, "hidden", hidden)
        if self.epochs is None:
            object.__setattr__(self, "epochs", epochs)
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")

    @property
    def optimizer_name(self) -> str:
        return self.optimizer or ("sgd" if self.arch == "mlp" else "adam")

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return 0.02 if self.optimizer_name == "sgd" else 0.003
