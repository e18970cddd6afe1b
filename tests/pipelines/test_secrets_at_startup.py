"""Long-running processes refuse to start with credentials others can read (docs/SECURITY.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from executors.slurm.plan import new_key, write_key
from pipelines.settings import MuxflowSettings, SettingsError

REPO = Path(__file__).resolve().parents[2]


def _slurm(tmp_path: Path, **files: str) -> MuxflowSettings:
    return MuxflowSettings(db_url=f"sqlite:///{tmp_path / 's.db'}", cluster="slurm", slurm_url="http://ctl:6820",
                           **files)


def test_tokens_and_keys_others_can_read_are_refused_at_startup(tmp_path: Path) -> None:
    token, key = tmp_path / "slurm.jwt", tmp_path / "plan.key"
    token.write_text("SLURM_JWT=a.b.c\n")
    token.chmod(0o600)
    write_key(key, new_key())
    good = _slurm(tmp_path, slurm_jwt_file=str(token), slurm_plan_key_file=str(key),
                  slurm_reference_jwt_file=str(token))
    good.check_secrets()
    token.chmod(0o644)
    with pytest.raises(SettingsError, match=r"slurm.jwt: mode 0644 lets others read or change it"):
        good.check_secrets()
    token.chmod(0o600)
    key.chmod(0o640)
    with pytest.raises(SettingsError, match=r"plan.key: mode 0640"):
        good.check_secrets()
    with pytest.raises(SettingsError, match="no such file"):
        _slurm(tmp_path, slurm_jwt_file=str(tmp_path / "missing.jwt")).check_secrets()


def test_a_settings_file_naming_the_stores_password_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "muxflow.json"
    path.write_text("{}")
    path.chmod(0o644)
    secret = MuxflowSettings(db_url="postgresql+psycopg2://muxflow:hunter2@db/muxflow")
    with pytest.raises(SettingsError, match="names the store's password") as exc:
        secret.check_secrets(path)
    assert "hunter2" not in str(exc.value)
    MuxflowSettings(db_url="postgresql+psycopg2://muxflow@db/muxflow").check_secrets(path)  # no password: fine
    path.chmod(0o600)
    secret.check_secrets(path)


def test_the_dagster_code_location_does_not_load_with_an_open_token(tmp_path: Path) -> None:
    token = tmp_path / "slurm.jwt"
    token.write_text("SLURM_JWT=a.b.c\n")
    token.chmod(0o644)
    settings = tmp_path / "muxflow.json"
    settings.write_text(json.dumps({"db_url": f"sqlite:///{tmp_path / 's.db'}", "cluster": "slurm",
                                    "slurm_url": "http://ctl:6820", "slurm_jwt_file": str(token)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUXFLOW_")} | {"MUXFLOW_SETTINGS": str(settings)}
    out = subprocess.run([sys.executable, "-c", "import pipelines.code_location"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "lets others read or change it" in out.stderr, out.stderr[-2000:]
