"""The plan a placement carries to its node: one schema, versioned and signed.

MuxFlow tells a GPU node what to do with an offline job through the job's Slurm ``comment``:

    muxflow-plan=1 slurm=4711 job=12 kind=place gpu=2 pct=35 mem=4294967296 kp=1.0 ki=20.0 kd=0.0 sig=<64 hex>

- the dispatcher writes it when it places a job (``kind=place``: the GPU, the MPS share, the memory quota, xCUDA's
  gains) or opens a job's profiling window (``kind=profile``, with the profiling run's id ``run``);
- the root Prolog verifies it and writes it, as ``key=value`` lines, to the root-owned plan file of the job (the
  TaskProlog reads that file and nothing the job's user can write);
- the node agent verifies it to learn which job runs on which GPU.

``sig`` is an HMAC-SHA256 over every other field, the Slurm job id included, with a key only MuxFlow's service account
and the nodes' root hold. A comment is user-visible and, at submission, user-written: the signature is what makes a
plan MuxFlow's. A plan copied from another job does not verify (its ``slurm`` is the other job's id), nor does one a
user writes himself; either is ignored as if the job had no plan. Writing the comment of a held job needs only
Slurm's Operator level (an admin comment would need Administrator).

This module is stdlib-only: the Prolog runs it with the node's system Python (``python3 muxflow_plan.py prolog …``,
the copy ``muxflow slurm dev-up`` and docs/DEPLOY.md install next to the node scripts).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass

VERSION = "1"
MARKER = "muxflow-plan="  # a comment holding it claims to be a plan (job_submit.lua refuses it from users)
PREFIX = f"{MARKER}{VERSION}"
KINDS = ("place", "profile")
# Every field, the text its value must match, and whether a plan of each kind needs it.
_INT = r"[0-9]{1,19}"
_NUM = r"[0-9][0-9.e+-]{0,31}"
FIELDS: dict[str, str] = {"slurm": _INT, "job": _INT, "kind": "|".join(KINDS), "gpu": r"[0-9]{1,4}",
                          "pct": r"[0-9]{1,3}", "mem": _INT, "kp": _NUM, "ki": _NUM, "kd": _NUM, "run": _INT}
REQUIRED = {"place": ("slurm", "job", "kind", "gpu", "pct"), "profile": ("slurm", "job", "kind", "gpu", "run")}
_TOKEN = re.compile(r"([a-z]+)=(\S+)")
_SIG = re.compile(r"[0-9a-f]{64}")
KEY_BYTES = 32
# The least memory quota a placement carries: below what any real model needs (a CUDA context alone takes more), and
# far from 0, which MPS's pinned memory limit reads as no limit at all.
MIN_MEM_BYTES = 64 * 1024**2


class PlanError(ValueError):
    """A plan that is not MuxFlow's or not well formed; the message says which."""


class KeyFileError(RuntimeError):
    """The plan key's file cannot be used (missing, or open to others); the message names the file and the fix."""


