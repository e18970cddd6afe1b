"""`muxflow calibrate`: the interference model's measurements, errors and refit (docs/CALIBRATION.md).

    muxflow calibrate report [--data FILE ...] [--json]
    muxflow calibrate refit --data FILE [--types t4,a10,a100,h100] [--no-predictors] [--json]
    muxflow calibrate check FILE
    muxflow calibrate convert-gavel IN OUT
    muxflow calibrate from-harness REPORT... [--gpu-type T] [--gpu-model M] [--driver D] [--date D] -o OUT
    muxflow calibrate service-model FILE [--calibration transfer] [--json]

Measured pairs are real (the bundled Gavel K80/P100 data, or a site's own file); the predictors'
samples are SIMULATED from the calibrated model.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import click

from pipelines.cli.common import HELP, CliError


def _guarded(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):

        try:
            return fn(*args, **kwargs)
        except (ValueError, KeyError) as exc:  # MeasurementError is a ValueError
            raise CliError(str(exc.args[0] if isinstance(exc, KeyError) else exc)) from exc

    return wrapper


@click.group("calibrate", context_settings=HELP)
def calibrate() -> None:
    """The interference model: measured co-location samples, its errors, refit from a site's file."""


def _pct(v: float) -> str:
    return "-" if v != v else f"{100 * v:.1f}%"


def _cov(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def format_model_errors(e: dict) -> str:
    lines = [f"measured types: {', '.join(e['measured_types'])} (stressor {e['stressor']!r}; "
             f"{'; '.join(e['sources'])})",
             "leave one GPU type out, trained on every subset of the other types (MAPE, MAE of normalized "
             "throughput; cover = share of the test type's pairs inside the 80% interval built from the other "
             "held-out types; pairs with the stressor are probes, not scored):",
             f"  {'train -> test':<22} {'pairs':>5}  {'constant':>13}  {'before: per-job':>15}  "
             f"{'after: transfer':>15} {'cover':>5}  {'zero-shot':>13} {'cover':>5}"]
    for r in e["leave_one_type_out_subsets"]:
        cells = [f"{_pct(r[k]['mape'])} {r[k]['mae']:.3f}" for k in ("constant", "before", "after", "zero_shot")]
        lines.append(f"  {','.join(r['train']) + ' -> ' + r['test']:<22} {r['after']['pairs']:>5}  {cells[0]:>13}  "
                     f"{cells[1]:>15}  {cells[2]:>15} {_cov(r['after']['coverage_80']):>5}  {cells[3]:>13} "
                     f"{_cov(r['zero_shot']['coverage_80']):>5}")
    lines.append("within type (20% of unordered pairs held out, seed 0):")
    lines.append(f"  {'type':<22} {'pairs':>5}  {'constant':>13}  {'before: per-job':>15}  {'after: transfer':>15}  "
                 f"{'+ residuals':>15}")
    for r in e["within_type"]:
        cells = [f"{_pct(r[k]['mape'])} {r[k]['mae']:.3f}" for k in ("constant", "before", "after", "refined")]
        lines.append(f"  {r['gpu_type']:<22} {r['after']['pairs']:>5}  {cells[0]:>13}  "
                     + "  ".join(f"{c:>15}" for c in cells[1:]))
    for which, label in (("after", "measured profiles"), ("zero_shot", "zero-shot")):
        iv = e["intervals"].get(which)
        if iv is None:
            lines.append(f"80% interval, {label}: none (needs two measured GPU types)")
        else:
            lines.append(f"80% interval, {label}: log-odds {iv['log_odds_lo']:+.3f} .. {iv['log_odds_hi']:+.3f} "
                         f"from {iv['residuals']} held-out pairs of {', '.join(iv['from_types'])}; sigma and pi "
                         f"x{iv['factor_optimistic']:.3f} (optimistic) / x{iv['factor_pessimistic']:.3f} (pessimistic)")
    return "\n".join(lines)


def format_predictors(name: str, cells: list[dict]) -> str:
    from executors.simulated.refit import diagonal_and_off

    types = list(dict.fromkeys(c["train"] for c in cells))
    by = {(c["train"], c["test"]): c for c in cells}
    diag, off = diagonal_and_off(cells)
    lines = [f"predictors, {name}: MAE of normalized throughput (slowdown), rows trained on, columns tested on "
             f"(SIMULATED samples); mean {diag:.3f} on the trained type, {off:.3f} on the others"]
    lines.append("  " + f"{'':<6}" + "".join(f"{t:>22}" for t in types))
    for g in types:
        row = []
        for h in types:
            c = by[(g, h)]
            acc = "" if c["accepted"] >= 0.999 else f" [{c['accepted']:.0%}]"
            row.append(f"{c['mae_tput']:.3f} ({c['mae_slowdown']:.3f}){acc}")
        lines.append("  " + f"{g:<6}" + "".join(f"{v:>22}" for v in row))
    return "\n".join(lines)


@calibrate.command("report", context_settings=HELP)
@click.option("--data", "files", multiple=True, type=click.Path(dir_okay=False),
              help="Measurement files to add to the installed ones (bundled Gavel + MUXFLOW_MEASUREMENTS).")
@click.option("--json", "as_json", is_flag=True)
@_guarded
def report(files, as_json) -> None:
    """Errors of the per-job fit and the transferable model on the measured pairs."""
    from executors.data.calibration import Calibrator, installed_calibrator
    from executors.data.measurements import load_file
    from executors.simulated.refit import model_errors

    c = installed_calibrator()
    if files:
        mset = c.mset
        for f in files:
            mset = mset.merged(load_file(f))
        c = Calibrator(mset)
    e = model_errors(c)
    click.echo(json.dumps(e, indent=2) if as_json else format_model_errors(e))


@calibrate.command("refit", context_settings=HELP)
@click.option("--data", "files", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="A muxflow.colocation/1 file (or Gavel's layout); repeat for several.")
@click.option("--types", "types_text", default=None,
              help="Simulated GPU types to train predictors for [default: t4,a10,a100,h100].")
@click.option("--samples", type=click.IntRange(min=100), default=2000, show_default=True,
              help="Simulated co-location samples per predictor.")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="Predictor training epochs [default: the network's: 400 for the MLP, 250 for the factorized one].")
