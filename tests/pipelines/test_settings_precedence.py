"""Where the deployment's settings come from: command-line flags over environment variables over the settings file
(MUXFLOW_SETTINGS, else $DAGSTER_HOME/muxflow.json) over the defaults; a variable that overrides the file's value is
said once per process, passwords masked; the file is written 0600; and ``make test`` runs with a Dagster home and
settings of its own, whatever the checkout holds (``make run``'s .dagster_home/muxflow.json)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pipelines import settings as settings_module
from pipelines.settings import (ENV_VARS, MuxflowSettings, SettingsError, environment_variables, load_settings,
                                mask_secrets, settings_file, write_settings)

REPO = Path(__file__).resolve().parents[2]
PG_WITH_PASSWORD = "postgresql+psycopg2://muxflow:hunter2@db.invalid/muxflow"


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a process of its own as far as the once-per-process notices go."""
    monkeypatch.setattr(settings_module, "_NOTICES_SHOWN", set())


def instance(home: Path, **fields) -> Path:
    """A Dagster home with the muxflow.json the main job writes (every field, defaults included)."""
    return write_settings(MuxflowSettings(**{"db_url": PG_WITH_PASSWORD, **fields}), home)


# -- precedence ---------------------------------------------------------------------------------------------------

def test_flags_over_environment_over_file_over_defaults(tmp_path: Path) -> None:
    path = instance(tmp_path, seed=3, epochs=7, gpu_types=("h100",), round_period_s=300)
    env = {"DAGSTER_HOME": str(tmp_path)}
    from_file = load_settings(env)
    assert (from_file.seed, from_file.epochs, from_file.gpu_types, from_file.round_period_s) == (3, 7, ("h100",), 300)
    assert from_file.db_url == PG_WITH_PASSWORD and from_file.max_jobs_per_gpu == 1  # the default: the file's too

    env.update(MUXFLOW_SEED="5", MUXFLOW_MAX_JOBS_PER_GPU="2", MUXFLOW_DATABASE_URL="sqlite:///env.db")
    s = load_settings(env)
    assert (s.seed, s.max_jobs_per_gpu, s.db_url) == (5, 2, "sqlite:///env.db")  # the environment's
    assert (s.epochs, s.gpu_types, s.round_period_s) == (7, ("h100",), 300)  # the file's, where no variable is set
    assert s.migration_penalty == MuxflowSettings(db_url="x").migration_penalty  # neither: the default

    flagged = load_settings(env, flags={"db_url": "sqlite:///flag.db", "seed": None})  # None: not given
    assert (flagged.db_url, flagged.seed) == ("sqlite:///flag.db", 5)

    # MUXFLOW_SETTINGS names the file, over $DAGSTER_HOME/muxflow.json; without either, the defaults.
    other = tmp_path / "site" / "muxflow.json"
    instance(other.parent, seed=11)
    assert settings_file({**env, "MUXFLOW_SETTINGS": str(other)}) == other
    assert load_settings({"DAGSTER_HOME": str(tmp_path), "MUXFLOW_SETTINGS": str(other)}).seed == 11
    assert settings_file(env) == path
    assert settings_file({"DAGSTER_HOME": str(tmp_path / "empty")}) is None
    bare = load_settings({})
    assert bare == MuxflowSettings(db_url="sqlite:///.muxflow/muxflow.db")


def test_profiling_and_sampling_variables_are_merged_over_the_files(tmp_path: Path) -> None:
    instance(tmp_path, profiling={"iterations": 60, "partition": "prof"}, sampling={"window_s": 40.0})
    s = load_settings({"DAGSTER_HOME": str(tmp_path), "MUXFLOW_PROFILING_ITERATIONS": "30",
                       "MUXFLOW_SAMPLING_BUDGET_GPU_S": "600"})
    assert s.profiling == {"iterations": 30, "partition": "prof"}
    assert s.sampling == {"window_s": 40.0, "budget_gpu_s": 600.0}
    conf = s.slurm_config()
    assert (conf.profiling.iterations, conf.profiling.partition, conf.sampling.window_s) == (30, "prof", 40.0)


