"""A typed slurmrestd client over a unix socket (rest_auth/local) or TCP with a JWT.

The operations are the ones the dispatcher needs (docs/DESIGN.md §3 step 6): submit a
held job, place it (node list + MPS share) and release it, hold, cancel with
a signal, requeue, and read jobs, nodes and partitions. Every Slurm error is
raised as :class:`SlurmRestError` carrying Slurm's own messages.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from executors.slurm.api import AUTO, ApiVersion, api_version, newest_supported
from executors.slurm.errors import (
    SlurmAuthError,
    SlurmErrorEntry,
    SlurmRestError,
    SlurmTransportError,
    SlurmUnsupported,
)
from executors.slurm.models import ControllerPing, Job, Node, Partition, SlurmVersion, SubmitResult
from executors.slurm.settings import SlurmRestSettings
from executors.slurm.spec import BatchJob, JobUpdate

log = logging.getLogger(__name__)

ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2009
ESLURM_INVALID_PARTITION_NAME = 2000

# (job_id, hold) -> None; used where the API version has no requeue endpoint.
RequeueFallback = Callable[[int, bool], None]


class SlurmNotFound(SlurmRestError):
    """The job, node or partition named in the request does not exist."""


class SlurmApi(Protocol):
    """What the dispatcher needs from Slurm; :class:`SlurmRestClient` is the real one."""

    def submit(self, spec: BatchJob) -> SubmitResult: ...
    def get_job(self, job_id: int) -> Job: ...
    def list_jobs(self) -> list[Job]: ...
    def update_job(self, job_id: int, update: JobUpdate) -> None: ...
    def cancel(self, job_id: int, signal: str | None = None) -> None: ...
    def requeue(self, job_id: int, hold: bool = True) -> None: ...
    def clear_gres(self, job_id: int) -> None: ...
    def list_nodes(self) -> list[Node]: ...
    def list_partitions(self) -> list[Partition]: ...


class SlurmRestClient:
    def __init__(self, settings: SlurmRestSettings, *, transport: httpx.BaseTransport | None = None,
                 requeue_fallback: RequeueFallback | None = None):
        self.settings = settings
        # With api_version "auto" the version is the newest the server offers, read from its OpenAPI document
        # on the first request that needs it (one extra GET per client).
        self._api: ApiVersion | None = None if settings.api_version == AUTO else api_version(settings.api_version)
        self.requeue_fallback = requeue_fallback
        if transport is None:
            transport = (httpx.HTTPTransport(uds=settings.unix_socket) if settings.unix_socket
                         else httpx.HTTPTransport())
        base_url = settings.url or "http://slurmrestd"
        self._http = httpx.Client(transport=transport, base_url=base_url, timeout=settings.timeout_s,
                                  headers={"Accept": "application/json"})
        # Requests sent, by HTTP method (failed ones included): what `muxflow bench dispatch` reports.
        self.requests: Counter[str] = Counter()

    # -- plumbing ------------------------------------------------------------
    @property
    def api(self) -> ApiVersion:
        if self._api is None:
            self._api = api_version(newest_supported(self.openapi_spec()))
            log.info("slurmrestd at %s: speaking %s, the newest version it offers", self.settings.endpoint,
                     self._api.name)
        return self._api

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SlurmRestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, body: dict[str, Any] | None = None,
                params: dict[str, str] | None = None) -> dict[str, Any]:
        """One call; the parsed body, or :class:`SlurmRestError` with Slurm's messages."""
        headers = self.settings.auth_headers()
        self.requests[method] += 1
        try:
            resp = self._http.request(method, path, json=body, params=params or None, headers=headers)
        except httpx.TransportError as exc:
            raise SlurmTransportError(f"slurmrestd at {self.settings.endpoint}: {method} {path}: "
                                      f"{exc.__class__.__name__}: {exc}") from exc
        text = resp.text
        if resp.status_code in (401, 403):
            raise SlurmAuthError(method, path, resp.status_code,
                                 [SlurmErrorEntry(message=text.strip() or "authentication failure")],
                                 body_excerpt=text[:300])
        try:
            data = resp.json()
        except (json.JSONDecodeError, ValueError):
            raise SlurmRestError(method, path, resp.status_code, [], body_excerpt=text[:300].strip()) from None
        if not isinstance(data, dict):
            raise SlurmRestError(method, path, resp.status_code, [], body_excerpt=text[:300].strip())
        errors = ApiVersion.parse_errors(data)
        real = [e for e in errors if not e.informational]
        # v0.0.38 answers unparsable bodies with HTTP 200 and a filled errors list.
        if resp.status_code >= 400 or real:
            entries = real or errors
            numbers = {e.number for e in entries}
            cls = SlurmNotFound if numbers & {ESLURM_INVALID_JOB_ID, ESLURM_INVALID_NODE_NAME,
                                              ESLURM_INVALID_PARTITION_NAME} else SlurmRestError
            raise cls(method, path, resp.status_code, entries)
        for w in ApiVersion.parse_warnings(data):
            log.info("slurmrestd %s %s: %s", method, path, w)
        return data

    # -- controller ----------------------------------------------------------
    def ping(self) -> list[ControllerPing]:
        return self.api.parse_pings(self.request("GET", self.api.ping_path()))

    def version(self) -> SlurmVersion:
        return self.api.parse_version(self.request("GET", self.api.ping_path()))

    def diag(self) -> dict[str, Any]:
        """slurmctld statistics (``sdiag``) as served, under ``statistics``."""
        return dict(self.request("GET", self.api.diag_path()).get("statistics") or {})

    def openapi_spec(self) -> dict[str, Any]:
        """The OpenAPI description slurmrestd serves for its loaded plugins."""
        return self.request("GET", "/openapi/v3")

    # -- jobs ----------------------------------------------------------------
    def submit(self, spec: BatchJob) -> SubmitResult:
        data = self.request("POST", self.api.submit_path(), body=self.api.build_submit(spec))
        if data.get("job_id") in (None, 0):
            raise SlurmRestError("POST", self.api.submit_path(), 200, self.api.parse_errors(data),
                                 body_excerpt="submission answered without a job id")
        return self.api.parse_submit(data)

    def get_job(self, job_id: int) -> Job:
        jobs = self.api.parse_jobs(self.request("GET", self.api.job_path(job_id)))
        for job in jobs:
            if job.job_id == int(job_id):
                return job
        raise SlurmNotFound("GET", self.api.job_path(job_id), 200,
                            [SlurmErrorEntry(message=f"job {job_id} not in the response")])

    def list_jobs(self) -> list[Job]:
        """Every job slurmctld knows. An answer without a job list is an error, never "no jobs": the job-state
        sync and the profiler would read every job of the store as gone from the cluster."""
        data = self.request("GET", self.api.jobs_path())
        if not isinstance(data.get("jobs"), list):
            raise SlurmRestError("GET", self.api.jobs_path(), 200, self.api.parse_errors(data),
                                 body_excerpt="job listing answered without a job list")
        return self.api.parse_jobs(data)

    def update_job(self, job_id: int, update: JobUpdate) -> None:
        """One update of a pending job (every field in one request)."""
        self.request("POST", self.api.job_path(job_id), body=self.api.build_update(update))

    def hold(self, job_id: int) -> None:
        self.update_job(job_id, JobUpdate(hold=True))

    def release(self, job_id: int) -> None:
        self.update_job(job_id, JobUpdate(hold=False))

    def place(self, job_id: int, node: str, gres_per_node: str, *, release: bool = True) -> None:
        """Pin a pending job to ``node`` with ``gres_per_node`` (``mps:<pct>``), make it eligible at once
        (a requeued job would otherwise wait ~2 min) and release it, all in one update."""
        self.update_job(job_id, JobUpdate(nodelist=node, gres_per_node=gres_per_node, eligible_now=True,
                                          hold=False if release else None))

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        """Cancel, or with ``signal`` (e.g. ``"USR1"``) only signal the job (batch shell included)."""
        self.request("DELETE", self.api.job_path(job_id), params=self.api.cancel_params(signal))

    def requeue(self, job_id: int, hold: bool = True) -> None:
        """Requeue a running job (held by default, so that MuxFlow places it again).

        No slurmrestd version this client speaks has a requeue operation; the
        ``requeue_fallback`` (e.g. :class:`executors.slurm.scontrol.ScontrolRequeue`)
        does it instead, or :class:`SlurmUnsupported` is raised.
        """
        if self.requeue_fallback is None:
            raise SlurmUnsupported(f"slurmrestd {self.api.name} has no requeue operation and no fallback is "
                                   "configured (use ScontrolRequeue, or cancel and resubmit)")
        self.requeue_fallback(int(job_id), hold)

    def clear_gres(self, job_id: int) -> None:
        """Make a pending job ask for no GRES, which slurmrestd cannot express (the ``gres`` field always sends
        ``gres:<value>``): through the fallback's ``scontrol`` (:meth:`ScontrolRequeue.clear_gres`)."""
        clear = getattr(self.requeue_fallback, "clear_gres", None)
        if clear is None:
            raise SlurmUnsupported(f"slurmrestd {self.api.name} cannot clear a job's GRES and the fallback "
                                   "cannot either (use ScontrolRequeue)")
        clear(int(job_id))

    # -- nodes and partitions ------------------------------------------------
    def list_nodes(self) -> list[Node]:
        return self.api.parse_nodes(self.request("GET", self.api.nodes_path()))

    def get_node(self, name: str) -> Node:
        nodes = self.api.parse_nodes(self.request("GET", self.api.node_path(name)))
        for node in nodes:
            if node.name == name:
                return node
        raise SlurmNotFound("GET", self.api.node_path(name), 200,
                            [SlurmErrorEntry(message=f"node {name} not in the response")])

    def list_partitions(self) -> list[Partition]:
        return self.api.parse_partitions(self.request("GET", self.api.partitions_path()))