@click.option("--no-predictors", is_flag=True, help="Refit the interference model only.")
@click.option("--json", "as_json", is_flag=True)
@_guarded
def refit(files, types_text, samples, epochs, no_predictors, as_json) -> None:
    """Refit the interference model and the predictors with FILE added; print the errors before and after."""
    from executors.data.measurements import ENV_VAR
    from executors.simulated.refit import refit_report
    from scheduler_core.gpu_specs import GPU_SPECS

    types = [t.strip().lower() for t in types_text.split(",") if t.strip()] if types_text else None
    for t in types or []:
        if t not in GPU_SPECS:
            raise CliError(f"types: unknown GPU type {t!r} (known: {', '.join(sorted(GPU_SPECS))})")
    rep = refit_report(list(files), types, samples, epochs, with_predictors=not no_predictors)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    click.echo("BEFORE (installed measurements)")
    click.echo(format_model_errors(rep["before"]))
    click.echo("")
    click.echo(f"AFTER (with {', '.join(rep['files'])})")
    click.echo(format_model_errors(rep["after"]))
    click.echo("")
    click.echo("on the file's own pairs (installed model with the file's profiles -> refit model):")
    for g in rep["file_types"]:
        a, b = rep["on_file_pairs"]["installed"][g], rep["on_file_pairs"]["refit"][g]
        click.echo(f"  {g}: {a['pairs']} pairs, MAPE {_pct(a['mape'])} -> {_pct(b['mape'])}, "
                   f"MAE {a['mae']:.3f} -> {b['mae']:.3f}")
    for name, cells in rep.get("predictors", {}).items():
        click.echo("")
        click.echo(format_predictors(name, cells))
    click.echo("")
    if rep["same_measurements"]:
        click.echo("the file adds nothing the installed measurements lack; nothing to install")
    else:
        paths = os.pathsep.join(str(Path(f).resolve()) for f in rep["files"])
        current = os.environ.get(ENV_VAR)
        click.echo(f"to use it everywhere (simulator, pipeline, predictors' samples): "
                   f"export {ENV_VAR}={paths + (os.pathsep + current if current else '')}")


@calibrate.command("check", context_settings=HELP)
@click.argument("path", type=click.Path(dir_okay=False))
@_guarded
def check(path) -> None:
    """Validate a measurement file and summarise it, then check it can be used.

    Used means as ``calibrate refit`` and MUXFLOW_MEASUREMENTS use it: merged with the installed
    measurements, every GPU type's speed known, the interference model fitted, and each of the
    file's types given a profile for every job."""
    from executors.data.calibration import Calibrator, installed_calibrator
    from executors.data.measurements import load_file

    m = load_file(path)
    click.echo(f"{path}: stressor {m.stressor!r}")
    for g, t in sorted(m.types.items()):
        probes = sum(1 for p in t.pairs if m.stressor in (p.workload, p.partner))
        click.echo(f"  {g}: {t.meta.gpu_model}, driver {t.meta.driver}, method {t.meta.method}, {t.meta.date}: "
                   f"{len(t.solo_steps_per_s)} solo runs, {len(t.pairs)} pair measurements ({probes} with the "
                   f"stressor), counters for {len(t.counters)} jobs")
    for g in sorted({p.gpu_type for p in m.service_points}):
        pts = [p for p in m.service_points if p.gpu_type == g]
        meta, usable = pts[0].meta, sum(p.usable for p in pts)
        click.echo(f"  {g}: {meta.gpu_model}, driver {meta.driver}, method {meta.method}, {meta.date}: "
                   f"{len(pts)} service points ({usable} usable, {len(pts) - usable} kept out); not pairs: the "
                   f"interference model does not fit on them (`muxflow calibrate service-model` compares)")
    merged = Calibrator(installed_calibrator().mset.merged(m))
    model = merged.transfer_model()
    for g in sorted(m.types):
        merged.type_profiles(g)
    click.echo(f"usable: with the installed measurements ({', '.join(merged.measured_types())}) the interference "
               f"model fits on {model.submodels[-1].n_pairs} pairs")


