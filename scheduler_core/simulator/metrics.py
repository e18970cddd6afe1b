"""The paper's metrics (§7.1, docs/DESIGN.md §9) from one simulation run, and the normalized comparison table.

Online latency. Each GPU-minute has a mean request latency (solo latency from
the service's load, times the sharing mechanism's slowdown) and a request rate.
Per-request latency inside a minute is taken as exponential around that mean
(an M/M/1 sojourn time), so the p99 over all requests is the 0.99 quantile of
the QPS-weighted mixture of exponentials. Online-only latency is the solo
latency under the *same* load (the online load does not depend on the policy),
so every run is normalized to Online-only within itself. ``shared_*`` restricts
both to the GPU-minutes where offline work ran (on the paper's testbed nearly
every GPU is shared; in a simulation with idle capacity most minutes are not).

Offline. JCT = completion − arrival (queueing included) over finished jobs;
``jct_censored_s`` also counts unfinished jobs up to the end of the run (a lower
bound on their JCT). Oversold GPU = Σ T_sep / Σ T_real (docs/DESIGN.md §9): solo time
of the useful work done over the wall time jobs held a GPU. Offline normalized
throughput = dedicated-GPU equivalents of the offline work per GPU, averaged
over the run. ``shortest_quarter``: the same JCT, and the wait to first start,
of the arrived jobs in the shortest quarter of solo duration (placing late costs
short jobs the most).
"""

from __future__ import annotations

import numpy as np

from scheduler_core.online.latency_model import P99_OF_MEAN
from scheduler_core.simulator.config import SimConfig
from scheduler_core.simulator.fleet import DONE, FUTURE


def mixture_p99(mean_ms: np.ndarray, weight: np.ndarray, q: float = 0.99, iters: int = 48) -> float:
    """Quantile ``q`` of a weighted mixture of exponentials with the given means (bisection on the survival)."""
    mean = np.asarray(mean_ms, dtype=np.float64).reshape(-1)
    w = np.asarray(weight, dtype=np.float64).reshape(-1)
    keep = (w > 0) & (mean > 0)
    if not keep.any():
        return float("nan")
    return float(mixture_p99_rows(mean[keep][None, :], w[keep][None, :], q, iters)[0])