def test_the_cluster_the_environment_names_wins_over_the_main_jobs_file(tmp_path: Path) -> None:
    """The new user's case: `make run` left a muxflow.json (cluster simulated) where DAGSTER_HOME points."""
    instance(tmp_path)
    s = load_settings({"DAGSTER_HOME": str(tmp_path), "MUXFLOW_CLUSTER": "slurm",
                       "MUXFLOW_SLURM_URL": "unix:/run/slurmrestd.sock", "SLURM_CONF": "/etc/site/slurm.conf"})
    assert (s.cluster, s.slurm_url, s.slurm_conf) == ("slurm", "unix:/run/slurmrestd.sock", "/etc/site/slurm.conf")
    assert s.cluster_resource().kind == "slurm"


def test_errors_stay_one_line_naming_the_setting(tmp_path: Path) -> None:
    instance(tmp_path)
    env = {"DAGSTER_HOME": str(tmp_path)}
    for extra, msg in [({"MUXFLOW_CLUSTER": "kubernetes"}, "cluster must be 'simulated' or 'slurm'"),
                       ({"MUXFLOW_CLUSTER": "slurm"}, "cluster 'slurm' needs slurm_url"),
                       ({"MUXFLOW_SEED": "zero"}, "MUXFLOW_SEED='zero'"),
                       ({"MUXFLOW_PROFILING_ITERATIONS": "many"}, "MUXFLOW_PROFILING_ITERATIONS"),
                       ({"MUXFLOW_SLURM_REST_URL": "http://x:6820"}, "MUXFLOW_SLURM_REST_URL is no longer read")]:
        with pytest.raises(SettingsError, match=msg) as err:
            load_settings({**env, **extra})
        assert "\n" not in str(err.value)
    (tmp_path / "muxflow.json").write_text(json.dumps({"profiling": [1, 2]}))
    with pytest.raises(SettingsError, match="^profiling: expected an object"):
        load_settings(env)
    (tmp_path / "muxflow.json").write_text("[]")
    with pytest.raises(SettingsError, match="expected a JSON object"):
        load_settings(env)
    (tmp_path / "muxflow.json").write_text('{"db_url": "sqlite:///x.db", "colour": "red"}')
    with pytest.raises(SettingsError, match="unknown settings: colour"):
        load_settings(env)


def test_environment_variables_lists_every_variable_the_loader_reads() -> None:
    names = environment_variables()
    assert set(ENV_VARS) | {"MUXFLOW_SETTINGS", "MUXFLOW_DATABASE_URL", "SLURM_CONF"} <= set(names)
    assert {"MUXFLOW_PROFILING_ITERATIONS", "MUXFLOW_SAMPLING_BUDGET_GPU_S", "MUXFLOW_SLURM_REST_URL"} <= set(names)
    assert not {"DAGSTER_HOME", "MUXFLOW_TEST_PG_URL", "MUXFLOW_SLURM_DIR", "SLURM_JWT"} & set(names)


# -- the notice -----------------------------------------------------------------------------------------------------

def test_an_override_of_the_files_value_is_said_once_with_passwords_masked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = instance(tmp_path, epochs=7)
    env = {"DAGSTER_HOME": str(tmp_path), "MUXFLOW_CLUSTER": "slurm", "MUXFLOW_SLURM_URL": "unix:/run/rest.sock",
           "MUXFLOW_DATABASE_URL": "postgresql+psycopg2://ops:s3cret@db2.invalid/muxflow",
           "MUXFLOW_EPOCHS": "7"}  # the file's own value: nothing to say
    for _ in range(3):
        load_settings(env)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"settings: MUXFLOW_DATABASE_URL=postgresql+psycopg2://ops:***@db2.invalid/muxflow overrides "
        f"db_url=postgresql+psycopg2://muxflow:***@db.invalid/muxflow from {path}",
        f"settings: MUXFLOW_CLUSTER=slurm overrides cluster=simulated from {path}",
    ]  # slurm_url: null in the file is "not set", nothing overridden
    assert "hunter2" not in err and "s3cret" not in err
    # A different override later in the process is said too, once.
    load_settings({**env, "MUXFLOW_CLUSTER": "simulated"})
    load_settings({**env, "MUXFLOW_CLUSTER": "simulated"})
    assert capsys.readouterr().err == ""  # simulated: the file's value
    load_settings({**env, "MUXFLOW_SEED": "4"})
    load_settings({**env, "MUXFLOW_SEED": "4"})
    assert capsys.readouterr().err.splitlines() == [f"settings: MUXFLOW_SEED=4 overrides seed=0 from {path}"]


