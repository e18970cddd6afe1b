"""Pure parsers for Slurm's compact strings: host lists and GRES/TRES lists."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(expr: str) -> list[str]:
    start = expr.find("[")
    if start < 0:
        if "]" in expr:
            raise ValueError(f"hostlist: unbalanced bracket in {expr!r}")
        return [expr]
    end = expr.find("]", start)
    if end < 0:
        raise ValueError(f"hostlist: unbalanced bracket in {expr!r}")
    prefix, body, rest = expr[:start], expr[start + 1:end], expr[end + 1:]
    names = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"hostlist: bad range {item!r} in {expr!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"hostlist: descending range {item!r} in {expr!r}")
        width = len(lo_s) if lo_s.startswith("0") else 0
        names += [f"{prefix}{i:0{width}d}" for i in range(lo, hi + 1)]
    return [n + tail for n in names for tail in _expand_one(rest)]


def expand_hostlist(text: str | None) -> tuple[str, ...]:
    """``"mx-t4-[1-2],mx-a10-1"`` → ``("mx-t4-1", "mx-t4-2", "mx-a10-1")``; ``""``/``"(null)"`` → ``()``."""
    if not text or text.strip() in ("(null)", "None", "N/A"):
        return ()
    out: list[str] = []
    for expr in _split_top(text):
        out += _expand_one(expr)
    return tuple(out)


@dataclass(frozen=True)
class Gres:
    """One generic resource of a GRES string: ``gpu:t4:4`` → name gpu, type t4, count 4."""

    name: str
    type: str | None
    count: int


def parse_gres(text: str | None) -> tuple[Gres, ...]:
    """Parse node and job GRES strings from any supported Slurm version.

    Accepts ``gpu:t4:4,mps:400``, the index-annotated ``gpu:t4:0(IDX:N/A)``,
    job forms ``gres:mps:30`` (22.05) and ``gres/mps:30`` / ``gres/mps=30``
    (23.x), and ``(null)``/empty for none. A name without a count counts 1.
    """
    if not text or text.strip() in ("(null)", "N/A", "None"):
        return ()
    out = []
    for item in _split_top(text):
        item = re.sub(r"\(.*\)$", "", item).strip()
        for pre in ("gres:", "gres/"):
            if item.startswith(pre):
                item = item[len(pre):]
        item = item.replace("=", ":")
        fields = item.split(":")
        name = fields[0]
        if not name or any(not f for f in fields[1:2]) or (len(fields) >= 3 and not fields[-1]):
            raise ValueError(f"gres: empty field in {item!r} of {text!r}")
        count, gtype = 1, None
        if len(fields) == 2:
            if fields[1].isdigit():
                count = int(fields[1])
            else:
                gtype = fields[1]
        elif len(fields) >= 3:
            gtype = fields[1] or None
            if not fields[2].isdigit():
                raise ValueError(f"gres: bad count {fields[2]!r} in {text!r}")
            count = int(fields[2])
        out.append(Gres(name=name, type=gtype, count=count))
    return tuple(out)


def gres_count(text: str | None, name: str) -> int:
    """Total count of GRES ``name`` in a GRES string (0 when absent)."""
    return sum(g.count for g in parse_gres(text) if g.name == name)


# One gres Type per GPU (docs/SLURM.md "One gres Type per GPU"): the GPU with Slurm index i of a
# node whose GPUs are of model m has Type ``<m>g<i>`` on its ``gpu`` and ``mps`` lines, so that
# ``--gres=mps:<m>g<i>:<pct>`` names the GPU a placement is planned on.
_PER_GPU_TYPE = re.compile(r"^(.+)g(\d+)$")


def per_gpu_type(model: str, index: int) -> str:
    """The gres Type naming GPU ``index`` of a node with GPUs of ``model``: ``("t4", 2)`` → ``"t4g2"``."""
    if not model or index < 0:
        raise ValueError(f"per-GPU type: need a model and an index >= 0, got {model!r}, {index!r}")
    return f"{model}g{index}"


def split_per_gpu_type(gres_type: str | None) -> tuple[str, int] | None:
    """``"t4g2"`` → ``("t4", 2)``; None for a type that does not name one GPU (``"t4"``, ``"a10g"``)."""
    m = _PER_GPU_TYPE.match(gres_type or "")
    return (m.group(1), int(m.group(2))) if m else None
