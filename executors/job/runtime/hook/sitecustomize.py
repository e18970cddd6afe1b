"""MuxFlow's iteration hook: the iteration report of a job that imports nothing of MuxFlow.

A job in its profiling window is measured by the node agent, which reads the job's *iteration report* (the
JSON file named by ``MUXFLOW_ITERATION_REPORT``, format ``muxflow-iteration-report/1``, the one
:class:`executors.job.runtime.profiling.ProfileSession` writes). A job written against
:class:`executors.job.runtime.Runtime` writes it itself. This file writes it for every other PyTorch job (a plain
loop, PyTorch Lightning, the Hugging Face Trainer...) without a change to its code: the node's TaskProlog puts
the directory of this file first on ``PYTHONPATH``, so the job's Python (whatever interpreter, venv or conda
env: this file uses the standard library only and never imports MuxFlow) imports it at start-up as
``sitecustomize``.

**Off unless asked.** Without ``MUXFLOW_ITERATION_REPORT`` (or when imported under another name than
``sitecustomize``) it installs nothing: it reads one environment variable and chains (below). Nothing ever
raises out of it: an error of its own switches it off for the rest of the process, with at most one line on
stderr (``muxflow iteration hook: ...``).

**What it hooks.** A global optimizer step post-hook (``torch.optim.optimizer.
register_optimizer_step_post_hook``, torch >= 2.0; an older torch: one line on stderr, no report). Torch is
never imported by the hook: a finder at the front of ``sys.meta_path`` waits for the job's own import of
``torch.optim.optimizer`` (which ``import torch`` does), wraps that one module's loader (the original loader
is put back on the module and its spec before the module runs) and registers the hook right after the module
has executed; then the finder takes itself out of ``sys.meta_path``. A job that never imports torch pays one
string comparison per import and writes nothing.

**What an iteration is.** One ``step()`` of the first optimizer object that steps (held by a weak reference;
when it has been garbage-collected, the next optimizer that steps takes its place). Steps of any other
optimizer are not counted, so a GAN-style loop whose two optimizers both step every iteration counts one
iteration per iteration; with gradient accumulation an iteration is one optimizer step (k micro-batches). A
step that is skipped (``GradScaler`` on an overflow) or replayed in a CUDA graph is not seen: that time goes
into the next counted iteration. An iteration lasts from the previous counted step to this one
(``time.perf_counter``); the first one from the moment ``torch.optim.optimizer`` was loaded. As in
``ProfileSession``, the first ``MUXFLOW_PROFILE_WARMUP`` (default 2) iterations are left out of the
statistics (kept when nothing else is there), and at most 10,000 iterations are recorded (then recording stops;
the report stays and is still rewritten).

**The report.** The same fields as ``ProfileSession.report()`` in observe mode (``observed: true``,
``last_step``/``max_iterations``/``max_seconds`` null, ``started_unix`` when this hook started in this
process, ``window_*_unix`` derived from the monotonic clock so that the window never ends before it starts)
plus ``"signal": "optimizer-step"``; every number finite and >= 0, or null. It is written atomically (a
temporary file in the same directory, then ``os.replace``; never a directory made, never a link followed) at
the first counted step, then at most once a second from within a step, and once more at exit (``atexit``,
``final: true``, ``stopped_by: "finished"``) -- only by a process that has counted a step. Before that, once the
step hook is registered, an *announcement* (the report with no iteration, ``total_iterations: 0``) is published
where no report exists yet (a hard link of the temporary file: it never replaces one): it tells the profiler that
steps will be counted, so a job still starting up is given the time to its first step; it holds nothing (any
process that steps replaces it, none defers to it). A process killed by
a signal (Slurm's SIGTERM: the hook installs no signal handler) leaves its last progress report, at most a
second old. Any ``OSError`` on writing (an unwritable path, a missing directory) switches the hook off for the
rest of the process; the job runs on.

**Only the main process writes.**

- The hook records its pid when it installs; a forked child (a ``DataLoader`` worker, ``os.fork()``) is
  switched off by ``os.register_at_fork`` and by that pid check, so it neither counts nor writes, at exit
  neither.
- A new Python process started by the job (``subprocess``, multiprocessing *spawn*, ``torchrun``'s workers)
  inherits the environment and installs its own hook. It writes only once it has counted a step (so a worker
  that never steps never writes), and before each write it reads the report on disk: when that report is not
  final and was written by another process of this host that is still alive, started before this one
  (``started_unix``, then the pid) and has counted a step, this process goes quiet for good. So the
  earliest-started process that steps -- the job's main process -- holds the report; a launcher that never
  steps (its announcement holds nothing) leaves it to its worker. (Pid reuse by an unrelated live process that
  started earlier could make a later run defer wrongly; a final report or a dead pid never holds it.)

**Deferring to MuxFlow's runtime.** ``executors.job.runtime.Runtime`` in observe mode writes the report itself and
sets ``MUXFLOW_ITERATION_REPORT_OWNER`` to the report's path when its observer starts; the hook checks that
variable before every write and at every step, and goes quiet for good once it names this report. A value that
names another path (inherited through ``sbatch``'s environment from a process that observed another report) is
not this report's owner and is ignored.

**What it never does.** It only reads clocks, its environment variables and its own report file: it does not
touch the optimizer (it is never stepped, nor kept alive), the parameters, the gradients, the RNG state, torch's
threads, the warnings filters or signal handlers, and it never removes its step hook while a step may be
running (switched off, the hook returns at once). A job computes bit for bit the same with it as without it.

**Chaining.** Python imports only the first ``sitecustomize`` on ``sys.path``, so this file would hide the
distribution's or the user's own. After installing itself it looks for the next one the way Python would
(``importlib.machinery.PathFinder`` over each ``sys.path`` entry in order, skipping this file's directory and
this very file): a ``.py``, a ``.pyc`` or an extension module. When there is one it is loaded as a fresh module
named ``sitecustomize`` from its own spec (``importlib.util.module_from_spec``, the spec's loader), put in
``sys.modules['sitecustomize']`` in place of this module before it runs (so ``import sitecustomize`` anywhere
later gets it, as without MuxFlow) and executed; this module stays reachable as
``sys.modules['_muxflow_iteration_hook']`` once installed. An exception from it is reported as ``site`` does
(``Error in sitecustomize; set PYTHONVERBOSE for traceback:`` and the error, or the traceback under ``-v``; an
``ImportError`` of the name ``sitecustomize`` is ignored) and this module is put back. Chaining happens with or
without ``MUXFLOW_ITERATION_REPORT``. ``usercustomize`` needs nothing: Python imports it separately. A
``sitecustomize`` placed on ``PYTHONPATH`` *before* this directory is imported instead of this one (no report
unless it chains too); ``python -S``/``-I`` import none.
"""