def test_nothing_is_said_without_a_file_or_a_difference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    load_settings({"MUXFLOW_CLUSTER": "slurm", "MUXFLOW_SLURM_URL": "unix:/run/rest.sock", "MUXFLOW_SEED": "2"})
    monkeypatch.chdir(tmp_path)
    write_settings(MuxflowSettings(db_url=f"sqlite:///{tmp_path / 'store.db'}", gpu_types=("t4", "a10"),
                                   rounds_start=MuxflowSettings(db_url="x").rounds_start), tmp_path)
    load_settings({"DAGSTER_HOME": str(tmp_path), "MUXFLOW_DATABASE_URL": "sqlite:///store.db",  # the same file
                   "MUXFLOW_GPU_TYPES": "t4, a10", "MUXFLOW_XCUDA_GAINS": "1,20,0",
                   "MUXFLOW_ROUNDS_START": "2026-01-05T00:00Z"})
    assert capsys.readouterr().err == ""


def test_mask_secrets() -> None:
    assert mask_secrets(PG_WITH_PASSWORD) == "postgresql+psycopg2://muxflow:***@db.invalid/muxflow"
    assert mask_secrets("postgresql+psycopg2://muxflow@db/x") == "postgresql+psycopg2://muxflow@db/x"
    assert mask_secrets("http://:t0k@host:6820/x") == "http://:***@host:6820/x"
    assert mask_secrets("sqlite:////tmp/a:b/x.db") == "sqlite:////tmp/a:b/x.db"


# -- write_settings -------------------------------------------------------------------------------------------------

def test_write_settings_writes_an_operators_file_0600(tmp_path: Path) -> None:
    old = os.umask(0)  # whatever the umask: the file may hold a database password
    try:
        path = instance(tmp_path / "home")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        path.chmod(0o644)  # a file someone opened up: written again, it is closed again
        write_settings(MuxflowSettings(db_url="sqlite:///x.db", seed=9), tmp_path / "home")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["seed"] == 9
    assert [p.name for p in (tmp_path / "home").iterdir()] == ["muxflow.json"]  # no temporary file left behind
    assert load_settings({"DAGSTER_HOME": str(tmp_path / "home")}).seed == 9


# -- the command line -----------------------------------------------------------------------------------------------

def test_the_clis_db_flag_is_over_the_environment_and_the_file(tmp_path: Path) -> None:
    from pipelines.cli import common, main

    @click.command("settings-probe")
    def probe() -> None:
        s = common.settings()
        click.echo(f"{s.db_url} {s.cluster} {s.seed}")

    instance(tmp_path, seed=3)
    env = {"DAGSTER_HOME": str(tmp_path), "MUXFLOW_SETTINGS": None, "MUXFLOW_CLUSTER": "simulated",
           "MUXFLOW_SEED": "4", "MUXFLOW_DATABASE_URL": "sqlite:///env.db"}
    main.add_command(probe)
    try:
        by_env = CliRunner().invoke(main, ["settings-probe"], env=env, catch_exceptions=False)
        by_flag = CliRunner().invoke(main, ["--db", "sqlite:///flag.db", "settings-probe"], env=env,
                                     catch_exceptions=False)
    finally:
        main.commands.pop("settings-probe")
    assert by_env.stdout.strip() == "sqlite:///env.db simulated 4"
    assert by_flag.stdout.strip() == "sqlite:///flag.db simulated 4"


