"""``muxflow simulate evaluation``: the evaluation's comparisons and its targets tables, from one command.

    muxflow simulate evaluation --traces DIR [--trace NAME ...] [--sizes 1000,200] [--jobs-at 200=2000]
                                [--slo-scale 1.5] [--sensitivity] [--out docs/evaluation/current/targets]
                                [--doc docs/EVALUATION.md]

For every trace (``DIR/*.trace``, or the ``--trace`` names in it) and cluster size, one ``simulate compare`` of
MuxFlow and the baselines, its ``results.json`` under ``OUT/<trace>-<gpus>/``. Then the targets
(``scheduler_core.simulator.targets``) are judged on every ``results.json`` under ``OUT`` — the runs of this call
and of earlier ones, so a long evaluation can be run a trace at a time — written to ``OUT/targets.json`` and
``OUT/TARGETS.md``, and, with ``--doc``, between the ``<!-- targets:begin -->`` and ``<!-- targets:end -->``
lines of that page. With ``--sensitivity`` each comparison is rerun under every calibration of the interference
model's interval (``simulate compare --sensitivity``: ``sensitivity.json`` beside ``results.json``), and the
conclusions that hold under all of them, per trace and size, go to ``OUT/SENSITIVITY.md`` and between the page's
``<!-- sensitivity:begin -->`` and ``<!-- sensitivity:end -->`` lines. ``--tables-only`` rebuilds the tables
without running anything. Every figure is SIMULATED.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from pipelines.cli.common import BUDGET, HELP, CliError, int_list, writable_dir
from pipelines.cli.simulate import _guarded, compare
from scheduler_core.simulator.targets import judge, markdown, sensitivity_markdown

BEGIN, END = "<!-- targets:begin -->", "<!-- targets:end -->"
SENS_BEGIN, SENS_END = "<!-- sensitivity:begin -->", "<!-- sensitivity:end -->"
POLICIES = "muxflow,salus,pb-time-sharing,time-sharing"


def _jobs_at(text: str) -> dict[int, int]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        gpus, sep, jobs = part.partition("=")
        if not sep or not gpus.isdigit() or not jobs.isdigit() or int(jobs) < 1:
            raise CliError(f"jobs-at: expected GPUS=JOBS pairs, e.g. 200=2000, got {part!r}")
        out[int(gpus)] = int(jobs)
    return out


def _traces(folder: Path | None, names: tuple[str, ...]) -> list[Path]:
    if folder is None:
        if names:
            raise CliError("trace: give --traces, the folder the names are in")
        return []
    if not folder.is_dir():
        raise CliError(f"traces: {folder} is not a folder")
    if names:
        paths = [folder / (n if n.endswith(".trace") else f"{n}.trace") for n in names]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise CliError(f"trace: not found: {', '.join(missing)}")
        return paths
    paths = sorted(folder.glob("*.trace"))
    if not paths:
        raise CliError(f"traces: no *.trace file in {folder}")
    return paths


def rebuild(out: Path, doc_page: Path | None) -> list[dict]:
    """Judge every ``results.json`` under ``out``; write ``targets.json``, ``TARGETS.md`` and the page's section."""
    judged = []
    for path in sorted(out.glob("*/results.json")):
        try:
            judged.append(judge(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"results: {path} is not a usable `simulate compare` results.json ({exc})") from exc
    judged.sort(key=lambda j: (-(j["gpus"] or 0), str(j["trace"])))
    table = markdown(judged)
    (out / "targets.json").write_text(json.dumps({"simulated": True, "runs": judged}, indent=2) + "\n")
    (out / "TARGETS.md").write_text("# Targets (SIMULATED)\n\n" + table + "\n")
    sens = []
    for path in sorted(out.glob("*/sensitivity.json")):
        try:
            doc = json.loads(path.read_text())
            sens.append({"trace": doc["trace"], "config": {"gpus": doc["config"]["gpus"]}, "matrix": doc["matrix"]})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"sensitivity: {path} is not a usable `simulate compare --sensitivity` output "
                           f"({exc})") from exc
    sens_table = sensitivity_markdown(sens)
    if sens_table:
        (out / "SENSITIVITY.md").write_text("# Conclusions under every calibration (SIMULATED)\n\n" + sens_table
                                            + "\n")
    if doc_page is not None:
        text = _replace_between(doc_page, doc_page.read_text(), BEGIN, END, table)
        if sens_table and SENS_BEGIN in text:
            text = _replace_between(doc_page, text, SENS_BEGIN, SENS_END, sens_table)
        doc_page.write_text(text)
    return judged


