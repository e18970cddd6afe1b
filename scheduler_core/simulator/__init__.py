"""Trace-driven cluster simulator (paper §7.1, §7.3, §7.4; docs/DESIGN.md §9).

``run_simulation(trace, inputs, config, policy)`` plays a Philly-format
offline trace against a fleet of simulated GPUs whose online services follow
daily request cycles, and returns the paper's metrics. Every 15 simulated
minutes the policy plans a round; the MuxFlow family plans it with the
production round code (:func:`scheduler_core.round.plan.plan_round`) on candidates
built from what the simulated GPU monitors observed, and the plan is carried
out by the simulated executor (:mod:`scheduler_core.simulator.fleet`).
Everything it reports is simulated.
"""

from scheduler_core.simulator.config import ServiceSpec, SharingParams, SimConfig
from scheduler_core.simulator.engine import SimInputs, SimResult, run_simulation
from scheduler_core.simulator.policies import POLICIES, Policy, get_policy

__all__ = [
    "POLICIES", "Policy", "ServiceSpec", "SharingParams", "SimConfig", "SimInputs", "SimResult", "get_policy",
    "run_simulation",
]
