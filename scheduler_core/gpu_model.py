"""Device metrics of a GPU shared by an online service and an offline job (the simulated GPU).

One model for every simulated path: the per-GPU simulated cluster behind the
Dagster pipeline (:mod:`executors.simulated.cluster`) and the vectorized
trace-driven simulator (:mod:`scheduler_core.simulator`) both call these, on
scalars or on arrays of GPUs.
"""

from __future__ import annotations

import numpy as np


def shared_metrics(
    on_util_pct, on_sm_pct, on_mem_bytes, on_bw_pct,
    off_mem_bytes, off_sm_used_frac, off_mem_bw, duty, norm_tput,
):
    """GPU util %, SM activity %, memory bytes and memory-bandwidth % with the offline job running.

    ``off_sm_used_frac`` is the SM fraction the job can use under its MPS share
    (min(share, its own need)); ``duty`` the fraction of the minute it ran (start-up
    and restarts excluded); ``norm_tput`` its normalized throughput.
    """
    util = 100.0 * (1.0 - (1.0 - np.asarray(on_util_pct) / 100.0)
                    * (1.0 - 0.95 * duty * np.minimum(1.0, norm_tput / 0.6)))
    sm = np.minimum(100.0, on_sm_pct + 100.0 * off_sm_used_frac * duty * (0.6 + 0.4 * norm_tput))
    mem = on_mem_bytes + off_mem_bytes
    bw = np.minimum(100.0, on_bw_pct + 100.0 * off_mem_bw * duty * norm_tput)
    return util, sm, mem, bw


def clock_frac(sm_activity_pct, clock_drop_frac):
    """SM clock as a fraction of its maximum: power-capped cards sag above 40 % SM activity."""
    return 1.0 - clock_drop_frac * np.maximum(0.0, (np.asarray(sm_activity_pct) / 100.0 - 0.4) / 0.6)