def mixture_p99_rows(mean_ms: np.ndarray, weight: np.ndarray, q: float = 0.99, iters: int = 48) -> np.ndarray:
    """Quantile ``q`` of each row's weighted mixture of exponentials, (rows × replicas) arrays at once: bisection
    on the survival function (NaN for a row without requests; :func:`mixture_p99` is one row)."""
    mean = np.asarray(mean_ms, dtype=np.float64)
    w = np.where((mean > 0), np.asarray(weight, dtype=np.float64), 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    inv = 1.0 / np.where(mean > 0, mean, 1.0)
    target = 1.0 - q
    lo = np.zeros(mean.shape[0])
    hi = np.max(np.where(w > 0, mean, 0.0), axis=1) * -np.log(target) * 1.01
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        above = (w * np.exp(-mid[:, None] * inv)).sum(axis=1) > target
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return np.where(total[:, 0] > 0, 0.5 * (lo + hi), np.nan)


def slo_metrics(cfg: SimConfig, fleet, lat: np.ndarray, solo: np.ndarray, qps: np.ndarray) -> dict:
    """SLO violations per service-minute: minutes in which a service's p99 over all its replicas' requests
    exceeded its SLO, beside the same count with the replicas alone (Online-only, same load); and per
    replica-minute (a replica's own p99, mean · ln 100, over the SLO)."""
    per, n = {}, 0
    v = v0 = rv = rv0 = rn = 0
    for s, (spec, slo) in enumerate(zip(cfg.services, cfg.service_slos_ms())):
        if slo is None:
            continue
        idx = np.flatnonzero(fleet.service_index == s)
        p = mixture_p99_rows(lat[:, idx], qps[:, idx])
        p0 = mixture_p99_rows(solo[:, idx], qps[:, idx])
        sv, sv0 = int((p > slo).sum()), int((p0 > slo).sum())
        r = P99_OF_MEAN * lat[:, idx].astype(np.float64) > slo
        r0 = P99_OF_MEAN * solo[:, idx].astype(np.float64) > slo
        per[spec.name] = {"slo_p99_ms": slo, "service_minutes": int(p.size), "violations": sv,
                          "online_only_violations": sv0, "replica_minute_violation_frac": round(float(r.mean()), 5)}
        n, v, v0 = n + p.size, v + sv, v0 + sv0
        rv, rv0, rn = rv + int(r.sum()), rv0 + int(r0.sum()), rn + r.size
    if not n:
        return {"services_with_slo": 0}
    return {"services_with_slo": len(per), "service_minutes": n, "violations": v, "online_only_violations": v0,
            "violation_frac": round(v / n, 5), "online_only_violation_frac": round(v0 / n, 5),
            "replica_minute_violation_frac": round(rv / rn, 5),
            "online_only_replica_minute_violation_frac": round(rv0 / rn, 5), "per_service": per}


HARD_CAP = 0.3  # the per-minute safety net a service's users should never see passed (slowdown of the minute)


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den > 0 and np.isfinite(num) and np.isfinite(den) else None


def service_metrics(cfg: SimConfig, fleet, lat: np.ndarray, solo: np.ndarray, qps: np.ndarray,
                    cap: float = HARD_CAP) -> list[dict]:
    """What each service's users see over the day, one entry per service (SIMULATED).

    - ``all_avg_norm`` / ``all_p99_norm``: the mean and the p99 latency over all of the service's requests, shared
      or not, against the same requests with the replicas alone (request-weighted: each minute of each replica
      weighs its requests);
    - ``shared_avg_norm`` / ``shared_p99_norm``: the same over the replica-minutes that held offline work;
    - ``worst_minute_norm`` and ``minutes_over_cap``: the slowdown of a service-minute is the mean latency of that
      minute's requests against alone; minutes with requests over ``1 + cap`` are counted;
    - ``slo_attainment``: with a p99 SLO (ms), the share of service-minutes with requests whose p99 over all the
      service's requests was within it (None: no SLO); ``slo_attainment_alone`` the same with the replicas alone
      (an SLO the service misses alone is not sharing's doing), and ``slo_kept_where_alone_keeps`` the share of the
      minutes it keeps alone that it still keeps shared.
    """
    out = []
    slos = cfg.service_slos_ms()
    for s, spec in enumerate(cfg.services):
        idx = np.flatnonzero(fleet.service_index == s)
        if not idx.size:
            continue
        L, S = lat[:, idx].astype(np.float64), solo[:, idx].astype(np.float64)
        Q = qps[:, idx].astype(np.float64)
        minute_num, minute_den = (L * Q).sum(axis=1), (S * Q).sum(axis=1)
        active = minute_den > 0
        per_minute = np.divide(minute_num, minute_den, out=np.ones_like(minute_num), where=active)
        shared = L > S
        entry = {
            "name": spec.name, "family": spec.family, "replicas": int(idx.size),
            "all_avg_norm": _ratio(float(minute_num.sum()), float(minute_den.sum())),
            "all_p99_norm": _ratio(mixture_p99(L, Q), mixture_p99(S, Q)),
            "shared_minutes_frac": round(float(shared.mean()), 4),
            "shared_avg_norm": _ratio(float((L * Q)[shared].sum()), float((S * Q)[shared].sum())) if shared.any()
            else None,
            "shared_p99_norm": _ratio(mixture_p99(L[shared], Q[shared]), mixture_p99(S[shared], Q[shared]))
            if shared.any() else None,
            "worst_minute_norm": round(float(per_minute[active].max()), 4) if active.any() else None,
            "cap": cap,
            "minutes_over_cap": int((per_minute[active] > 1.0 + cap + 1e-9).sum()),
            "service_minutes": int(active.sum()),
            "slo_p99_ms": slos[s],
            "slo_attainment": None, "slo_attainment_alone": None, "slo_kept_where_alone_keeps": None,
        }
        if slos[s] is not None and active.any():
            p, p0 = mixture_p99_rows(L[active], Q[active]), mixture_p99_rows(S[active], Q[active])
            entry["slo_attainment"] = round(float((p <= slos[s]).mean()), 5)
            entry["slo_attainment_alone"] = round(float((p0 <= slos[s]).mean()), 5)
            met_alone = p0 <= slos[s]
            # What sharing costs: of the minutes the replicas alone keep the SLO, the share still kept.
            entry["slo_kept_where_alone_keeps"] = round(float((p[met_alone] <= slos[s]).mean()), 5) \
                if met_alone.any() else None
        out.append(entry)
    return out


def shortest_quarter(fleet, arrived: np.ndarray, censored: np.ndarray, end_s: float) -> dict:
    """The arrived jobs in the shortest quarter of solo duration (on the reference GPU): how long they took.

    ``jct_mean_s`` as ``jct_censored_s``; ``wait_p90_s``: the 90th percentile of the time from arrival to
    first start (a job never started counts to the end of the run). Short jobs are where placing late costs
    the most, relative to their length.
    """
    jobs = fleet.jobs
    solo = (jobs.total_steps / fleet.sps_ref[jobs.job_type])[arrived]
    limit = float(np.quantile(solo, 0.25, method="lower"))  # a job's own solo time
    short = solo <= limit
    first = np.where(np.isnan(fleet.first_start_s), end_s, fleet.first_start_s)[arrived]
    wait = first[short] - jobs.arrival_s[arrived][short]
    return {"jobs": int(short.sum()), "solo_s_max": round(limit, 2),
            "jct_mean_s": round(float(censored[short].mean()), 2),
            "wait_p90_s": round(float(np.quantile(wait, 0.9)), 2)}


def compute_metrics(cfg: SimConfig, fleet, rec, rounds: list[dict]) -> dict:
    lat, solo, qps = rec.lat, rec.solo, rec.qps
    wsum = float(qps.sum(dtype=np.float64))
    avg = float((lat.astype(np.float64) * qps).sum() / wsum)
    avg_solo = float((solo.astype(np.float64) * qps).sum() / wsum)
    p99 = mixture_p99(lat, qps)
    p99_solo = mixture_p99(solo, qps)
    # The services on GPU-minutes where offline work ran (the paper's testbed shares most GPUs).
    shared = lat > solo
    q_sh = np.where(shared, qps, 0.0).astype(np.float64)
    sh_w = float(q_sh.sum())
    if sh_w > 0:
        shared_avg = float((lat * q_sh).sum() / (solo * q_sh).sum())
        shared_p99 = mixture_p99(lat[shared], qps[shared]) / mixture_p99(solo[shared], qps[shared])
    else:
        shared_avg = shared_p99 = 1.0
    jobs = fleet.jobs
    end_s = cfg.minutes * 60.0
    arrived = fleet.state != FUTURE
    done = fleet.state == DONE
    jct = fleet.finish_s[done] - jobs.arrival_s[done]
    censored = np.where(done, fleet.finish_s, end_s)[arrived] - jobs.arrival_s[arrived]
    real = float(fleet.real_s.sum())
    sep = float(fleet.sep_s.sum())
    executions = int(fleet.executions.sum())
    evictions = int(fleet.evictions.sum())
    c = rec.cols
    planned = [r for r in rounds if "plan_s" in r]
    return {
        "simulated": True,
        "online": {
            "avg_latency_ms": round(avg, 4),
            "p99_latency_ms": round(p99, 4),
            "online_only_avg_latency_ms": round(avg_solo, 4),
            "online_only_p99_latency_ms": round(p99_solo, 4),
            "avg_latency_norm": round(avg / avg_solo, 4),
            "p99_latency_norm": round(p99 / p99_solo, 4),
            "shared_gpu_minutes_frac": round(float(shared.mean()), 4),
            "shared_avg_latency_norm": round(shared_avg, 4),
            "shared_p99_latency_norm": round(shared_p99, 4),
            "slo": slo_metrics(cfg, fleet, lat, solo, qps),
        },
        "services": service_metrics(cfg, fleet, lat, solo, qps),
        "offline": {
            "jobs": int(jobs.size),
            "arrived": int(arrived.sum()),
            "finished": int(done.sum()),
            "unfinished": int(arrived.sum() - done.sum()),
            "avg_jct_s": round(float(jct.mean()), 2) if jct.size else None,
            "jct_censored_s": round(float(censored.mean()), 2) if censored.size and executions else None,
            "makespan_s": round(float(fleet.finish_s[done].max() - jobs.arrival_s.min()), 2)
            if done.size and done.all() else None,
            "last_finish_s": round(float(np.nanmax(fleet.finish_s)), 2) if done.any() else None,
            "oversold_gpu": round(sep / real, 4) if real > 0 else 0.0,
            "norm_tput": round(float(c["offline_gpu_equiv"].mean()) / cfg.gpus, 4),
            "gpu_equivalents": round(float(c["offline_gpu_equiv"].mean()), 2),
            "executions": executions,
            "evictions": evictions,
            "eviction_rate": round(evictions / executions, 4) if executions else 0.0,
            "migrations": int(fleet.migrations.sum()),
            # GPU-minutes whose offline work the node's burst guard paced to xCUDA's floor (an online burst).
            "burst_paced_gpu_minutes": int(c["burst_paced"].sum()),
            "lost_steps_frac": round(float(fleet.lost_steps.sum() / jobs.total_steps.sum()), 6),
            "shortest_quarter": shortest_quarter(fleet, arrived, censored, end_s) if executions else None,
        },
        "cluster": {
            "gpu_util_pct": round(float(c["util"].mean()), 3),
            "sm_activity_pct": round(float(c["sm"].mean()), 3),
            "memory_pct": round(100.0 * float(c["mem"].mean()), 3),
            "online_only_gpu_util_pct": round(float(c["solo_util"].mean()), 3),
            "online_only_sm_activity_pct": round(float(c["solo_sm"].mean()), 3),
            "online_only_memory_pct": round(100.0 * float(c["solo_mem"].mean()), 3),
        },
        "rounds": {
            "count": len(rounds),
            "placements_mean": round(float(np.mean([r.get("placements", 0) for r in rounds])), 2) if rounds else 0,
            "plan_s_mean": round(float(np.mean([r["plan_s"] for r in planned])), 4) if planned else None,
            "plan_s_max": round(float(np.max([r["plan_s"] for r in planned])), 4) if planned else None,
            "certified_optimal": all(r.get("certified_optimal", True) for r in planned) if planned else None,
        },
    }


# Columns of the comparison table: Figures 11 and 13 normalize latency to Online-only and
# the offline metrics to MuxFlow.
def compare_table(results: dict[str, dict], reference: str = "muxflow") -> list[dict]:
    ref = results.get(reference)
    rows = []
    for name, m in results.items():
        on, off = m["online"], m["offline"]
        row = {
            "policy": name,
            "avg_latency_vs_online_only": on["avg_latency_norm"],
            "p99_latency_vs_online_only": on["p99_latency_norm"],
            "shared_avg_latency_vs_online_only": on["shared_avg_latency_norm"],
            "shared_p99_latency_vs_online_only": on["shared_p99_latency_norm"],
            "avg_jct_h": None if off["avg_jct_s"] is None else round(off["avg_jct_s"] / 3600.0, 3),
            "finished": off["finished"],
            "oversold_gpu": off["oversold_gpu"],
            "gpu_util_pct": m["cluster"]["gpu_util_pct"],
            "sm_activity_pct": m["cluster"]["sm_activity_pct"],
            "memory_pct": m["cluster"]["memory_pct"],
            "eviction_rate": off["eviction_rate"],
            "slo_violation_frac": on.get("slo", {}).get("violation_frac"),
        }
        if ref is not None and name != "online-only":
            rj, rc = ref["offline"]["jct_censored_s"], off["jct_censored_s"]
            row["jct_vs_muxflow"] = round(rc / rj, 3) if rj and rc else None
            ro = ref["offline"]["oversold_gpu"]
            row["oversold_vs_muxflow"] = round(off["oversold_gpu"] / ro, 3) if ro else None
        rows.append(row)
    return rows
