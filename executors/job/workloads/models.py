"""The reference models: a ResNet-style CNN, a transformer encoder and an embedding-heavy recommender.

Defined here with random weights (nothing is downloaded). Each family comes in
sizes: ``tiny`` for CPU tests (milliseconds per step), ``small`` for CPU demos,
``gpu`` at the scale of the workloads the paper co-locates (ResNet-18 at
224×224, a 6-layer BERT-base-width encoder, a DLRM-style model with 26 large
embedding tables). Inputs are synthetic and deterministic: a pool of batches
drawn once from a seeded generator on the target device (so generating data
never dominates a GPU iteration) and cycled by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

FAMILIES = ("cnn", "transformer", "recommender")
SIZES = ("tiny", "small", "gpu")


@dataclass(frozen=True)
class CnnSize:
    width: int
    blocks: tuple[int, int, int, int]
    image: int
    classes: int


@dataclass(frozen=True)
class TransformerSize:
    vocab: int
    d_model: int
    heads: int
    layers: int
    ff: int
    seq: int
    classes: int


@dataclass(frozen=True)
class RecommenderSize:
    tables: int
    rows: int
    dim: int
    lookups: int  # indices per table per sample (multi-hot)
    dense: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]


@dataclass(frozen=True)
class WorkloadSize:
    """One family at one size: the model, its training batch and its catalog job type."""

    family: str
    size: str
    arch: CnnSize | TransformerSize | RecommenderSize
    train_batch: int
    job_type: str  # the catalog's job type the size stands for (scheduler_core.workloads)


_SIZES: dict[tuple[str, str], WorkloadSize] = {
    (w.family, w.size): w
    for w in (
        WorkloadSize("cnn", "tiny", CnnSize(8, (1, 1, 1, 1), 32, 10), 8, "ResNet-18 (batch size 16)"),
        WorkloadSize("cnn", "small", CnnSize(16, (2, 2, 2, 2), 64, 100), 16, "ResNet-18 (batch size 16)"),
        WorkloadSize("cnn", "gpu", CnnSize(64, (2, 2, 2, 2), 224, 1000), 64, "ResNet-18 (batch size 64)"),
        WorkloadSize("transformer", "tiny", TransformerSize(1000, 32, 2, 2, 64, 32, 8), 8,
                     "Transformer (batch size 16)"),
        WorkloadSize("transformer", "small", TransformerSize(8000, 128, 4, 2, 256, 64, 8), 16,
                     "Transformer (batch size 16)"),
        WorkloadSize("transformer", "gpu", TransformerSize(30522, 768, 12, 6, 3072, 128, 8), 32,
                     "Transformer (batch size 32)"),
        WorkloadSize("recommender", "tiny", RecommenderSize(4, 1000, 16, 4, 8, (32, 16), (64, 1)), 32,
                     "Recommendation (batch size 512)"),
        WorkloadSize("recommender", "small", RecommenderSize(8, 50_000, 32, 8, 13, (64, 32), (128, 64, 1)), 256,
                     "Recommendation (batch size 512)"),
        WorkloadSize("recommender", "gpu", RecommenderSize(26, 200_000, 64, 20, 13, (512, 256, 64),
                                                          (512, 256, 1)), 2048, "Recommendation (batch size 2048)"),
    )
}


def workload_size(family: str, size: str) -> WorkloadSize:
    try:
        return _SIZES[(family, size)]
    except KeyError:
        raise ValueError(f"unknown workload {family!r}/{size!r} (families: {', '.join(FAMILIES)}; "
                         f"sizes: {', '.join(SIZES)})") from None


def reference_job_types() -> dict[tuple[str, str], str]:
    return {k: w.job_type for k, w in _SIZES.items()}


# -- CNN -----------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNetStyle(nn.Module):
    """ResNet-18's shape (He et al.) at a chosen width and depth: stem, four stages, pool, classifier."""

    def __init__(self, a: CnnSize):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, a.width, 3, 1, 1, bias=False), nn.BatchNorm2d(a.width), nn.ReLU())
        layers: list[nn.Module] = []
        cin = a.width
        for stage, n in enumerate(a.blocks):
            cout = a.width * 2**stage
            for b in range(n):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(cin, a.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


# -- transformer ------------------------------------------------------------------------------------

class EncoderClassifier(nn.Module):
    """Token + position embeddings, a pre-norm transformer encoder, mean pooling, a classifier."""

    def __init__(self, a: TransformerSize):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.d_model)
        self.pos = nn.Parameter(torch.randn(a.seq, a.d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(a.d_model, a.heads, a.ff, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, a.layers, enable_nested_tensor=False)
        self.head = nn.Linear(a.d_model, a.classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.encoder(h).mean(dim=1))


# -- recommender ------------------------------------------------------------------------------------

def _mlp(sizes: tuple[int, ...], cin: int, last_act: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, cout in enumerate(sizes):
        layers.append(nn.Linear(cin, cout))
        if i < len(sizes) - 1 or last_act:
            layers.append(nn.ReLU())
        cin = cout
    return nn.Sequential(*layers)


class Recommender(nn.Module):
    """DLRM-style: summed embedding bags per sparse feature, a bottom MLP for dense features,
    pairwise dot-product interactions, a top MLP to one click logit."""

    def __init__(self, a: RecommenderSize):
        super().__init__()
        if a.bottom[-1] != a.dim:
            raise ValueError("the bottom MLP must end at the embedding dimension")
        self.tables = nn.ModuleList(nn.EmbeddingBag(a.rows, a.dim, mode="sum") for _ in range(a.tables))
        self.bottom = _mlp(a.bottom, a.dense, last_act=True)
        n = a.tables + 1
        self.top = _mlp(a.top, a.dim + n * (n - 1) // 2, last_act=False)
        self.register_buffer("iu", torch.triu_indices(n, n, offset=1), persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        # sparse: (batch, tables, lookups) indices
        x = self.bottom(dense)
        embs = [t(sparse[:, i, :]) for i, t in enumerate(self.tables)]
        z = torch.stack([x, *embs], dim=1)                       # (batch, n, dim)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def build_model(w: WorkloadSize) -> nn.Module:
    if w.family == "cnn":
        return ResNetStyle(w.arch)  # type: ignore[arg-type]
    if w.family == "transformer":
        return EncoderClassifier(w.arch)  # type: ignore[arg-type]
    return Recommender(w.arch)  # type: ignore[arg-type]


Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]  # (model inputs, labels)


def make_batch(w: WorkloadSize, n: int, g: torch.Generator, device: torch.device) -> Batch:
    """``n`` synthetic samples of the family's input, drawn from ``g``, on ``device``."""
    a = w.arch
    if isinstance(a, CnnSize):
        x = torch.randn(n, 3, a.image, a.image, generator=g)
        y = torch.randint(0, a.classes, (n,), generator=g)
        return (x.to(device),), y.to(device)
    if isinstance(a, TransformerSize):
        t = torch.randint(0, a.vocab, (n, a.seq), generator=g)
        y = torch.randint(0, a.classes, (n,), generator=g)
        return (t.to(device),), y.to(device)
    dense = torch.randn(n, a.dense, generator=g)
    # Zipf-like skew of real click logs: most lookups hit a few hot rows.
    u = torch.rand(n, a.tables, a.lookups, generator=g)
    sparse = (u.pow(4.0) * a.rows).long().clamp_(max=a.rows - 1)
    y = (torch.rand(n, generator=g) < 0.25).float()
    return (dense.to(device), sparse.to(device)), y.to(device)


def batch_pool(w: WorkloadSize, n: int, count: int, seed: int, device: torch.device) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [make_batch(w, n, g, device) for _ in range(count)]


def loss_fn(w: WorkloadSize, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if w.family == "recommender":
        return nn.functional.binary_cross_entropy_with_logits(out, y)
    return nn.functional.cross_entropy(out, y)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
