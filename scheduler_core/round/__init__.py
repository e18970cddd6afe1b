"""The scheduling round, in named steps.

1. **candidates** — the healthy GPUs with their forecast and the waiting or running jobs
   (:mod:`scheduler_core.domain`, built by the round runner);
2. **weigh** — each (GPU, job class) pair's share and predicted normalized throughput, and
   which pairs are feasible (``weights``; several jobs per GPU as ``slots``);
3. **assign** — the certified maximum-weight matching (:mod:`scheduler_core.matching`);
4. **plan** — start, keep, migrate or evict against what runs now (``plan``: ``plan_round``);
5. **check** — every constraint re-derived from the round's snapshot (``check``).

``clock`` cuts time into the rounds' windows; ``dense`` is the every-pair reference the tests
hold the round to.
"""
