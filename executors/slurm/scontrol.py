"""The ``scontrol`` fallback for what slurmrestd cannot do (requeue, in v0.0.38 and v0.0.40).

It needs Slurm's client commands and a ``slurm.conf`` on the MuxFlow host, and
runs with that host's Slurm identity (munge), not the REST client's.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from executors.slurm.errors import SlurmError


class ScontrolError(SlurmError):
    pass


def run_scontrol(argv: list[str], env: Mapping[str, str], timeout_s: float) -> tuple[int, str, str]:
    """(exit status, stdout, the message to show: stderr, else stdout, else the status).

    :class:`ScontrolError` when the command cannot be run or does not finish in time.
    """
    try:
        out = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ScontrolError(f"{' '.join(argv)}: {exc}") from exc
    msg = (out.stderr or out.stdout).strip() or f"exit status {out.returncode}"
    return out.returncode, out.stdout, msg


class ScontrolRequeue:
    """``scontrol requeuehold <id>`` (or ``requeue``): a :data:`RequeueFallback` for the REST client."""

    def __init__(self, slurm_conf: str | None = None, *, scontrol: str = "scontrol", timeout_s: float = 30.0,
                 env: Mapping[str, str] | None = None):
        self.slurm_conf = slurm_conf
        self.scontrol = scontrol
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = slurm_conf

    def __call__(self, job_id: int, hold: bool) -> None:
        argv = [self.scontrol, "requeuehold" if hold else "requeue", str(int(job_id))]
        rc, _out, msg = run_scontrol(argv, self.env, self.timeout_s)
        if rc != 0:
            raise ScontrolError(f"{' '.join(argv)}: {msg}")
