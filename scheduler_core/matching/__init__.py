"""Matching: which offline job goes to which GPU slot, with a proof that no better matching exists.

The one entry is :func:`scheduler_core.matching.assignment.solve`, on a
:class:`~scheduler_core.matching.grouped_weights.GroupedWeights` problem (weights stored per job
class): an exact maximum-weight matching as a transportation LP (HiGHS), or, when every job is
its own class, as a min-cost flow on each job's best arcs (``sparse``); both are certified by
LP duality (``certificate``). ``dense`` is the every-pair Kuhn–Munkres reference and the
fallback; ``first_fit`` the greedy placement the baselines use.

Change the matching algorithm here; what a pair is worth is the round's business
(:mod:`scheduler_core.round.weights`).
"""
