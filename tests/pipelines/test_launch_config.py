"""Whoever reaches the Dagster UI can launch runs with a run config of their own: no run config may change where
MuxFlow sends its credentials, which store it writes, which cluster it drives or where it writes files.

Attack: a run of ``profile_job``, ``round_job`` or ``refresh_job`` launched with
``{"resources": {"cluster": {"config": {"slurm_url": <the attacker's address>, "slurm_jwt_file": <the plan key>}}}}``
would send MuxFlow's Slurm token (or the plan key, read as a token) to the attacker. Dagster's own validation must
refuse it before the run starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInvalidConfigError, validate_run_config

from pipelines.definitions import build_definitions
from pipelines.settings import MuxflowSettings

# A value of the field's own type, so that only the field's being configurable decides.
_SAMPLE = {str: "http://127.0.0.1:18080", int: 7, float: 0.5, bool: True, dict: {"profile_dir": "/tmp/x"}}


def _slurm_settings(tmp_path: Path) -> MuxflowSettings:
    return MuxflowSettings(db_url=f"sqlite:///{tmp_path / 'x.db'}", cluster="slurm", slurm_url="http://ctl:6820",
                           slurm_jwt_file=str(tmp_path / "jwt"), slurm_plan_key_file=str(tmp_path / "plan.key"),
                           report_dir=str(tmp_path / "report"))


def _fields(defs) -> list[tuple[str, str, object]]:
    """Every (resource key, field, sample value) of the deployment's configurable resources."""
    out = []
    for key, rdef in defs.resources.items():
        res = getattr(rdef, "fixed_value", None)
        assert res is not None or key == "now", f"resource {key!r} is not fixed by the deployment"
        if res is None:
            continue
        for name, info in type(res).model_fields.items():
            ann = info.annotation
            sample = next((v for t, v in _SAMPLE.items() if ann is t or str(ann).startswith(t.__name__)
                           or (t is str and "str" in str(ann))), "x")
            out.append((key, name, sample))
    return out


@pytest.mark.parametrize("job_name", ["profile_job", "round_job", "refresh_job", "requeue_job", "fill_job"])
def test_the_credential_redirect_from_the_ui_is_refused(tmp_path: Path, job_name: str) -> None:
    defs = build_definitions(_slurm_settings(tmp_path))
    job = defs.resolve_job_def(job_name)
    attack = {"resources": {"cluster": {"config": {"slurm_url": "http://127.0.0.1:18080",
                                                   "slurm_jwt_file": str(tmp_path / "plan.key")}}}}
    with pytest.raises(DagsterInvalidConfigError, match="unexpected config entr"):
        validate_run_config(job, attack)
    validate_run_config(job, {})  # the deployment's own run still validates


def test_no_field_of_any_resource_is_launch_time_config(tmp_path: Path) -> None:
    defs = build_definitions(_slurm_settings(tmp_path))
    fields = _fields(defs)
    names = {f for _, f, _ in fields}
    # the ones whose override would redirect a credential or a write are among them
    assert {"db_url", "slurm_url", "slurm_jwt_file", "slurm_user", "slurm_conf", "slurm_plan_key_file",
            "slurm_reference_jwt_file", "kind", "report_dir", "profiling", "sampling"} <= names
    for job_name in ("profile_job", "round_job", "refresh_job"):
        job = defs.resolve_job_def(job_name)
        keys = job.required_resource_keys
        for key, name, sample in fields:
            if key not in keys:
                continue
            with pytest.raises(DagsterInvalidConfigError):
                validate_run_config(job, {"resources": {key: {"config": {name: sample}}}})


def test_a_refused_run_does_not_start(tmp_path: Path) -> None:
    """Through execution too (what the daemon does with a launched run): the run is refused before any step."""
    defs = build_definitions(MuxflowSettings(db_url=f"sqlite:///{tmp_path / 'x.db'}",
                                             report_dir=str(tmp_path / "report")))
    job = defs.resolve_job_def("report_job")
    with pytest.raises(DagsterInvalidConfigError):
        job.execute_in_process(run_config={"resources": {"scheduling": {"config": {"report_dir": "/etc"}}}})
    with pytest.raises(DagsterInvalidConfigError):
        job.execute_in_process(run_config={"resources": {"feature_store": {"config": {
            "db_url": "postgresql+psycopg2://attacker@127.0.0.1:1/x"}}}})
