"""scheduler_core/ stays pure: no database, orchestration or HTTP imports, no environment reads (docs/DESIGN.md §2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "scheduler_core"
FORBIDDEN = {"sqlalchemy", "dagster", "httpx", "requests", "psycopg2"}
MODULES = sorted(CORE.rglob("*.py"))


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [(node.module or "").split(".")[0]] if node.level == 0 else []
            if roots == ["os"] and any(a.name in ("environ", "getenv", "putenv") for a in node.names):
                found.append(f"line {node.lineno}: from os import environ/getenv")
        else:
            roots = []
        found += [f"line {node.lineno}: imports {r}" for r in roots if r in FORBIDDEN]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("environ", "getenv", "putenv", "environb"):
            found.append(f"line {node.lineno}: os.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("__import__",):
            found.append(f"line {node.lineno}: dynamic __import__")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    assert violations(path.read_text()) == [], path.name


@pytest.mark.parametrize(
    "source",
    [
        "import sqlalchemy",
        "from sqlalchemy.orm import Session",
        "import dagster as dg",
        "def f():\n    import httpx\n",
        "import requests.adapters",
        "import psycopg2",
        "import os\nx = os.environ['X']",
        "import os\nx = os.getenv('X')",
        "from os import environ",
    ],
)
def test_checker_catches_violations(source: str) -> None:
    assert violations(source)


def test_checker_allows_pure_code() -> None:
    assert violations("import numpy as np\nimport os.path\nfrom .domain import JobState\nx = os.path.join('a')") == []
