"""The Grafana dashboard and the alert rules ask only for series MuxFlow exports: every metric name in their PromQL
is one the node agent's or the scheduler's endpoint serves (or Prometheus' own ``up`` and ``ALERTS``), and the
dashboard is a well-formed Grafana import (a datasource input, unique panel ids, each panel placed)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from executors.node.metrics import NodeAgentCollector
from executors.node.wiring import node_metrics
from executors.node.xcuda.stats import XcudaStats
from executors.scheduler.metrics import SchedulerCollector
from tests.executors.node.test_node_metrics import CALM, HOT, NODE, node  # noqa: F401 -- the fixture
from tests.executors.scheduler.test_scheduler_metrics import NOW, _history

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "muxflow-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "muxflow-rules.yml"
PROMETHEUS_OWN = {"up", "ALERTS"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, groupings, ranges and functions left out)."""
    e = re.sub(r'"[^"]*"', '""', expr)                       # strings
    e = re.sub(r"\{[^}]*\}", " ", e)                            # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)                           # ranges
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group() in KEYWORDS:
            continue                                            # a function or an aggregation
        names.add(m.group())
    return names


def exported(node_fixture, store) -> set[str]:
    agent, clock, sampler = node_fixture["agent"], node_fixture["clock"], node_fixture["sampler"]
    for k in range(3):
        sampler.set_override(0, HOT if k == 1 else CALM)
        agent.tick()
        clock.t += 1.0
    names = set()
    with urllib.request.urlopen(f"http://127.0.0.1:{node_fixture['port']}/metrics", timeout=10) as r:
        texts = [r.read().decode()]
    # the same agent with every placed Slurm job publishing xCUDA counters (one process each)
    base = node_metrics(node_fixture["store"], NODE, agent)
    rec = XcudaStats(1, 1, True, False, 10, 1, 1000, 5.0, 1, 1, 1 << 30, 0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeAgentCollector(agent, NODE, base.gpus.values(), base.services, base.jobs,
                                    lambda jobs: {sid: [rec] for sid, _ in jobs}))
    texts.append(generate_latest(reg).decode())
    _history(store)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SchedulerCollector(store, now=lambda: NOW))
    texts.append(generate_latest(reg).decode())
    for text in texts:
        for fam in text_string_to_metric_families(text):
            names |= {s.name for s in fam.samples} | {fam.name}
    # a replica's series appear once it has a recorded minute: their names, from the collector's families
    from executors.node import metrics as node_metrics_module

    names |= set(re.findall(r'"(muxflow_service_[a-z_]+)"', Path(node_metrics_module.__file__).read_text()))
    names |= {n + "_total" for n in names if n.startswith("muxflow_service_") and n.endswith("_seconds")}
    return names


def test_the_dashboard_and_the_rules_read_only_exported_series(node, cluster_store) -> None:  # noqa: F811
    have = exported(node, cluster_store) | PROMETHEUS_OWN
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    exprs += [v["query"]["query"].split("(", 1)[1].split(",", 1)[0] for v in dash["templating"]["list"]]
    rules = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert len(exprs) > 20 and len(rules) == 14
    missing = {e: metric_names(e) - have for e in exprs + rules if metric_names(e) - have}
    assert not missing, missing
    assert metric_names('sum by (node) (increase(muxflow_gpu_evictions_total{node=~"a"}[1h])) > on (x) up') == {
        "muxflow_gpu_evictions_total", "up"}


def test_the_dashboard_is_a_grafana_import() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"] and dash["uid"] == "muxflow"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}" and t["expr"].strip(), p["title"]
    titles = {p["title"] for p in dash["panels"] if p["type"] == "row"}
    assert titles == {"Cluster", "Nodes and GPUs", "Offline jobs", "Online services"}