@dataclass(frozen=True)
class Plan:
    """What a node does for one offline job. ``kind`` ``place``: run it on ``gpu`` at ``pct`` % of the SMs with a
    memory quota of ``mem`` bytes and xCUDA's gains; ``profile``: a profiling window alone on ``gpu`` for run
    ``run``."""

    slurm_job_id: int
    job_id: int
    kind: str
    gpu_index: int
    sm_pct: int | None = None
    mem_bytes: int | None = None
    kp: float | None = None
    ki: float | None = None
    kd: float | None = None
    run_id: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PlanError(f"plan: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "place" and (self.sm_pct is None or not 1 <= self.sm_pct <= 100):
            raise PlanError(f"plan: pct must be within 1..100, got {self.sm_pct!r}")
        if self.kind == "place" and self.mem_bytes is not None and self.mem_bytes < MIN_MEM_BYTES:
            raise PlanError(f"plan: mem must be at least {MIN_MEM_BYTES} (64 MiB), got {self.mem_bytes!r}")
        if self.kind == "profile" and self.run_id is None:
            raise PlanError("plan: a profiling window names its run")
        for name in ("slurm_job_id", "job_id", "gpu_index"):
            if getattr(self, name) < 0:
                raise PlanError(f"plan: {name} must not be negative")

    def fields(self) -> dict[str, str]:
        out = {"slurm": str(int(self.slurm_job_id)), "job": str(int(self.job_id)), "kind": self.kind,
               "gpu": str(int(self.gpu_index))}
        if self.sm_pct is not None:
            out["pct"] = str(int(self.sm_pct))
        if self.mem_bytes:
            out["mem"] = str(int(self.mem_bytes))
        for name in ("kp", "ki", "kd"):
            v = getattr(self, name)
            if v is not None:
                out[name] = repr(float(v))  # the shortest text that reads back as the same double (xCUDA: strtod)
        if self.run_id is not None:
            out["run"] = str(int(self.run_id))
        return out

    def file_text(self, node: str) -> str:
        """The root-owned plan file the Prolog writes and the TaskProlog reads: ``key=value`` lines."""
        return "".join(f"{k}={v}\n" for k, v in self.fields().items()) + f"node={node}\n"


def _canonical(fields: dict[str, str]) -> bytes:
    return (PREFIX + " " + " ".join(f"{k}={fields[k]}" for k in sorted(fields))).encode("ascii")


def encode(plan: Plan, key: bytes) -> str:
    """The comment text of ``plan``, signed with ``key``."""
    f = plan.fields()
    sig = hmac.new(key, _canonical(f), hashlib.sha256).hexdigest()
    return " ".join([PREFIX, *(f"{k}={v}" for k, v in f.items()), f"sig={sig}"])


def is_plan_text(comment: str | None) -> bool:
    """Whether a comment claims to be a plan: it holds the marker anywhere, the test job_submit.lua applies to
    users' comments."""
    return MARKER in (comment or "")


def decode(comment: str | None, key: bytes, slurm_job_id: int) -> Plan:
    """The plan in a job's comment, verified: MuxFlow's signature, for this very Slurm job; else :class:`PlanError`."""
    text = (comment or "").strip()
    if not text.startswith(PREFIX + " "):
        raise PlanError("no MuxFlow plan in the comment" if not text.startswith(MARKER)
                        else f"unknown plan version: {text.split()[0]!r}")
    fields: dict[str, str] = {}
    sig = None
    for token in text[len(PREFIX):].split():
        m = _TOKEN.fullmatch(token)
        if m is None:
            raise PlanError(f"plan: malformed field {token[:40]!r}")
        k, v = m.groups()
        if k == "sig":
            sig = v
            continue
        if k not in FIELDS or k in fields:
            raise PlanError(f"plan: {'repeated' if k in fields else 'unknown'} field {k!r}")
        if not re.fullmatch(FIELDS[k], v):
            raise PlanError(f"plan: {k}={v[:40]!r} is not a valid value")
        fields[k] = v
    if sig is None or not _SIG.fullmatch(sig):
        raise PlanError("plan: unsigned")
    want = hmac.new(key, _canonical(fields), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, sig):
        raise PlanError("plan: bad signature (not written by this MuxFlow, or altered)")
    kind = fields.get("kind", "")
    missing = [k for k in REQUIRED.get(kind, ("kind",)) if k not in fields]
    if missing:
        raise PlanError(f"plan: missing {', '.join(missing)}")
    if int(fields["slurm"]) != int(slurm_job_id):
        raise PlanError(f"plan: written for Slurm job {fields['slurm']}, not {slurm_job_id}")
    try:
        return Plan(slurm_job_id=int(fields["slurm"]), job_id=int(fields["job"]), kind=kind,
                    gpu_index=int(fields["gpu"]), sm_pct=int(fields["pct"]) if "pct" in fields else None,
                    mem_bytes=int(fields["mem"]) if "mem" in fields else None,
                    kp=float(fields["kp"]) if "kp" in fields else None,
                    ki=float(fields["ki"]) if "ki" in fields else None,
                    kd=float(fields["kd"]) if "kd" in fields else None,
                    run_id=int(fields["run"]) if "run" in fields else None)
    except ValueError as exc:
        raise PlanError(f"plan: {exc}") from exc


def try_decode(comment: str | None, key: bytes, slurm_job_id: int) -> Plan | None:
    try:
        return decode(comment, key, slurm_job_id)
    except PlanError:
        return None


# -- the key ---------------------------------------------------------------------------------------------------------

def placed_plan(job, key: bytes) -> Plan | None:
    """The verified placement plan in a Slurm job's comment (``job``: anything with ``comment`` and ``job_id``, as
    :class:`executors.slurm.models.Job`), or None: no plan, another kind, not MuxFlow's."""
    p = try_decode(job.comment, key, job.job_id)
    return p if p is not None and p.kind == "place" else None


def read_private_file(path: str | os.PathLike[str], what: str, error: type[Exception] = KeyFileError,
                      hint: str = "") -> str:
    """The text of a secret's file (a key, a token), refused with ``error`` unless it is a regular file, not a link,
    that only its owner can read or change, and its owner is this user or root: whoever reads it acts with it."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{what} {p}: no such file{hint}") from None
    except OSError as exc:
        raise error(f"{what} {p}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {p}: not a regular file")
        if st.st_mode & 0o077:
            raise error(f"{what} {p}: mode {stat.S_IMODE(st.st_mode):04o} lets others read or change it; chmod 600 {p}")
        if st.st_uid not in (os.geteuid(), 0):
            raise error(f"{what} {p}: owned by uid {st.st_uid}, neither this user ({os.geteuid()}) nor root")
        return os.read(fd, 65536).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def read_key(path: str | os.PathLike[str]) -> bytes:
    """The plan key in ``path`` (hex text), refused unless only its owner (this user, or root) can read it."""
    p = os.fspath(path)
    text = read_private_file(p, "plan key", hint=f" (muxflow slurm plan-key --write {p})")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise KeyFileError(f"plan key {p}: not hex text") from None
    if len(key) < KEY_BYTES:
        raise KeyFileError(f"plan key {p}: {len(key)} bytes, at least {KEY_BYTES} needed")
    return key


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def write_key(path: str | os.PathLike[str], key: bytes, uid: int | None = None, gid: int | None = None) -> None:
    """``key`` into ``path`` (replaced atomically, mode 0600; owned by ``uid``/``gid`` when given, which needs root)."""
    p = os.fspath(path)
    tmp = f"{p}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (key.hex() + "\n").encode("ascii"))
        if uid is not None:
            os.fchown(fd, uid, -1 if gid is None else gid)
    finally:
        os.close(fd)
    os.replace(tmp, p)


# -- the Prolog's entry point --------------------------------------------------------------------------------------

def prolog_plan(squeue_json: str, key: bytes, slurm_job_id: int, partitions: set[str]) -> Plan:
    """The verified plan of ``slurm_job_id`` in ``squeue --json`` output (which lists every job on some releases),
    for a job of one of ``partitions``."""
    try:
        jobs = json.loads(squeue_json).get("jobs", [])
    except (ValueError, AttributeError) as exc:
        raise PlanError(f"squeue --json: unreadable ({exc})") from None
    for j in jobs if isinstance(jobs, list) else []:
        if not isinstance(j, dict) or j.get("job_id") != int(slurm_job_id):
            continue
        if not set(str(j.get("partition") or "").split(",")) & partitions:
            raise PlanError(f"job {slurm_job_id} is in partition {j.get('partition')!r}, not {sorted(partitions)}")
        return decode(str(j.get("comment") or ""), key, slurm_job_id)
    raise PlanError(f"job {slurm_job_id} not in squeue's answer")


# -- plan files (written by the root Prolog, read by the TaskProlog, the Epilog and the node agent) -------------------

def read_plan_file(path: str | os.PathLike[str], max_bytes: int = 4096) -> dict[str, str] | None:
    """The ``key=value`` lines of a plan file, or None unless it is a regular file root wrote (owned by root, not
    writable by others, not a link): a file anyone else could have put there is no plan."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return None
        text = os.read(fd, max_bytes).decode("ascii", "replace")
    finally:
        os.close(fd)
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and re.fullmatch(r"[a-z]+", k) and re.fullmatch(r"[0-9A-Za-z._+-]{1,64}", v):
            out[k] = v
    return out


def gpu_caps(plan_dir: str | os.PathLike[str], node: str, gpu_index: int,
             exclude: str | os.PathLike[str] | None = None) -> tuple[int, int | None] | None:
    """The MPS caps of a GPU: the largest share and memory quota among the plans placed on it (a profiling window
    holds the whole GPU: 100 %, no quota), ``exclude`` left out; None when no plan is left on the GPU."""
    best_pct, best_mem, found = 0, 0, False
    skip = os.path.realpath(exclude) if exclude else None
    try:
        names = sorted(os.listdir(plan_dir))
    except OSError:
        return None
    for name in names:
        path = os.path.join(plan_dir, name)
        if not name.endswith(".plan") or os.path.realpath(path) == skip:
            continue
        f = read_plan_file(path)
        if not f or f.get("node") != node or f.get("gpu") != str(int(gpu_index)):
            continue
        found = True
        pct = 100 if f.get("kind") == "profile" else int(f["pct"]) if f.get("pct", "").isdigit() else 0
        best_pct = max(best_pct, pct)
        if f.get("mem", "").isdigit():
            best_mem = max(best_mem, int(f["mem"]))
    return (best_pct, best_mem or None) if found and best_pct else None


def main(argv: list[str] | None = None) -> int:
    """For the node scripts, with the node's system Python:

    - ``plan.py prolog KEYFILE SLURM_JOB_ID PARTITION[,PARTITION…] NODE < squeue.json``: the plan file of the job's
      verified plan (exit 0), or why there is none on stderr (exit 1);
    - ``plan.py caps PLAN_DIR NODE GPU [EXCLUDE]``: ``<pct> <mem>`` for the GPU's MPS caps (``mem`` empty without a
      quota), nothing when no plan is left on the GPU.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 5 and argv[0] == "prolog":
        _, key_path, sid, parts, node = argv
        try:
            plan = prolog_plan(sys.stdin.read(), read_key(key_path), int(sid), set(parts.split(",")))
        except (PlanError, KeyFileError, ValueError) as exc:
            print(str(exc), file=sys.stderr)
            return 1
        sys.stdout.write(plan.file_text(node))
        return 0
    if len(argv) in (4, 5) and argv[0] == "caps":
        try:
            caps = gpu_caps(argv[1], argv[2], int(argv[3]), argv[4] if len(argv) == 5 else None)
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        if caps is not None:
            print(f"{caps[0]} {'' if caps[1] is None else caps[1]}".rstrip())
        return 0
    print("usage: plan.py prolog KEYFILE SLURM_JOB_ID PARTITIONS NODE < squeue.json\n"
          "       plan.py caps PLAN_DIR NODE GPU [EXCLUDE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
