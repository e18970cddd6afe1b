"""A real Prometheus server (Debian's package, installed by .ci/ensure_prometheus.sh) for tests: its own port,
configuration, rules and storage; queried through its HTTP API. Missing: the test skips, or fails under CI=true."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "prometheus" / "muxflow-rules.yml"


def tool(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``."""
    path = shutil.which(name)
    if path is None:
        why = f"{name} is not installed (Debian's 'prometheus' package; make test installs it as root)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"required under CI=true: {why}")
        pytest.skip(why)
    return path


def parse_series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A text exposition: sample name → [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out.setdefault(smp.name, []).append((dict(smp.labels), smp.value))
    return out


def one(series: dict, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels`` (fails unless exactly one)."""
    hits = [v for lab, v in series.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(hits) == 1, (name, labels, series.get(name))
    return hits[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], input=stdin, capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def start_prometheus(procs, directory: Path, targets: Mapping[str, Sequence[str]], interval_s: float = 1.0,
                     rules: Path = RULES) -> str:
    """A Prometheus scraping ``targets`` (job name → ``host:port`` list) and evaluating ``rules`` every
    ``interval_s``; its base URL once it is ready."""
    binary = tool("prometheus")
    directory.mkdir(parents=True, exist_ok=True)
    scrape = "\n".join(f"  - job_name: {job}\n    static_configs:\n      - targets: [{', '.join(map(repr, hosts))}]"
                       for job, hosts in targets.items())
    config = directory / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: {interval_s:g}s\n  scrape_timeout: {interval_s:g}s\n"
                      f"  evaluation_interval: {interval_s:g}s\nrule_files:\n  - {rules}\nscrape_configs:\n{scrape}\n")
    check = promtool("check", "config", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    procs.start("prometheus", [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
                               f"--web.listen-address=127.0.0.1:{port}"], cwd=directory)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return url
        except OSError:
            pass
        if time.monotonic() > end:
            raise AssertionError(f"prometheus did not become ready:\n{procs.procs[-1].log_tail()}")
        time.sleep(0.2)


def query(url: str, expr: str) -> list[dict]:
    """An instant PromQL query: its result vector (each ``{"metric": {...}, "value": [t, "v"]}``)."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def targets_up(url: str) -> dict[str, str]:
    """scrape URL → health of every active target."""
    with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=10) as r:
        body = json.loads(r.read())
    return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}
