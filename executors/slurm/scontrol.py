"""The ``scontrol`` fallback for what slurmrestd cannot do (requeue, in every version up to v0.0.42; clearing a
pending job's GRES in v0.0.38, whose ``gres`` field always sends ``gres:<value>``).

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


class SbatchAsCaller:
    """``sbatch`` as the process that runs it: how ``muxflow submit`` sends a job to Slurm, so the job belongs to
    (and runs as) whoever submitted it, with that user's environment, as a plain ``sbatch`` would; never with
    MuxFlow's REST identity. Returns the job id; :class:`ScontrolError` with sbatch's own words otherwise."""

    def __init__(self, slurm_conf: str | None = None, *, sbatch: str = "sbatch", timeout_s: float = 60.0,
                 env: Mapping[str, str] | None = None):
        self.sbatch = sbatch
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = slurm_conf

    def __call__(self, spec) -> int:
        """Submit ``spec`` (an :class:`executors.slurm.spec.BatchJob`; its script on sbatch's standard input)."""
        argv = [self.sbatch, "--parsable", "-p", spec.partition, "-J", spec.name]
        if spec.hold:
            argv.append("--hold")
        if spec.gres_per_node:
            argv.append(f"--gres={spec.gres_per_node}")
        if spec.comment:
            argv.append(f"--comment={spec.comment}")
        if spec.working_dir:
            argv.append(f"--chdir={spec.working_dir}")
        try:
            out = subprocess.run(argv, input=spec.script, env=self.env, capture_output=True, text=True,
                                 timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ScontrolError(f"sbatch: {exc}") from exc
        if out.returncode != 0:
            raise ScontrolError("sbatch: " + ((out.stderr or out.stdout).strip() or f"exit status {out.returncode}"))
        first = out.stdout.strip().split(";")[0]
        if not first.isdigit():
            raise ScontrolError(f"sbatch: answered {out.stdout.strip()[:200]!r}, not a job id")
        return int(first)


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

    def _run(self, argv: list[str]) -> None:
        argv = [*self.prefix, *argv]
        rc, _out, msg = run_scontrol(argv, self.env, self.timeout_s)
        if rc != 0:
            raise ScontrolError(f"{' '.join(argv)}: {msg}")
