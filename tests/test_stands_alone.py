"""The repository stands alone: nothing cites a file outside it, and every design reference resolves."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "test-artifacts", ".dagster_home", ".muxflow", "__pycache__", "node_modules",
             ".pytest_cache", ".ruff_cache", "build"}
TEXT = {".py", ".md", ".sh", ".lua", ".c", ".h", ".sql", ".toml", ".yaml", ".yml", ".cfg", ".txt", ""}
OUTSIDE = re.compile(r"\.\./shared|(?<![/\w])DESIGN(\.md)? ?§|STYLE\.md")
DESIGN_REF = re.compile(r"docs/DESIGN\.md §(\d+)")


def _text_files() -> list[Path]:
    out = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]  # never entered
        for name in files:
            path = Path(top) / name
            if path.suffix in TEXT and path.stat().st_size < 2_000_000:
                out.append(path)
    return out


def test_nothing_cites_a_file_outside_the_repository() -> None:
    found = []
    for path in _text_files():
        if path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_every_design_reference_names_a_section_of_the_design() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    sections = {int(m) for m in re.findall(r"^## (\d+)\. ", design, flags=re.M)}
    assert sections == set(range(1, 12))
    refs = {}
    for path in _text_files():
        for m in DESIGN_REF.finditer(path.read_text(errors="replace")):
            refs.setdefault(int(m.group(1)), str(path.relative_to(ROOT)))
    assert refs, "no file refers to the design"
    assert not {n: f for n, f in refs.items() if n not in sections}
