"""The REST client without Slurm: captured responses replayed through httpx.MockTransport."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from executors.slurm.client import SlurmNotFound, SlurmRestClient
from executors.slurm.errors import SlurmAuthError, SlurmRestError, SlurmTransportError, SlurmUnsupported, TokenFileError
from executors.slurm.jwt import mint_hs256
from executors.slurm.settings import SlurmRestSettings
from executors.slurm.spec import BatchJob, JobUpdate

DATA = Path(__file__).resolve().parent / "data"
SPEC = BatchJob(name="j", script="#!/bin/sh\n", partition="offline", hold=True, gres_per_node="mps:30")


def captured(name: str) -> tuple[int, dict[str, Any]]:
    rec = json.loads((DATA / f"{name}.json").read_text())
    return rec["status_code"], rec["body"]


class Replay:
    """Answers every request with one captured response and remembers the requests."""

    def __init__(self, name: str | None = None, *, status: int = 200, text: str | None = None):
        self.name, self.status, self.text = name, status, text
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.text is not None:
            return httpx.Response(self.status, text=self.text)
        status, body = captured(self.name)
        return httpx.Response(status, json=body)


def client(replay: Replay, **settings: Any) -> SlurmRestClient:
    settings.setdefault("unix_socket", "/nonexistent.sock")
    settings.setdefault("api_version", "v0.0.38")  # the captured responses are v0.0.38's
    return SlurmRestClient(SlurmRestSettings(**settings), transport=httpx.MockTransport(replay))


def test_submit_held_returns_id_and_note() -> None:
    replay = Replay("job_submit_held")
    res = client(replay).submit(SPEC)
    assert res.job_id == captured("job_submit_held")[1]["job_id"]
    assert any("held state" in n for n in res.notes)
    [req] = replay.requests
    assert req.method == "POST" and req.url.path == "/slurm/v0.0.38/job/submit"
    sent = json.loads(req.content)
    assert sent["job"]["hold"] is True and sent["job"]["gres"] == "mps:30"


def test_unknown_partition_raises_with_slurm_message() -> None:
    with pytest.raises(SlurmNotFound, match="Invalid partition name specified") as info:
        client(Replay("error_unknown_partition")).submit(SPEC)
    assert info.value.status_code == 500 and 2000 in info.value.numbers


def test_parse_failure_answered_200_still_raises() -> None:
    with pytest.raises(SlurmRestError, match='Disabled key: "required_nodes"'):
        client(Replay("error_disabled_key")).update_job(3, JobUpdate(hold=False))
    with pytest.raises(SlurmRestError, match='Unknown key "tres_per_node"'):
        client(Replay("error_unknown_key")).update_job(3, JobUpdate(hold=False))


def test_unknown_job() -> None:
    with pytest.raises(SlurmNotFound, match="Invalid job id specified"):
        client(Replay("error_unknown_job")).get_job(999999)
    with pytest.raises(SlurmNotFound, match="unable to kill JobId=999999"):
        client(Replay("error_cancel_unknown_job")).cancel(999999)


def test_auth_failure_and_non_json() -> None:
    with pytest.raises(SlurmAuthError, match="Authentication failure"):
        client(Replay(status=401, text="Authentication failure")).ping()
    with pytest.raises(SlurmRestError, match="HTTP 502: bad gateway"):
        client(Replay(status=502, text="bad gateway")).ping()


def test_place_is_one_update_with_node_share_and_release() -> None:
    replay = Replay("job_release")
    client(replay).place(7, "mx-a10-1", "mps:70")
    [req] = replay.requests
    assert req.method == "POST" and req.url.path == "/slurm/v0.0.38/job/7"
    assert json.loads(req.content) == {"nodelist": "mx-a10-1", "gres": "mps:70", "begin_time": "now",
                                       "hold": False}


def test_cancel_with_signal_and_release_hold() -> None:
    replay = Replay("job_signal")
    c = client(replay)
    c.cancel(7, "SIGUSR1")
    c.cancel(7)
    c.release(7)
    c.hold(7)
    assert [dict(r.url.params) for r in replay.requests[:2]] == [{"signal": "USR1"}, {}]
    assert [r.method for r in replay.requests] == ["DELETE", "DELETE", "POST", "POST"]
    assert [json.loads(r.content) for r in replay.requests[2:]] == [{"hold": False}, {"hold": True}]


def test_reads() -> None:
    assert {n.name for n in client(Replay("nodes")).list_nodes()} == {"mx-t4-1", "mx-a10-1"}
    assert client(Replay("node")).get_node("mx-t4-1").gpu_type == "t4"
    assert {p.name for p in client(Replay("partitions")).list_partitions()} == {"online", "offline", "profile"}
    job_id = captured("job_held")[1]["jobs"][0]["job_id"]
    assert client(Replay("job_held")).get_job(job_id).held
    assert client(Replay("jobs")).list_jobs()
    assert "server_thread_count" in client(Replay("diag")).diag()
    assert client(Replay("ping")).version().release.startswith("22.05")


def test_a_job_listing_without_a_job_list_is_an_error_not_an_empty_cluster() -> None:
    """Read as "no jobs", it would make every job of the store look gone from the cluster."""
    for text in ('{"meta": {}, "errors": []}', '{"jobs": null, "errors": []}'):
        with pytest.raises(SlurmRestError, match="without a job list"):
            client(Replay(text=text)).list_jobs()
    assert client(Replay(text='{"jobs": [], "errors": []}')).list_jobs() == []


def test_requeue_needs_a_fallback() -> None:
    with pytest.raises(SlurmUnsupported, match="no requeue"):
        client(Replay("ping")).requeue(5)
    calls = []
    c = SlurmRestClient(SlurmRestSettings(unix_socket="/x", api_version="v0.0.38"),
                        transport=httpx.MockTransport(Replay("ping")),
                        requeue_fallback=lambda job_id, hold: calls.append((job_id, hold)))
    c.requeue(5)
    c.requeue(6, hold=False)
    assert calls == [(5, True), (6, False)]


def test_missing_socket_is_a_transport_error(tmp_path: Path) -> None:
    sock = tmp_path / "none.sock"
    with SlurmRestClient(SlurmRestSettings(unix_socket=str(sock), timeout_s=2)) as c:
        with pytest.raises(SlurmTransportError, match=str(sock)):
            c.ping()


# -- settings and JWT headers -----------------------------------------------------------
def test_jwt_headers_from_token_and_file(tmp_path: Path) -> None:
    token = mint_hs256(b"k" * 32, "alice", issued_at_s=1_700_000_000, lifespan_s=600)
    replay = Replay("ping")
    client(replay, unix_socket=None, url="http://slurm:6820", token=token).ping()
    h = replay.requests[0].headers
    assert h["X-SLURM-USER-TOKEN"] == token and h["X-SLURM-USER-NAME"] == "alice"
    assert replay.requests[0].url.host == "slurm"

    f = tmp_path / "token"
    f.write_text(f"SLURM_JWT={token}\n")
    f.chmod(0o600)
    replay = Replay("ping")
    c = client(replay, unix_socket=None, url="http://slurm:6820", token_file=str(f), user_name="svc")
    c.ping()
    token2 = mint_hs256(b"k" * 32, "alice", issued_at_s=1_700_000_100, lifespan_s=600)
    f.write_text(token2)  # rotated: read again on the next request
    c.ping()
    assert [r.headers["X-SLURM-USER-TOKEN"] for r in replay.requests] == [token, token2]
    assert replay.requests[0].headers["X-SLURM-USER-NAME"] == "svc"


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    """Whoever reads the token acts in Slurm as MuxFlow: a file open to others is not used."""
    f = tmp_path / "token"
    f.write_text(mint_hs256(b"k" * 32, "muxflow", issued_at_s=1_700_000_000, lifespan_s=600))
    f.chmod(0o644)
    c = client(Replay("ping"), unix_socket=None, url="http://slurm:6820", token_file=str(f))
    with pytest.raises(TokenFileError, match="mode 0644 lets others read or change it"):
        c.ping()
    (tmp_path / "link").symlink_to(f)
    f.chmod(0o600)
    c = client(Replay("ping"), unix_socket=None, url="http://slurm:6820", token_file=str(tmp_path / "link"))
    with pytest.raises(TokenFileError):
        c.ping()


def test_unix_socket_sends_no_credentials() -> None:
    replay = Replay("ping")
    client(replay).ping()
    assert "X-SLURM-USER-TOKEN" not in replay.requests[0].headers


@pytest.mark.parametrize("kwargs, match", [
    ({}, "exactly one"),
    ({"unix_socket": "/s", "url": "http://x"}, "exactly one"),
    ({"url": "slurm:6820"}, "http://"),
    ({"url": "http://x", "token": "a", "token_file": "/f"}, "not both"),
    ({"unix_socket": "/s", "api_version": "v9"}, "unknown"),
    ({"unix_socket": "/s", "timeout_s": 0}, "timeout_s"),
])
def test_settings_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SlurmRestSettings(**kwargs)
