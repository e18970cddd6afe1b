"""The simulated GPU at measured service points: measured against modelled, point by point.

For each service point of a measurement set (an online service at a request rate and an offline job at
an MPS SM share, :class:`executors.data.measurements.ServicePoint`), the simulated GPU's numbers for the
same situation, computed as the simulated profiler computes them (:mod:`executors.simulated.profiling`):
the service's load is its QPS over its family's capacity on the GPU type, the traits are the catalog's on
that type (``catalog_for(calibration, gpu_type)``), and :func:`scheduler_core.interference.pairs.colocate`
gives the job's normalized throughput and the service's latency slowdown (one factor for the average and
the p99).

A second model column, *measured inputs*, feeds the same formula what the run measured about the two
workloads instead of what their labels say: the job's traits from its solo profile (SM activity, memory
bandwidth: :func:`scheduler_core.interference.gpu_model.traits_from_profile`, as the simulator does for a
job whose type it does not know) and the service's load from its measured busy fraction alone (the share
of the time it was serving: a single-server queue's utilization, what the model's load is). Where the
labels are wrong (a reference model heavier than the job type it stands for), the first column models a
different situation; the second isolates the interference formula's own error.
"""

from __future__ import annotations

from collections.abc import Iterable

from executors.data.measurements import ServicePoint
from scheduler_core.gpu_specs import GPU_SPECS, get_spec
from scheduler_core.interference.gpu_model import traits_from_profile
from scheduler_core.interference.pairs import colocate
from scheduler_core.online.load import capacity_qps, load_at
from scheduler_core.workloads import ONLINE_FAMILIES


def _pair(online, load: float, offline, sm_pct: float) -> dict:
    tput, slow = colocate(online, load, offline, sm_pct)
    return {"norm_tput": round(float(tput), 4), "slowdown": round(float(slow), 4)}


def compare(points: Iterable[ServicePoint], calibration: str = "transfer") -> list[dict]:
    """One row per point: where it comes from, the load, the verdict, measured and modelled values."""
    from executors.data.calibration import catalog_for

    rows = []
    for p in points:
        if p.gpu_type not in GPU_SPECS:
            raise ValueError(f"{p.gpu_type}: no GPU spec to model it with (known: {', '.join(sorted(GPU_SPECS))})")
        if p.service not in ONLINE_FAMILIES:
            raise ValueError(f"{p.service}: not an online family of the model ({', '.join(ONLINE_FAMILIES)})")
        cat = catalog_for(calibration, p.gpu_type)
        load = float(load_at(p.qps, capacity_qps(ONLINE_FAMILIES[p.service], get_spec(p.gpu_type))))
        online, job = cat.online[p.service], cat.offline_workload(p.job_type).traits
        model = _pair(online, load, job, p.sm_pct)
        solo = p.row.get("job_solo") or {}
        busy = p.row.get("service_busy_frac")
        inputs = []
        if solo.get("sm_activity_pct") is not None and solo.get("mem_bw_util_pct") is not None:
            job = traits_from_profile(solo["sm_activity_pct"], solo["mem_bw_util_pct"], cat)
            inputs.append("job profile")
        if busy is not None:
            inputs.append("service busy fraction")
        measured_load = load if busy is None else float(busy)
        rows.append({"source": p.row.get("source", ""), "gpu_type": p.gpu_type, "service": p.service, "qps": p.qps,
                     "load": round(load, 4), "measured_load": round(measured_load, 4), "job_type": p.job_type,
                     "sm_pct": p.sm_pct, "usable": p.usable,
                     "measured": {"norm_tput": p.norm_tput, "slowdown_avg": p.slowdown_avg,
                                  "slowdown_p99": p.slowdown_p99},
                     "model": model,
                     "model_measured_inputs": _pair(online, measured_load, job, p.sm_pct) if inputs else None,
                     "measured_inputs": inputs, "calibration": calibration})
    return rows


def _x(v: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table: measured, the model as the simulator runs it, the model on measured inputs."""
    out = ["| run | service, QPS | load: model / measured | job | SM % | usable | job norm_tput: measured / model / "
           "measured inputs | online slowdown: measured avg / p99 | model / measured inputs |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, mo, mi = r["measured"], r["model"], r["model_measured_inputs"] or {}
        measured_load = r["measured_load"] if "service busy fraction" in r["measured_inputs"] else None
        out.append(
            f"| {r['source']} | {r['service']}, {r['qps']:g} | {r['load']:.2f} / {_x(measured_load)} | {r['job_type']} "
            f"| {r['sm_pct']:g} | {'yes' if r['usable'] else 'no'} | {_x(m['norm_tput'])} / {_x(mo['norm_tput'])} / "
            f"{_x(mi.get('norm_tput'))} | x{_x(m['slowdown_avg'])} / x{_x(m['slowdown_p99'])} | "
            f"x{_x(mo['slowdown'])} / x{_x(mi.get('slowdown'))} |")
    return "\n".join(out)