@calibrate.command("convert-gavel", context_settings=HELP)
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False, writable=True))
@_guarded
def convert_gavel(src, dst) -> None:
    """Write Gavel's layout as a muxflow.colocation/1 file (then edit gpus.*: model, driver, method, date)."""
    from executors.data.measurements import load_file, to_document

    doc = to_document(load_file(src))
    Path(dst).write_text(json.dumps(doc, indent=1) + "\n")
    click.echo(f"{dst}: {len(doc['solo'])} solo runs, {len(doc['pairs'])} pair rows, types {', '.join(doc['gpus'])}")


def _workload_note(text: str) -> tuple[str, str]:
    label, sep, note = text.partition("=")
    if not sep or not label.strip() or not note.strip():
        raise CliError(f"workload-note: expected JOB_TYPE=TEXT, got {text!r}")
    return label.strip(), note.strip()


@calibrate.command("from-harness", context_settings=HELP)
@click.argument("reports", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The muxflow.colocation/1 file to write.")
@click.option("--gpu-type", default=None,
              help="The GPU type key [default: the type of the reports' device, else their label].")
@click.option("--gpu-model", default=None, help="[default: from the reports' device].")
@click.option("--driver", default=None, help="[default: from the reports' device].")
@click.option("--date", default=None, help="YYYY-MM-DD [default: the first report's start, UTC].")
@click.option("--method", default=None, help="mps | no-mps | unknown [default: the reports'].")
@click.option("--noise", type=click.FloatRange(0.0, 1.0), default=None,
              help="Relative noise of a slowdown where a report cannot measure it [default: 0.10].")
@click.option("--min-service-util", type=click.FloatRange(0.0, 100.0), default=None,
              help="Solo GPU utilization (%) under which a service is not GPU-bound [default: 30].")
@click.option("--workload-note", "workload_notes", multiple=True,
              help="JOB_TYPE=TEXT: a caveat on every point whose job or service stands for JOB_TYPE (repeatable).")
@click.option("--caveat", "caveats", multiple=True, help="A caveat on the whole file (repeatable).")
@_guarded
def from_harness(reports, out, gpu_type, gpu_model, driver, date, method, noise, min_service_util, workload_notes,
                 caveats) -> None:
    """Convert co-location harness reports (or the GPU suite's printed output) to a muxflow.colocation/1 file.

    Each measured point becomes a service point with its caveats (window, repetitions, baseline, noise) and
    its verdict: kept out of the samples, with the reasons, when its run failed, the service was not
    GPU-bound, or it ran faster beside the job than alone by more than the noise."""
    from executors.data.harness_reports import DEFAULT_NOISE, MIN_SERVICE_UTIL_PCT, convert, load_report

    notes = dict(_workload_note(t) for t in workload_notes)
    doc = convert([(r, load_report(r)) for r in reports], gpu_type=gpu_type, gpu_model=gpu_model, driver=driver,
                  date=date, method=method, noise=DEFAULT_NOISE if noise is None else noise,
                  min_service_util_pct=MIN_SERVICE_UTIL_PCT if min_service_util is None else min_service_util,
                  workload_notes=notes, caveats=list(caveats))
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    pts = doc["service_points"]
    usable = sum(p["usable"] for p in pts)
    click.echo(f"{out}: {', '.join(doc['gpus'])}: {len(pts)} service points, {usable} usable, "
               f"{len(pts) - usable} kept out")
    for p in pts:
        if not p["usable"]:
            click.echo(f"  kept out: {p['source']} {p['service']} + {p['job_type']} at {p['sm_pct']:g} %: "
                       f"{p['reasons'][0]}")


@calibrate.command("service-model", context_settings=HELP)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--calibration", default="transfer", show_default=True,
              help="Which calibration's traits the simulated GPU uses (muxflow simulate --calibration).")
@click.option("--json", "as_json", is_flag=True)
@_guarded
def service_model(path, calibration, as_json) -> None:
    """The simulated GPU against a file's service points: job throughput and online slowdown, measured and modelled."""
    from executors.data.measurements import load_file
    from executors.data.service_model import compare, markdown

    points = load_file(path).service_points
    if not points:
        raise CliError(f"{path}: no service points to compare")
    rows = compare(points, calibration)
    click.echo(json.dumps(rows, indent=1) if as_json else markdown(rows))