import os

ENV_REPORT = "MUXFLOW_ITERATION_REPORT"
ENV_OWNER = "MUXFLOW_ITERATION_REPORT_OWNER"
ENV_WARMUP = "MUXFLOW_PROFILE_WARMUP"
REPORT_FORMAT = "muxflow-iteration-report/1"  # executors.job.runtime.profiling.REPORT_FORMAT
SIGNAL = "optimizer-step"
KEEP = 10000  # iterations recorded at most (executors.job.runtime.profiling.OBSERVE_KEEP)
PROGRESS_S = 1.0  # the report is rewritten at most this often while iterating
MAX_READ = 256 * 1024
_TARGET = "torch.optim.optimizer"
_ALIAS = "_muxflow_iteration_hook"
_hook = None  # this process's _Hook, once installed


def _say(what, tail="; iterations are not reported"):
    """The hook's one line on stderr."""
    try:
        import sys

        sys.stderr.write("muxflow iteration hook: %s%s\n" % (what, tail))
    except Exception:
        pass


def _num(x):
    """A finite number >= 0 as a float, else None (the node agent refuses anything else)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if 0.0 <= x <= 1e15 else None  # NaN fails both comparisons


def _percentile(xs, q):
    """Linear-interpolated percentile of sorted ``xs`` (executors.job.runtime.timing.percentile)."""
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError, ValueError):
        return False
    return True


class _Hook(object):
    """The state of one process's hook: its counted steps and its report."""

    def __init__(self, path, warmup):
        import _thread
        import time

        self.path = path
        self.warmup = warmup
        self.perf = time.perf_counter
        self.pid = os.getpid()
        self.t0 = self.perf()          # when the hook installed (elapsed_s)
        self.wall0 = time.time()       # the same moment on the wall clock (started_unix)
        self.start = None              # when torch.optim.optimizer was loaded: the first iteration's start
        self.ends = []                 # perf_counter at each counted step (at most KEEP)
        self.first_id = None           # the counted optimizer: id and weak reference
        self.first_ref = None
        self.last_write = None
        self.quiet = False             # for good: switched off, forked, deferring
        self.registered = False
        self.lock = _thread.allocate_lock()
        self.host = os.uname().nodename if hasattr(os, "uname") else ""

    # --- installing -------------------------------------------------------------------------------------
    def install(self):
        import atexit
        import sys

        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)
        atexit.register(self.at_exit)
        loaded = sys.modules.get(_TARGET)
        if loaded is not None:
            self.register(loaded)
        else:
            sys.meta_path.insert(0, _Finder(self))

    def register(self, module):
        """Register the step hook on the just-executed ``torch.optim.optimizer``; never raises."""
        if self.registered or self.quiet:
            return
        self.registered = True
        try:
            import sys

            for f in list(sys.meta_path):
                if isinstance(f, _Finder) and f.hook is self:
                    sys.meta_path.remove(f)
            register = getattr(module, "register_optimizer_step_post_hook", None)
            if register is None:
                self.off("this torch has no global optimizer step hook (torch >= 2.0 has)")
                return
            import json  # noqa: F401 -- loaded now, not in the job's first iteration
            import weakref  # noqa: F401

            self.start = self.perf()
            register(self.on_step)
        except Exception as exc:
            self.off("cannot register the optimizer step hook: %r" % (exc,))
            return
        self.announce()

    def announce(self):
        """Say that steps will be counted: the report with no iteration yet, written only where there is no
        report (a process that steps already holds it), so that the profiler gives a job still starting up
        (importing, loading data, compiling) the time to its first step rather than judging it by GPU activity."""
        if self.quiet or self.owned():
            return
        import json

        data = (json.dumps(self.report(False), indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
        try:
            tmp = self._tmp_with(data, False)
        except OSError as exc:
            self.off("cannot write %s: %s" % (self.path, exc.strerror or exc))
            return
        try:
            os.link(tmp, self.path)  # never replaces: a report there stays
        except OSError:
            pass  # one is there (or this file system has no hard links): no announcement, steps still count
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def owned(self):
        """MuxFlow's runtime writes this very report (it names the report's path in the owner variable; a value
        inherited from elsewhere, another window or the shell that ran sbatch, names another path or none)."""
        owner = os.environ.get(ENV_OWNER)
        return bool(owner) and os.path.normpath(owner) == os.path.normpath(self.path)

    def _forked(self):
        self.quiet = True

    def off(self, why=None):
        # Never remove the hook from torch's table here: a step may be iterating over it.
        self.quiet = True
        if why:
            _say(why)

    # --- counting ---------------------------------------------------------------------------------------
    def on_step(self, optimizer, args, kwargs):
        """torch's global optimizer step post-hook: reads the clock, and once a second writes the report."""
        if self.quiet:
            return
        try:
            now = self.perf()
            if os.getpid() != self.pid or self.owned():
                self.quiet = True
                return
            oid = id(optimizer)
            if oid != self.first_id:
                if self.first_id is not None and (self.first_ref is None or self.first_ref() is not None):
                    return  # another optimizer than the counted one
                import weakref

                self.first_id = oid
                try:
                    self.first_ref = weakref.ref(optimizer)
                except TypeError:
                    self.first_ref = None
            if len(self.ends) < KEEP:
                self.ends.append(now)
            if self.last_write is None or now - self.last_write >= PROGRESS_S:
                self.last_write = now
                self.write(final=False, wait=False)
        except Exception as exc:
            self.off("%r" % (exc,))

    def at_exit(self):
        if self.quiet or not self.ends:
            return
        try:
            self.write(final=True, wait=True)
        except Exception as exc:
            self.off("%r" % (exc,))

    # --- the report -------------------------------------------------------------------------------------
    def report(self, final):
        ends = list(self.ends)
        start = self.start if self.start is not None else self.t0
        durations = [b - a for a, b in zip([start] + ends[:-1], ends)]
        n = len(durations)
        left_out = self.warmup if n > self.warmup else 0
        xs = sorted(durations[left_out:])
        stats = [None] * 5
        if xs:
            import math

            stats = [math.fsum(xs) / len(xs), _percentile(xs, 50), _percentile(xs, 95), xs[0], xs[-1]]

        def wall(t):
            return self.wall0 + (t - self.t0)

        window_start = wall(ends[left_out] - durations[left_out]) if xs else None
        window_end = wall(ends[-1]) if xs else None
        return {
            "format": REPORT_FORMAT,
            "final": bool(final),
            "stopped_by": "finished" if final else None,
            "iterations": len(xs),
            "warmup_iterations": left_out,
            "total_iterations": n,
            "mean_s": _num(stats[0]),
            "p50_s": _num(stats[1]),
            "p95_s": _num(stats[2]),
            "min_s": _num(stats[3]),
            "max_s": _num(stats[4]),
            "first_iteration_s": _num(durations[0]) if durations else None,
            "elapsed_s": _num(self.perf() - self.t0),
            "window_start_unix": _num(window_start),
            "window_end_unix": _num(window_end),
            "started_unix": _num(self.wall0),
            "last_step": None,
            "observed": True,
            "max_iterations": None,
            "max_seconds": None,
            "host": self.host,
            "pid": self.pid,
            "signal": SIGNAL,
        }

    def may_write(self):
        """Whether this process writes the report now; going quiet for good when it must not."""
        if self.quiet:
            return False
        if os.getpid() != self.pid or self.owned():
            self.quiet = True
            return False
        if not self.ends:
            return False
        if self._held_by_senior():
            self.quiet = True
            return False
        return True

    def _held_by_senior(self):
        """The report on disk is another live process's (not final) that started before this one."""
        import json

        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags)
        except OSError:
            return False
        try:
            if (os.fstat(fd).st_mode & 0o170000) != 0o100000:  # not a regular file
                return False
            data = os.read(fd, MAX_READ)
        except OSError:
            return False
        finally:
            os.close(fd)
        try:
            rep = json.loads(data.decode("utf-8"))
        except Exception:
            return False
        if not isinstance(rep, dict) or rep.get("final") is True or not rep.get("total_iterations"):
            return False  # a final report, or one that only announced steps, holds nothing
        pid, started = rep.get("pid"), rep.get("started_unix")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == self.pid:
            return False
        if rep.get("host") == self.host and not _alive(pid):
            return False
        if not isinstance(started, (int, float)) or isinstance(started, bool):
            return False
        return (started, pid) < (self.wall0, self.pid)

    def write(self, final, wait):
        if not (self.lock.acquire(True, 5.0) if wait else self.lock.acquire(False)):
            return  # another thread is writing it
        try:
            if not self.may_write():
                return
            import json

            data = (json.dumps(self.report(final), indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
            try:
                os.replace(self._tmp_with(data, final), self.path)
            except OSError as exc:
                try:
                    os.unlink(self._tmp_path())
                except OSError:
                    pass
                self.off("cannot write %s: %s" % (self.path, exc.strerror or exc))
        finally:
            self.lock.release()

    def _tmp_path(self):
        head, name = os.path.split(self.path)
        return os.path.join(head, ".%s.tmp.%d" % (name, self.pid))

    def _tmp_with(self, data, sync):
        """A temporary file beside the report holding ``data`` (never through a link); its path."""
        tmp = self._tmp_path()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp


class _Finder(object):
    """Waits for ``torch.optim.optimizer`` to be imported, and has the hook registered right after it runs."""

    def __init__(self, hook):
        self.hook = hook
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET or self.busy:
            return None
        self.busy = True
        try:
            import sys

            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return None  # Python finds it again, as without the hook
            spec.loader = _Loader(loader, spec, self.hook)
            return spec
        except Exception:
            return None
        finally:
            self.busy = False

    def invalidate_caches(self):
        pass


class _Loader(object):
    """The module's own loader, which registers the hook once the module has executed."""

    def __init__(self, loader, spec, hook):
        self.loader = loader
        self.spec = spec
        self.hook = hook

    def create_module(self, spec):
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        # The module runs with its own loader in place, as without the hook.
        self.spec.loader = self.loader
        try:
            module.__loader__ = self.loader
        except Exception:
            pass
        self.loader.exec_module(module)
        self.hook.register(module)

    def __getattr__(self, name):
        if name in ("loader", "spec", "hook"):  # not set yet (a copy): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def _install():
    global _hook
    path = os.environ.get(ENV_REPORT, "").strip()
    if not path:
        return
    try:
        import sys

        warmup = os.environ.get(ENV_WARMUP, "").strip()
        try:
            warmup = int(warmup) if warmup else 2
        except ValueError:
            warmup = 2
        hook = _Hook(os.path.abspath(path), max(0, warmup))
        hook.install()
        _hook = hook
        sys.modules[_ALIAS] = sys.modules[__name__]
    except Exception as exc:
        _say("cannot install: %r" % (exc,))


def _real(p):
    return os.path.normcase(os.path.realpath(p))


def _chain():
    """Run the next ``sitecustomize`` on ``sys.path``, the one Python would have run without this one."""
    import sys

    me = sys.modules.get(__name__)
    try:
        from importlib.machinery import PathFinder

        mine = _real(__file__)
        here = os.path.dirname(mine)
        spec = None
        for entry in list(sys.path):
            if not isinstance(entry, str) or _real(entry or os.curdir) == here:
                continue
            try:
                spec = PathFinder.find_spec("sitecustomize", [entry])
            except Exception:
                spec = None
            if spec is None or spec.loader is None:
                spec = None
                continue
            if spec.origin and _real(spec.origin) == mine:
                spec = None
                continue
            break
        if spec is None:
            return
        import importlib.util

        module = importlib.util.module_from_spec(spec)
    except Exception as exc:
        _say("cannot look for the next sitecustomize: %r" % (exc,), tail="")
        return
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # as site.execsitecustomize reports it
        sys.modules["sitecustomize"] = me  # the import of this module must end with a module of its name
        if isinstance(err, ImportError) and getattr(err, "name", None) == "sitecustomize":
            return
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
                             % (err.__class__.__name__, err))
    except BaseException:
        sys.modules["sitecustomize"] = me
        raise


if __name__ == "sitecustomize":
    try:
        _install()
    finally:
        _chain()
