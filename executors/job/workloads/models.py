"""The reference models: ResNet-18 and ResNet-50, a transformer encoder and an embedding-heavy recommender.

Defined here with random weights (nothing is downloaded). Each family comes in
sizes: ``tiny`` for CPU tests (milliseconds per step), ``small`` for CPU demos,
``gpu`` at the scale of the workloads the paper co-locates (torchvision's
ResNet-18 and ResNet-50 at 224×224, a 6-layer BERT-base-width encoder, a
DLRM-style model with 26 large embedding tables); ``tiny`` and ``small`` keep
each architecture's shape rules at a smaller width, depth and input.
docs/WORKLOADS.md lists every size's parameters and FLOPs
(``python -m executors.job.workloads.sizes``). Inputs are synthetic and
deterministic: a pool of batches drawn once from a seeded generator on the
target device (so generating data never dominates a GPU iteration) and cycled
by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# Families that are both an online service (scheduler_core.workloads.ONLINE_FAMILIES has each) and an
# offline job: what `serve` runs and what co-location sampling pairs. ``cnn`` is ResNet-18.
FAMILIES = ("cnn", "transformer", "recommender")
SERVICE_FAMILIES = FAMILIES
# Every offline job family `train` runs: the above and ResNet-50 (offline only: no online family stands for it).
JOB_FAMILIES = ("cnn", "resnet50", "transformer", "recommender")
SIZES = ("tiny", "small", "gpu")


@dataclass(frozen=True)
class CnnSize:
    block: str  # "basic" (ResNet-18) | "bottleneck" (ResNet-50)
    width: int  # the stem's channels; stage i has width * 2**i planes (× 4 out of a bottleneck)
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
        WorkloadSize("cnn", "tiny", CnnSize("basic", 8, (1, 1, 1, 1), 32, 10), 8, "ResNet-18 (batch size 16)"),
        WorkloadSize("cnn", "small", CnnSize("basic", 16, (2, 2, 2, 2), 64, 100), 16, "ResNet-18 (batch size 16)"),
        WorkloadSize("cnn", "gpu", CnnSize("basic", 64, (2, 2, 2, 2), 224, 1000), 64, "ResNet-18 (batch size 64)"),
        WorkloadSize("resnet50", "tiny", CnnSize("bottleneck", 8, (1, 1, 1, 1), 32, 10), 8,
                     "ResNet-50 (batch size 16)"),
        WorkloadSize("resnet50", "small", CnnSize("bottleneck", 16, (3, 4, 6, 3), 64, 100), 16,
                     "ResNet-50 (batch size 16)"),
        WorkloadSize("resnet50", "gpu", CnnSize("bottleneck", 64, (3, 4, 6, 3), 224, 1000), 64,
                     "ResNet-50 (batch size 64)"),
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
        raise ValueError(f"unknown workload {family!r}/{size!r} (families: {', '.join(JOB_FAMILIES)}; "
                         f"sizes: {', '.join(SIZES)})") from None


def reference_job_types() -> dict[tuple[str, str], str]:
    """(family, size) → the catalog job type, for every job family."""
    return {k: w.job_type for k, w in _SIZES.items()}


# -- CNN -----------------------------------------------------------------------------------------
# torchvision's ResNet (torchvision/models/resnet.py, He et al. 2016, "v1.5": the stride of a
# bottleneck's downsampling block on its 3x3 conv), module for module: the same attribute names
# (conv1, bn1, layer1..layer4, fc; a block's downsample) and initialisation, so a state_dict has
# torchvision's keys and shapes. ``width`` is the stem's channels (64 in ResNet-18/50); the scaled
# sizes shrink it, the depth and the image, and keep every shape rule.

def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4 (ResNet-50/101/152)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


BLOCKS: dict[str, type[BasicBlock] | type[Bottleneck]] = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """7x7 stride-2 stem, BN, ReLU, 3x3 stride-2 max-pool, four stages (stride 1, 2, 2, 2),
    global average pool, a linear classifier."""

    def __init__(self, a: CnnSize):
        super().__init__()
        block = BLOCKS[a.block]
        self.inplanes = a.width
        self.conv1 = nn.Conv2d(3, a.width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(a.width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, a.width, a.blocks[0])
        self.layer2 = self._make_layer(block, a.width * 2, a.blocks[1], stride=2)
        self.layer3 = self._make_layer(block, a.width * 4, a.blocks[2], stride=2)
        self.layer4 = self._make_layer(block, a.width * 8, a.blocks[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(a.width * 8 * block.expansion, a.classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int,
                    stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers.extend(block(self.inplanes, planes) for _ in range(1, blocks))
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


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
    if isinstance(w.arch, CnnSize):
        return ResNet(w.arch)
    if isinstance(w.arch, TransformerSize):
        return EncoderClassifier(w.arch)
    return Recommender(w.arch)


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
