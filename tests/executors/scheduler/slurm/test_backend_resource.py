"""ClusterResource(kind='slurm') builds the Slurm dispatcher from its settings (nothing is contacted)."""

from __future__ import annotations

import pytest
from dagster import Failure

from assets.resources import ClusterResource
from executors.scheduler.slurm.backend import SlurmBackend


def test_slurm_kind_returns_the_slurm_backend_for_a_socket_and_a_url(tmp_path) -> None:
    b = ClusterResource(kind="slurm", slurm_url="unix:/tmp/x.sock").backend()
    assert isinstance(b, SlurmBackend) and not b.simulated and b.source == "measured"
    c = b.client_factory()
    assert c.settings.unix_socket == "/tmp/x.sock" and c.settings.url is None
    sock = ClusterResource(kind="slurm", slurm_url="unix:///run/slurmrestd.sock").backend().client_factory()
    assert sock.settings.unix_socket == "/run/slurmrestd.sock"
    tok = tmp_path / "jwt"
    tok.write_text("SLURM_JWT=abc")
    b = ClusterResource(kind="slurm", slurm_url="http://slurm:6820", slurm_jwt_file=str(tok),
                        slurm_api_version="v0.0.40").backend()
    c = b.client_factory()
    assert c.settings.url == "http://slurm:6820" and c.api.name == "v0.0.40" and c.requeue_fallback is not None


def test_slurm_kind_with_bad_settings_fails_clearly() -> None:
    with pytest.raises(Failure, match="cluster 'slurm'"):
        ClusterResource(kind="slurm", slurm_url="ftp://x").backend()

