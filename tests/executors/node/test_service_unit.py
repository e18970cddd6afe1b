"""The example systemd unit starts the agent with options the agent has (a renamed or removed option would make
the unit fail at boot, on every node)."""

from __future__ import annotations

import re
from pathlib import Path

from pipelines.cli.node import node_agent

UNIT = Path(__file__).resolve().parents[3] / "executors" / "node" / "muxflow-node-agent.service"


def test_the_units_options_are_the_agents() -> None:
    [exec_start] = [line for line in UNIT.read_text().splitlines() if line.startswith("ExecStart=")]
    used = set(re.findall(r"(?<=\s)--[a-z][a-z-]*", exec_start))
    known = {opt for p in node_agent.params for opt in getattr(p, "opts", ())}
    assert used and used <= known, sorted(used - known)
    # what keeps the root agent's inputs its own: the trusted pipe root, the installed library, the notices
    assert {"--mps-pipe-root", "--xcuda-lib", "--notice-dir", "--metrics-host", "--web-config-file"} <= used
