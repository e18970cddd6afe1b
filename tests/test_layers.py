"""The import graph follows the layers, and has no cycle — counting imports inside functions too.

Layers (docs/ARCHITECTURE.md "What runs where"), each importing only what is listed for it:

| layer | packages | may import |
|---|---|---|
| core | ``scheduler_core`` | itself |
| inside a job | ``executors.job.runtime``, ``executors.job.workloads`` | themselves, the core |
| adapters (scheduler host and GPU nodes) | the rest of ``executors`` | the above, themselves |
| Dagster assets | ``assets`` | the above |
| wiring | ``pipelines`` | everything |
| schema and reports | ``sql`` (Alembic scripts, report SQL) | the feature store's models; read by ``executors.store`` only |

An import inside a function is an edge like any other: a lazy import keeps start-up fast, it
does not make a cycle or a wrong-way dependency acceptable.

Every SQLAlchemy statement is built in the feature store (``executors.store``): the rest of the
code calls its named functions, so only the store and the Alembic scripts (``sql``) import
``sqlalchemy``, but for the few uses listed in :data:`SQLALCHEMY_ALLOWED` with their reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduler_core", "executors", "assets", "pipelines", "sql")
IN_JOB = ("executors.job.runtime", "executors.job.workloads")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    # `from pkg import mod` imports the submodule; `from mod import name` imports the module
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports, at module level or inside functions."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, name, path.name == "__init__.py"):
                    resolved = _resolve(target)
                    if resolved and resolved != name:
                        graph[name].add(resolved)
    return graph


def _layer(module: str) -> int:
    if module.startswith("scheduler_core"):
        return 0
    if module.startswith(IN_JOB):
        return 1
    if module.startswith("executors"):
        return 2
    if module.startswith("assets"):
        return 3
    return 4  # pipelines


def test_every_import_goes_down_the_layers() -> None:
    wrong = []
    for src, targets in import_graph().items():
        for dst in targets:
            if src.startswith("sql"):
                ok = dst.startswith(("sql", "executors.store", "scheduler_core"))
            elif dst.startswith("sql"):
                ok = src.startswith("executors.store")
            else:
                ok = _layer(dst) <= _layer(src)
                ok = ok and not (_layer(src) == 1 and _layer(dst) == 1 and src.split(".")[1] != dst.split(".")[1]
                                 and dst.startswith("executors.job.workloads"))
            if not ok:
                wrong.append(f"{src} imports {dst}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


# (module, the sqlalchemy module it may import) -> why; nothing here may build a statement.
SQLALCHEMY_ALLOWED = {
    ("executors.dev.bench_dispatch", "sqlalchemy.event"):
        "the dispatch benchmark counts the rows the dispatcher writes by listening on the store's engine",
}


def sqlalchemy_imports(modules: dict[str, Path] = MODULES) -> dict[tuple[str, str], int]:
    """(module, imported sqlalchemy module) -> line, for every module outside the store and ``sql``.

    ``from sqlalchemy import select`` counts as importing ``sqlalchemy`` itself (a name, not a
    submodule), ``from sqlalchemy import event`` and ``from sqlalchemy.exc import X`` as the submodule.
    """
    submodules = {"event", "exc", "engine", "orm", "sql", "types", "dialects", "pool", "schema", "ext"}
    out = {}
    for name, path in modules.items():
        if name.startswith(("executors.store", "sql")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                base = node.module or ""
                targets = [f"{base}.{a.name}" if base == "sqlalchemy" and a.name in submodules else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                if target == "sqlalchemy" or target.startswith("sqlalchemy."):
                    out.setdefault((name, target), node.lineno)
    return out


def test_only_the_store_builds_sql() -> None:
    found = sqlalchemy_imports()
    wrong = [f"{mod}:{line} imports {target}" for (mod, target), line in sorted(found.items())
             if (mod, target) not in SQLALCHEMY_ALLOWED]
    assert not wrong, ("SQLAlchemy outside executors.store (move the query into a store function, or list a "
                       "non-statement use in SQLALCHEMY_ALLOWED with its reason):\n" + "\n".join(wrong))
    unused = sorted(set(SQLALCHEMY_ALLOWED) - set(found))
    assert not unused, f"allowed SQLAlchemy imports no longer made (drop them from the list): {unused}"


def test_the_sql_check_sees_a_query_outside_the_store(tmp_path: Path) -> None:
    sync = tmp_path / "sync.py"
    sync.write_text(MODULES["executors.scheduler.slurm.sync"].read_text() + "\n\ndef f():\n    from sqlalchemy import select\n")
    bench = tmp_path / "bench.py"
    bench.write_text("from sqlalchemy import event, select\nfrom sqlalchemy.orm import Session\n")
    found = sqlalchemy_imports({"executors.scheduler.slurm.sync": sync, "executors.dev.bench_dispatch": bench,
                                "executors.store.jobs": MODULES["executors.store.jobs"]})
    assert set(found) == {("executors.scheduler.slurm.sync", "sqlalchemy"), ("executors.dev.bench_dispatch", "sqlalchemy"),
                          ("executors.dev.bench_dispatch", "sqlalchemy.event"),
                          ("executors.dev.bench_dispatch", "sqlalchemy.orm")}


def test_no_import_cycle_even_through_imports_inside_functions() -> None:
    assert _cycles(import_graph()) == []


def test_the_checks_see_what_they_must() -> None:
    # The graph has the edges the layers are about (a broken parser would pass the tests above vacuously).
    g = import_graph()
    assert "scheduler_core.round.plan" in g["executors.scheduler.round_runner"]
    assert "executors.scheduler.round_service" in g["assets.rounds"]
    assert "pipelines.cli.bench" in g["pipelines.cli.main"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
