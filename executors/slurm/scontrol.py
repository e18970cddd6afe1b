"""The ``scontrol`` fallback for what slurmrestd cannot do (requeue, in every version up to v0.0.42; clearing a
pending job's GRES and setting its admin comment, in v0.0.38, whose ``gres`` field always sends ``gres:<value>``
and whose job update does not know ``admin_comment``).

It needs Slurm's client commands and a ``slurm.conf`` on the MuxFlow host, and
runs with that host's Slurm identity (munge), not the REST client's.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

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
                 env: Mapping[str, str] | None = None, prefix: Sequence[str] = ()):
        """``prefix``: what runs ``scontrol`` where it is not the host's (the dev cluster's other Slurm release)."""
        self.slurm_conf = slurm_conf
        self.scontrol = scontrol
        self.prefix = list(prefix)
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = slurm_conf

    def __call__(self, job_id: int, hold: bool) -> None:
        self._run([self.scontrol, "requeuehold" if hold else "requeue", str(int(job_id))])

    def clear_gres(self, job_id: int) -> None:
        """``scontrol update JobId=<id> TresPerNode=``: a pending job asks for no GRES.

        Slurm 22.05 refuses to change a job's untyped share (``mps:30``) into a typed one
        (``mps:t4g2:30``: "Invalid GRES specification (with and without type identification)")
        unless the request is cleared first (docs/SLURM.md "One gres Type per GPU").
        """
        self._run([self.scontrol, "update", f"JobId={int(job_id)}", "TresPerNode="])

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """``scontrol update JobId=<id> AdminComment=<text>``: MuxFlow's plan, which only Slurm's administrators can
        write (docs/SLURM.md "Users cannot change the plan"); slurmrestd 22.05 cannot set it."""
        if "\n" in text:
            raise ScontrolError("admin comment: must be one line")
        self._run([self.scontrol, "update", f"JobId={int(job_id)}", f"AdminComment={text}"])

    def _run(self, argv: list[str]) -> None:
        argv = [*self.prefix, *argv]
        rc, _out, msg = run_scontrol(argv, self.env, self.timeout_s)
        if rc != 0:
            raise ScontrolError(f"{' '.join(argv)}: {msg}")