def _replace_between(page: Path, text: str, begin: str, end: str, body: str) -> str:
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise CliError(f"doc: {page} needs one {begin} line before one {end} line")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


@click.command("evaluation", context_settings=HELP)
@click.option("--traces", "folder", type=click.Path(path_type=Path), default=None,
              help="Folder of Philly-format traces (philly_vc_<vc>.trace).")
@click.option("--trace", "names", multiple=True, help="Only these traces of --traces (repeatable): a sharded run.")
@click.option("--sizes", default="1000,200", show_default=True, help="Cluster sizes (GPUs), comma-separated.")
@click.option("--jobs-at", "jobs_text", default="200=2000", show_default=True,
              help="Jobs per size, GPUS=JOBS pairs; other sizes take the trace's single-GPU jobs as they are.")
@click.option("--hours", type=click.FloatRange(min=0.25, max=24 * 7), default=24.0, show_default=True)
@click.option("--slo-scale", type=click.FloatRange(min=0.0, min_open=True), default=1.5, show_default=True,
              help="Each service's p99 SLO, in times its p99 alone at its daily peak.")
@click.option("--slowdown-allowance", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Every service's per-minute slowdown allowance [default: the services' own].")
@click.option("--slowdown-budget", type=BUDGET, default=None,
              help="Every service's slowdown budget over its requests; 'none': the flat allowance on every minute "
                   "[default: the services' own].")
@click.option("--max-jobs-per-gpu", type=click.IntRange(min=1, max=8), default=None,
              help="Offline jobs a MuxFlow round may put on one GPU [default: the simulator's, 1].")
@click.option("--burst-guard/--no-burst-guard", default=True, show_default=True,
              help="MuxFlow's node agents pause a GPU's offline work while its replica is in a burst over its SLO.")
@click.option("--policies", default=POLICIES, show_default=True, help="MuxFlow and the baselines it is judged against.")
@click.option("--calibration", default="transfer", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/evaluation/current/targets"), show_default=True)
@click.option("--doc", "doc_page", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A page whose targets section (between the marker lines) is replaced by the tables.")
@click.option("--sensitivity", is_flag=True,
              help="Rerun each comparison under every calibration of the interference model's interval and table "
                   "the conclusions that hold under all (about three times the run time).")
@click.option("--tables-only", is_flag=True, help="Rebuild the tables from the results under --out; run nothing.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@_guarded
def evaluation(folder, names, sizes, jobs_text, hours, slo_scale, slowdown_allowance, slowdown_budget,
               max_jobs_per_gpu, burst_guard, policies, calibration, out_dir, doc_page, sensitivity, tables_only, quiet) -> None:
    """Run the evaluation (every trace × size) and judge its targets (SIMULATED)."""
    sizes_, jobs_at = int_list(sizes, "sizes", 1), _jobs_at(jobs_text)
    traces = [] if tables_only else _traces(folder, names)
    if not tables_only and not traces:
        raise CliError("traces: give --traces DIR (or --tables-only)")
    out = writable_dir(out_dir, "out")
    if doc_page is not None and not doc_page.is_file():
        raise CliError(f"doc: {doc_page} is not a file")
    t0 = time.perf_counter()
    for trace in traces:
        for gpus in sizes_:
            args = ["--trace", str(trace), "--gpus", str(gpus), "--hours", str(hours), "--slo-scale", str(slo_scale),
                    "--policies", policies, "--calibration", calibration,
                    "--out", str(out / f"{trace.stem}-{gpus}")]
            if gpus in jobs_at:
                args += ["--jobs", str(jobs_at[gpus])]
            for flag, value in (("--slowdown-allowance", slowdown_allowance), ("--slowdown-budget", slowdown_budget),
                                ("--max-jobs-per-gpu", max_jobs_per_gpu)):
                if value is not None:
                    args += [flag, str(value)]
            if not burst_guard:
                args.append("--no-burst-guard")
            if quiet:
                args.append("--quiet")
            if sensitivity:
                args.append("--sensitivity")
            click.echo(f"== {trace.name}, {gpus} GPUs", err=True)
            started = time.perf_counter()
            compare.main(args, standalone_mode=False)
            click.echo(f"   {time.perf_counter() - started:.0f} s", err=True)
    judged = rebuild(out, doc_page)
    click.echo("")
    click.echo(markdown(judged))
    click.echo(f"\n{len(judged)} comparisons judged (SIMULATED); {len(traces) * len(sizes_)} run now in "
               f"{time.perf_counter() - t0:.0f} s; tables in {out / 'TARGETS.md'}"
               + (f" and {doc_page}" if doc_page else ""))
