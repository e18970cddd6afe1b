"""One Slurm configuration: the deployment's settings make the SlurmConfig that Dagster's cluster resource, the
CLI and the node agent build their clients and backends from (nothing is contacted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.scheduler.profiling.backend import SlurmProfiler
from executors.scheduler.slurm.backend import SlurmBackend, XcudaGains
from executors.scheduler.slurm.config import SlurmConfig, SlurmConfigError
from pipelines.settings import SettingsError, load_settings

ENV = {"MUXFLOW_DATABASE_URL": "sqlite:///x.db", "MUXFLOW_CLUSTER": "slurm",
       "MUXFLOW_SLURM_URL": "http://ctl:6820", "MUXFLOW_SLURM_API_VERSION": "v0.0.40",
       "MUXFLOW_SLURM_USER": "muxflow", "SLURM_CONF": "/etc/slurm/slurm.conf",
       "MUXFLOW_SLURM_RETRY_DEADLINE_S": "12.5", "MUXFLOW_SLURM_NAME_GPUS": "yes", "MUXFLOW_XCUDA_GAINS": "2,10,0.5",
       "MUXFLOW_PROFILING_BOUND_S": "300", "MUXFLOW_SAMPLING_SIZE": "tiny"}


def test_the_settings_cluster_resource_and_profiler_share_one_slurm_config() -> None:
    settings = load_settings(ENV)
    conf = settings.slurm_config()
    assert (conf.url, conf.api_version, conf.user, conf.conf, conf.retry_deadline_s, conf.name_gpus) == (
        "http://ctl:6820", "v0.0.40", "muxflow", "/etc/slurm/slurm.conf", 12.5, True)
    assert conf.gains == XcudaGains(2.0, 10.0, 0.5)
    assert conf.profiling.bound_s == 300 and conf.sampling.size == "tiny"
    # Dagster's cluster resource, built from the same settings, holds the same configuration…
    resource = settings.cluster_resource()
    assert resource.slurm_config() == conf
    # …and hands out what it describes: the dispatcher and the profiler.
    backend = resource.backend()
    assert isinstance(backend, SlurmBackend) and backend.retry_deadline_s == 12.5 and backend.name_gpus
    assert backend.gains == conf.gains
    profiler = resource.profiler()
    assert isinstance(profiler, SlurmProfiler) and profiler.profiling.bound_s == 300
    assert profiler.sampling.size == "tiny" and profiler.retry_deadline_s == 12.5


def test_a_unix_url_is_the_socket_and_the_token_goes_only_over_tcp(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_JWT", "t.o.k")
    for url in ("unix:/run/slurmrestd.sock", "unix:///run/slurmrestd.sock"):
        rest = SlurmConfig(url=url).rest_settings()
        assert (rest.unix_socket, rest.url, rest.token) == ("/run/slurmrestd.sock", None, None)
    rest = SlurmConfig(url="http://ctl:6820").rest_settings()
    assert (rest.url, rest.token) == ("http://ctl:6820", "t.o.k")
    token = tmp_path / "jwt"
    token.write_text("SLURM_JWT=from.the.file\n")
    token.chmod(0o600)
    rest = SlurmConfig(url="http://ctl:6820", jwt_file=str(token)).rest_settings()
    assert rest.token is None and rest.current_token() == "from.the.file"  # the file wins, re-read per request
    client = SlurmConfig(url="http://ctl:6820", conf="/etc/slurm.conf").client()
    assert client.requeue_fallback is not None and client.settings.url == "http://ctl:6820"


@pytest.mark.parametrize(("env", "match"), [
    ({"MUXFLOW_SLURM_URL": "ftp://x"}, "http:// or https://"),
    ({"MUXFLOW_SLURM_API_VERSION": "v9"}, "v9"),
    ({"MUXFLOW_SLURM_RETRY_DEADLINE_S": "0"}, "slurm_retry_deadline_s"),
    ({"MUXFLOW_XCUDA_GAINS": "1,2"}, "xcuda_gains"),
    ({"MUXFLOW_XCUDA_GAINS": "1,9999,0"}, "ki must be"),
    ({"MUXFLOW_PROFILING_BOUND_S": "-1"}, "bound_s"),
    ({"MUXFLOW_SLURM_REST_URL": "http://ctl:6820"}, "MUXFLOW_SLURM_REST_URL is no longer read: set MUXFLOW_SLURM_URL"),
    ({"MUXFLOW_SLURM_REST_SOCKET": "/run/s.sock"}, "unix:/path/to/slurmrestd.sock"),
    ({"MUXFLOW_SLURM_URL": ""}, "cluster 'slurm' needs slurm_url"),
])
def test_a_bad_slurm_setting_is_refused_naming_it(env: dict, match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        load_settings({**ENV, **env})


def test_without_a_url_the_config_says_so_when_a_client_is_wanted() -> None:
    conf = load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db"}).slurm_config()
    assert conf.url is None
    with pytest.raises(SlurmConfigError, match="slurm_url is not set"):
        conf.client()
    dev = conf.with_defaults("unix:/dev/rest.sock", "/dev/slurm.conf")
    assert dev.socket == "/dev/rest.sock" and dev.conf == "/dev/slurm.conf"
    assert SlurmConfig(url="unix:/a", conf="/mine").with_defaults("unix:/b", "/b").conf == "/mine"


def test_the_cli_reads_the_same_settings_and_its_options_override_them(tmp_path: Path) -> None:
    from pipelines.cli.slurm import slurm

    runner = CliRunner()
    env = {"MUXFLOW_SLURM_URL": f"unix:{tmp_path / 'nobody.sock'}", "MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None}
    out = runner.invoke(slurm, ["ping", "--state-dir", str(tmp_path / "no-cluster")], env=env)
    assert out.exit_code == 1 and f"unix:{tmp_path / 'nobody.sock'}" in out.stderr, out.output
    out = runner.invoke(slurm, ["ping", "--state-dir", str(tmp_path / "no-cluster")],
                        env={"MUXFLOW_SLURM_URL": None, "MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None})
    assert out.exit_code == 2 and "slurm: slurm_url is not set" in out.stderr, out.output
    out = runner.invoke(slurm, ["ping"], env={**env, "MUXFLOW_SLURM_REST_URL": "http://x:1"})
    assert out.exit_code == 2 and "MUXFLOW_SLURM_REST_URL is no longer read" in out.stderr, out.output
