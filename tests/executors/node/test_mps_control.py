"""``SubprocessMpsControl`` against a scripted stand-in for ``nvidia-cuda-mps-control``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from executors.node.detector import ErrorDetector, SubprocessMpsControl, check_pipe_root

FAKE = r"""#!/bin/bash
# stand-in for nvidia-cuda-mps-control: state files in $FAKE_MPS_DIR
d="$FAKE_MPS_DIR"
if [ "$1" = "-d" ]; then echo start >> "$d/log"; exit 0; fi
read -r cmd arg
echo "$cmd $arg" >> "$d/log"
if [ -e "$d/hang" ]; then exec sleep 30; fi
case "$cmd" in
  get_server_list) cat "$d/servers" 2>/dev/null || true ;;
  get_client_list) cat "$d/clients_$arg" 2>/dev/null || true ;;
  quit) rm -f "$d/servers" ;;
  *) exit 1 ;;
esac
"""


def _fake_binary(tmp_path) -> tuple[str, object]:
    exe = tmp_path / "nvidia-cuda-mps-control"
    exe.write_text(FAKE)
    exe.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    return str(exe), state


@pytest.fixture
def fake(tmp_path):
    """The control protocol (the directories' trust is tested below, with directories a real check passes)."""
    exe, state = _fake_binary(tmp_path)
    return SubprocessMpsControl(pipe_dir=str(tmp_path / "pipe"), binary=exe, trust=lambda _d: None,
                                env={"FAKE_MPS_DIR": str(state)}), state


def _proc():
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _end(p):
    p.stdin.close()
    p.wait(10)


def test_probe_and_reset(fake):
    ctl, state = fake
    assert ctl.probe(5.0)
    assert ctl.reset(5.0)
    log = (state / "log").read_text().split("\n")
    assert "quit " in log and "start" in log
    assert ctl.env["CUDA_MPS_PIPE_DIRECTORY"].endswith("pipe")


def test_hang_is_a_failed_probe_within_the_timeout(fake):
    ctl, state = fake
    (state / "hang").touch()
    t0 = time.monotonic()
    assert not ctl.probe(0.5)
    assert time.monotonic() - t0 < 5.0


def test_missing_binary_means_no_mps(tmp_path):
    ctl = SubprocessMpsControl(binary=str(tmp_path / "absent"))
    assert ctl.server_alive() is None
    assert not ctl.probe(1.0)
    assert ErrorDetector(ctl).check(0.0, []) == []


def test_server_gone_under_live_clients_is_a_crash(fake):
    ctl, state = fake
    server, client = _proc(), _proc()
    try:
        (state / "servers").write_text(f"{server.pid}\n")
        (state / f"clients_{server.pid}").write_text(f"{client.pid}\n")
        assert ctl.server_alive() is True
        _end(server)
        (state / "servers").write_text("")
        assert ctl.server_alive() is False
        assert ctl.server_alive() is True  # reported once
    finally:
        _end(client)
        if server.poll() is None:
            _end(server)


def test_server_exiting_after_its_clients_is_not_a_crash(fake):
    ctl, state = fake
    server, client = _proc(), _proc()
    (state / "servers").write_text(f"{server.pid}\n")
    (state / f"clients_{server.pid}").write_text(f"{client.pid}\n")
    assert ctl.server_alive() is True
    _end(client)
    _end(server)
    (state / "servers").write_text("")  # e.g. the daemon swapped it for another user's server
    assert ctl.server_alive() is True
    assert os.path.exists(f"/proc/{os.getpid()}")


# -- whose directory root talks to MPS in ---------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="directories of root and of another uid")
OTHER_UID = 65534


@pytest.fixture
def run_root():
    """A directory in a chain root alone can write (/run), as the node's @MPS_PIPE_ROOT@ is."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="muxflow-test-mps-", dir="/run")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _gpu_dirs(root: str, gpu: int = 0) -> tuple[str, str]:
    pipe = f"{root}/gpu{gpu}"
    for d in (pipe, f"{pipe}.log"):
        os.mkdir(d, 0o755)
    return pipe, f"{pipe}.log"


@needs_root
def test_the_gpus_own_root_owned_directories_are_used(tmp_path, run_root) -> None:
    exe, state = _fake_binary(tmp_path)
    pipe, logs = _gpu_dirs(run_root)
    check_pipe_root(run_root)
    ctl = SubprocessMpsControl(pipe, logs, binary=exe, env={"FAKE_MPS_DIR": str(state)})
    assert ctl.server_alive() is True and ctl.probe(5.0) and ctl.state == "ok"
    assert (ctl.env["CUDA_MPS_PIPE_DIRECTORY"], ctl.env["CUDA_MPS_LOG_DIRECTORY"]) == (pipe, logs)


@needs_root
@pytest.mark.parametrize("spoil", ["other-uid", "1777", "link", "group-writable-log", "other-uid-parent"])
def test_attack_a_pipe_directory_a_user_made_is_never_probed_nor_reset(tmp_path, run_root, spoil, caplog) -> None:
    """A user who made the pipe directory runs a control daemon there that answers as they like: its 'faults'
    evicted all offline work of the GPU, and the reset ran nvidia-cuda-mps-control -d as root in their directory."""
    exe, state = _fake_binary(tmp_path)
    pipe, logs = _gpu_dirs(run_root)
    if spoil == "other-uid":
        os.chown(pipe, OTHER_UID, OTHER_UID)
    elif spoil == "1777":
        os.chmod(pipe, 0o1777)
    elif spoil == "link":
        os.rmdir(pipe)
        mine = tmp_path / "mine"
        mine.mkdir()
        os.symlink(mine, pipe)
    elif spoil == "group-writable-log":
        os.chmod(logs, 0o775)
    else:  # the directories root's, in a parent a user owns (who can rename them away and put theirs instead)
        os.chown(run_root, OTHER_UID, OTHER_UID)
    (state / "hang").touch()  # the user's daemon "hangs": a probe there would be a fault
    ctl = SubprocessMpsControl(pipe, logs, binary=exe, env={"FAKE_MPS_DIR": str(state)})
    det = ErrorDetector(ctl)
    with caplog.at_level("ERROR"):
        assert det.check(0.0, []) == [] and det.check(5.0, []) == []  # no fault, so no eviction
        assert not ctl.reset(1.0)
    assert not (state / "log").exists()  # not one command reached the user's daemon, no -d as root
    assert det.mps_state.startswith("untrusted pipe dir: ")
    assert sum("not used (no health probe, no reset)" in r.getMessage() for r in caplog.records) == 1  # once


def test_a_gpu_without_its_pipe_directory_yet_has_no_mps(tmp_path) -> None:
    exe, state = _fake_binary(tmp_path)
    ctl = SubprocessMpsControl("/run/muxflow-test-absent/gpu0", binary=exe, env={"FAKE_MPS_DIR": str(state)})
    assert ctl.server_alive() is None and ctl.state == "no pipe dir" and not (state / "log").exists()


def test_mps_default_pipe_directory_under_tmp_is_never_used(tmp_path) -> None:
    exe, state = _fake_binary(tmp_path)
    ctl = SubprocessMpsControl(binary=exe, env={"FAKE_MPS_DIR": str(state)})  # MPS's own default, /tmp/nvidia-mps
    assert ctl.server_alive() is None and not ctl.reset(1.0) and not (state / "log").exists()


@pytest.mark.parametrize("root", ["/tmp/nvidia-mps", "/tmp", "/dev/shm/mps"])
def test_the_agent_refuses_a_pipe_root_under_a_world_writable_directory(root) -> None:
    with pytest.raises(ValueError, match=r"MPS pipe root .*(writable by group or others|owned by uid)"):
        check_pipe_root(root)


@needs_root
def test_the_agent_refuses_a_pipe_root_someone_else_made(run_root) -> None:
    os.chown(run_root, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError, match=f"owned by uid {OTHER_UID}, not root"):
        check_pipe_root(run_root)


def test_control_commands_carry_none_of_the_agents_environment(monkeypatch) -> None:
    monkeypatch.setenv("MUXFLOW_DATABASE_URL", "postgresql://muxflow:pw@db/muxflow")
    ctl = SubprocessMpsControl("/run/muxflow/mps/gpu0", "/run/muxflow/mps/gpu0.log")
    assert set(ctl.env) == {"PATH", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"}