def test_a_muxflow_json_where_dagster_home_points_does_not_override_the_environment(tmp_path: Path) -> None:
    """`make run` leaves .dagster_home/muxflow.json (cluster simulated); a command run with DAGSTER_HOME there and
    MUXFLOW_CLUSTER=slurm in its environment is on Slurm, and says that the environment overrode the file, once."""
    from executors.store.migrate import upgrade

    home = tmp_path / ".dagster_home"
    path = instance(home)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(store)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "DAGSTER_HOME": str(home),
           "MUXFLOW_CLUSTER": "slurm", "MUXFLOW_SLURM_URL": f"unix:{tmp_path / 'none.sock'}",
           "MUXFLOW_DATABASE_URL": store}
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "jobs", "list"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert lines.count(f"settings: MUXFLOW_CLUSTER=slurm overrides cluster=simulated from {path}") == 1, out.stderr
    assert lines.count(f"settings: MUXFLOW_DATABASE_URL={store} overrides db_url=postgresql+psycopg2://muxflow:***@"
                       f"db.invalid/muxflow from {path}") == 1, out.stderr
    # On Slurm (the environment's), which does not answer at the environment's socket:
    assert any(ln.startswith("note: cannot list Slurm's held submissions: ") and "none.sock" in ln for ln in lines), \
        out.stderr
    assert "hunter2" not in out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("bash") is None, reason="needs make and bash")
def test_make_test_has_its_own_dagster_home_and_no_deployment_settings(tmp_path: Path) -> None:
    """The test targets' environment (Makefile, TEST_ENV) after `make run` and with an operator's shell: DAGSTER_HOME
    a fresh, empty folder of the tests', no settings file, none of the deployment's variables; the tests' own kept."""
    user_home = tmp_path / ".dagster_home"
    instance(user_home, cluster="slurm", slurm_url="unix:/run/rest.sock", seed=7)
    (user_home / "leftover").write_text("")
    printer = tmp_path / "print.mk"
    printer.write_text("print-test-env:\n\t$(info $(TEST_ENV))@:\n")
    tests_home = tmp_path / "test-artifacts" / "dagster_home"
    tests_home.mkdir(parents=True)
    (tests_home / "muxflow.json").write_text("{}")  # a previous run's: cleaned first
    outer = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    made = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", str(printer), "print-test-env",
                           f"PY={sys.executable}", f"TEST_DAGSTER_HOME={tests_home}"],
                          cwd=REPO, env=outer, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    test_env = made.stdout.strip()
    assert test_env.endswith("&&"), test_env
    probe = ("import json, os; from pipelines.settings import environment_variables, load_settings, settings_file; "
             "print(json.dumps({'home': os.environ.get('DAGSTER_HOME'), 'file': str(settings_file()), "
             "'cluster': load_settings().cluster, 'seed': load_settings().seed, "
             "'vars': sorted(set(os.environ) & set(environment_variables())), "
             "'test_pg': os.environ.get('MUXFLOW_TEST_PG_URL'), "
             "'listing': sorted(os.listdir(os.environ['DAGSTER_HOME']))}))")
    shell = {**outer, "DAGSTER_HOME": str(user_home), "MUXFLOW_SETTINGS": str(user_home / "muxflow.json"),
             "MUXFLOW_CLUSTER": "slurm", "MUXFLOW_SLURM_URL": "unix:/run/rest.sock", "MUXFLOW_SEED": "7",
             "MUXFLOW_DATABASE_URL": PG_WITH_PASSWORD, "MUXFLOW_PROFILING_ITERATIONS": "3",
             "SLURM_CONF": "/etc/site/slurm.conf", "MUXFLOW_TEST_PG_URL": "postgresql+psycopg2://postgres@pg/postgres"}
    out = subprocess.run(["bash", "-c", f"{test_env} {sys.executable} -c \"{probe}\""], cwd=REPO, env=shell,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"home": str(tests_home), "file": "None", "cluster": "simulated", "seed": 0, "vars": [],
                    "test_pg": "postgresql+psycopg2://postgres@pg/postgres", "listing": []}, seen
    assert "settings:" not in out.stderr  # nothing overridden: nothing read
    assert (user_home / "leftover").exists()  # the user's instance is left alone
