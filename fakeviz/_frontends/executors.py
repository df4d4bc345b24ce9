"""Many recordings at once: the points of a :func:`~fakeviz.sweep`, a :func:`~fakeviz.fit`, the probes of
:func:`~fakeviz.max_batch` / :func:`~fakeviz.max_seq` and the distinct rank classes of a parallel plan run one
after another in this process (the default), on a pool over this machine's cores (``executor="processes"``), or
on any :class:`concurrent.futures.Executor` given as ``executor=`` (a dask.distributed
``Client(...).get_executor()`` on a cluster): Note: [the default executor].

Note: [points on an executor]
Each point is independent: what goes to a worker is a picklable description (the model's name, folder or
config, never a live module; the point's settings; the GPUs) and a function of fakeviz's to run it with, passed
by reference (pickle names it; the worker imports it). What comes back is the record as the bytes of a ``.fvz``
file (:meth:`fakeviz.Trace.to_bytes`), never a pickled record or tensor, loaded back in the parent with every
check of the format; the plan around it comes back without its fake module (``Plan.module`` is None: the worker's
fake tensors stay in the worker). A worker keeps the model it built for the next point of the same build (one
model alive at a time, as a sequential sweep does). A worker runs each point from a line compiled to be the
caller's own (file, line and function of the user's call, :func:`_caller`), so its ops report the user line they
report when the point runs here. A point that raises is a :class:`Failed` in its place (Note: [failing points]).
A worker process that dies (killed for memory) breaks a process pool: the points sent to it fail the same way
(their error names the broken pool), and the points ``"processes"`` had not yet sent run in this process.

The figures are the same as one point after another in this process (``tests/frontends/test_executors.py``
checks peaks and bytes exactly): a point's record depends on its settings and its build only (Note: [one fake
mode per sweep] in :mod:`fakeviz._frontends.plan_stages`: what an earlier point leaves alive is carried in as
existing before it, not recorded).

Note: [failing points]
A point fails the same way wherever it runs (this process, a pool's worker, a cluster): an exception raised while
it runs is that point's, a :class:`Failed` in its place (the error's type and first line, and its partial record
where the error carries one; a sweep's row has ``fits`` False and the error in ``error`` and ``first fails``), and
the other points go on. The user's errors are what the call refuses before its first point (a sweep's axes and
every value it can check alone: sizes, optimizer, checkpointing, offload, quantization, LoRA, training with
new tokens, sequence lengths; ``gpus``,
``executor``, ``rank_by``): they raise, and no point runs. Whatever is raised once a point runs is that point's,
whatever its type: an :class:`~fakeviz._core.errors.ArgumentError` too (a point of :func:`~fakeviz.fit` that raises one is
a row saying so), since the points of :func:`~fakeviz.fit` and of the searches are fakeviz's own choices, and an error
here and none in a worker (or the reverse) would make the answer depend on where a point ran. A value that can be
refused before the points belongs in the call's checks. ``KeyboardInterrupt`` and ``SystemExit`` are no
``Exception``: they end the call. A probe of :func:`~fakeviz.max_batch` that raises ends the search: it
needs every probe's answer, so it raises the probe's error (the exception itself when the probe ran here):
a probe that failed for another reason than memory says nothing about memory, and counting it as "does not fit"
would lower the answer in silence.

Note: [the default executor]
``executor=None`` (the default) runs every point in this process, one after another, as ``executor=False`` does
(the two are one setting). It starts no process: a user's script needs no ``if __name__ == "__main__":`` guard,
nothing runs twice, and a small sweep pays no worker's start-up (``spawn``: a fresh interpreter imports torch,
transformers and fakeviz, about 3 s of CPU, then builds the model).

``executor="processes"`` asks for a pool over this machine's cores. It uses them only when it pays: the first point
runs here (the longest by :func:`cost`) and is timed, and a pool starts when the remaining points, one after
another, would take longer than :data:`POOL_AFTER_S` (by the first point's time, or by its ops): a sweep of a small
model stays in this process. It starts as soon as that is known, while the first point still runs (a timer: once
the first point has taken ``POOL_AFTER_S / points left``), so that the workers' start-up overlaps it. The pool then
holds ``os.cpu_count() - 1`` processes and this process runs points too (it is idle otherwise): ``os.cpu_count()``
recordings at once. They share one queue, longest first (LPT: a long point started last would leave the others
idle): one feeder thread per worker sends it the next point the moment it is free, and this process takes the
next one after each of its own, so no point waits queued behind a busy worker. The pool is made with the
``spawn`` context (``fork`` after torch has started threads is unsafe), kept across the rounds of one call, and
shut down before the call returns. What is recorded never depends on a clock; only where a point runs does. Which
points a sweep or a fit records is fixed by its arguments; the rounds of :func:`~fakeviz.max_batch` /
:func:`~fakeviz.max_seq` (:func:`search_largest`) are one probe wide until the first probe has run (here), then
``os.cpu_count()`` wide when its recorded ops (ops x recordings x :data:`OP_S` seconds, an estimate for this kind
of CPU) say the probes left would take longer than :data:`POOL_AFTER_S` one after another, else one wide, as with
the default. A round of one probe always runs here, planned exactly as the default plans it (the last probe's
placement costs reused); in a wider round no probe reuses another's, wherever it runs
(``tests/frontends/test_executors.py``). On one core, in a worker of a pool (no pool in a pool), or with a module
as the model (it cannot be sent to another process: :func:`note` says so), the points run here.

Note: [the main guard]
A ``spawn`` worker imports the script that started this process (``__main__``) as ``__mp_main__`` before it runs
anything: a script whose module code calls ``fv.sweep(..., executor="processes")`` outside an
``if __name__ == "__main__":`` block would run again, from the top, in every worker. :func:`check` refuses that
call before any worker starts (:func:`_unguarded`): it finds the ``__main__`` module's own frame on the stack and
reads, with :mod:`ast`, whether the line it is running lies inside such a block. A ``__main__`` without a file (a
notebook, ``python -c``, the REPL) or a package's ``__main__.py`` (``python -m pkg``: multiprocessing does not run
it again) is safe; ``python -m pkg.script`` runs ``pkg.script`` again in a worker, and is checked as a file. An
executor the caller gives is used as given (every point submitted to it, rounds as wide as its workers) and left
running: its workers and their start are the caller's.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import multiprocessing
import os
import queue
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._core.errors import ArgumentError

__all__ = [
    "OP_S",
    "POOL_AFTER_S",
    "Failed",
    "Runner",
    "cost",
    "error_text",
    "failed_row",
    "search_largest",
    "worker_cache",
]

POOL_AFTER_S = 8.0  # start a pool when the points left would take longer than this one after another
clock = time.perf_counter  # what times "processes"' first point (a test makes the machine seem loaded)
OP_S = 1.1e-4  # seconds one recorded op takes, about (70B training step: 19,592 ops x 2 recordings in 4.1-4.9 s)
_CONTEXT = "spawn"
PROCESSES = "processes"  # executor= that asks for a pool over this machine's cores (Note: [the default executor])


@dataclass
class Failed:
    """A point that raised: ``error`` (its type and first lines), ``trace`` (the partial record it left, labelled
    incomplete by its ``error``; None when there was none), ``settings`` (the point's). It never fits."""

    settings: dict[str, Any]
    error: str
    trace: Any = None
    fits: bool = False
    speed: Any = None
    recordings: int = 0
    first_oom: Any = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)  # raised here; None in a worker

    def reraise(self) -> None:
        """Raise the point's error where one answer needs every point (:func:`~fakeviz.max_batch`): the exception
        itself when the point ran here, else a ``RuntimeError`` with the worker's text."""
        if self.exception is not None:
            raise self.exception
        raise RuntimeError(f"a point failed in a worker ({self.settings}): {self.error}")

    @property
    def fit_text(self) -> str:
        return f"failed: {self.error}"

    def __repr__(self) -> str:
        return f"Failed({self.settings}): {self.error}"


def failed_row(point: dict[str, Any], f: Failed) -> dict[str, Any]:
    """A sweep's row for a failed point: its settings, ``fits`` False and the error as where it first fails."""
    return {**{k: (str(v) if k == "dtype" else v) for k, v in point.items()}, "fits": False, "first fails": f.error,
            "error": f.error}  # fmt: skip


def check(executor: Any) -> None:
    """``executor`` is None or False (one point after another here), ``"processes"`` (refused where the workers
    would run the user's script again: Note: [the main guard]) or a :class:`concurrent.futures.Executor`."""
    if executor is None or executor is False or isinstance(executor, cf.Executor):
        return
    if isinstance(executor, str) and executor == PROCESSES:
        where = _unguarded()
        if where is not None:
            file, line = where
            raise ArgumentError("executor", executor,
                                f"called from {os.path.basename(file)} line {line}, outside an "
                                "`if __name__ == \"__main__\":` block: each worker process would run the script again"
                                " from the top",
                                "Put the call (and what it needs) under `if __name__ == \"__main__\":` to run the "
                                "points on this machine's cores, or leave executor out to run them here one after "
                                "another.")  # fmt: skip
        return
    raise ArgumentError("executor", executor, "not an executor",
                        "Give None (the default: one point after another in this process; False is the same), "
                        f"{PROCESSES!r} (a pool over this machine's cores when the points are slow enough to pay for "
                        "it) or a concurrent.futures.Executor (a ProcessPoolExecutor, a dask "
                        "Client(...).get_executor()).")  # fmt: skip


def _unguarded() -> tuple[str, int] | None:
    """The file and line of ``__main__``'s module code that is running outside an ``if __name__ == "__main__":``
    block, when a ``spawn`` worker would run that file again; None when it would not (Note: [the main guard])."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if main is None or path is None or name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None  # no file (a notebook, python -c), or a package's __main__.py: a worker imports nothing of it
    if name is None and os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None  # multiprocessing leaves the ipython command's script alone
    f = sys._getframe(1)
    while f is not None and not (f.f_globals is main.__dict__ and f.f_code.co_name == "<module>"):
        f = f.f_back
    if f is None:
        return None  # the script's module code is not running (a thread, an atexit hook): nothing runs it again
    file, line = f.f_code.co_filename, f.f_lineno
    return None if _guarded(file, line) else (file, line)


def _guarded(file: str, line: int) -> bool:
    """Whether ``line`` of ``file`` lies inside an ``if __name__ == "__main__":`` block (or the ``else`` of
    ``__name__ != "__main__"``); a file that cannot be read or parsed counts as guarded (nothing to refuse on)."""
    import ast
    import tokenize

    try:
        with tokenize.open(file) as fh:
            tree = ast.parse(fh.read(), file)
    except (OSError, SyntaxError, ValueError):
        return True

    def is_main(test: ast.expr, op: type[ast.cmpop]) -> bool:  # `__name__ == "__main__"` (op Eq), either way round
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and op is ast.Eq:
            return any(is_main(v, op) for v in test.values)  # `... and __name__ == "__main__"`: only in __main__
        if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], op):
            return False
        sides = [test.left, *test.comparators]
        return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
            isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
        )

    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        body = node.body if is_main(node.test, ast.Eq) else node.orelse if is_main(node.test, ast.NotEq) else []
        if body and body[0].lineno <= line <= (body[-1].end_lineno or body[-1].lineno):
            return True
    return False


def note(model: Any, executor: Any) -> str:
    """Why the points of an ``executor`` that may send them elsewhere run in this process, or "" (also for the
    default, whose points always run here: :attr:`Runner.where` says so)."""
    if executor is None:
        return ""
    if executor is False:
        return "executor=False: one point after another in this process"
    if isinstance(model, torch.nn.Module):
        return ("the model is a module, which cannot be sent to another process: every point ran in this process "
                "(give its name, folder or config to run points at once)")  # fmt: skip
    if executor == PROCESSES and (os.cpu_count() or 1) < 2:
        return "one core: one point after another in this process"
    if executor == PROCESSES and getattr(_WORKER, "on", False):
        return "a worker's own points (a fit's parallel plan, its rank classes) run in the worker: no pool in a pool"
    return ""


# --------------------------------------------------------------------------------------- the worker side
_CACHE: dict[Any, Any] = {}
_WORKER = threading.local()  # .on: this thread runs a point for another process (:func:`_run`)
_IMPORTED = time.time()  # in a worker: when fakeviz (torch, transformers) had been imported
_BUILD_S = [0.0]  # seconds the last point spent in :func:`worker_cache`'s make (the model's build)


def worker_cache(key: Any, make: Callable[[], Any]) -> Any:
    """In a worker: the value made for ``key`` by the last point (the built model), or ``make()`` (the last one
    dropped first: one model alive at a time)."""
    if key not in _CACHE:
        _CACHE.clear()
        t0 = time.perf_counter()
        _CACHE[key] = make()
        _BUILD_S[0] += time.perf_counter() - t0
    return _CACHE[key]


# The user's line of an op recorded in a worker: the worker runs no line of the user's (the spawn bootstrap's
# ``<string>:1`` would read as one), so a point runs there from a line compiled to be the caller's own (its file, line
# number and function name, :func:`_caller`): each op reports the same user line as when the point runs here, and a
# point's record does not depend on where it ran. Without a caller (none outside fakeviz, torch and the standard
# library), ``<fakeviz point>:1``.
_FAKEVIZ = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_INTERNAL = (_FAKEVIZ, os.path.dirname(os.path.realpath(torch.__file__)))
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
_CODES: dict[tuple[str, int, str], Any] = {}


def _caller() -> tuple[str, int, str] | None:
    """The innermost frame of the user's (not fakeviz's, torch's or the standard library's): file, line, name."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        real = fn if fn.startswith("<") else os.path.realpath(fn)
        std = real.startswith(_STDLIB) and "-packages" not in real
        if not (real.startswith(_INTERNAL) or fn.startswith("<frozen") or std):
            return fn, f.f_lineno, f.f_code.co_name
        f = f.f_back
    return None


def _call(fn: Callable[..., Any], args: tuple[Any, ...], caller: tuple[str, int, str] | None) -> Any:
    """``fn(*args)`` called from ``caller``'s line (a code object made for it, kept for the next point)."""
    key = caller or ("<fakeviz point>", 1, "<module>")
    code = _CODES.get(key)
    if code is None:
        file, line, name = key
        code = _CODES[key] = compile("\n" * (line - 1) + "result = fn(*args)", file, "exec").replace(co_name=name)
    space = {"fn": fn, "args": args}
    exec(code, space)  # noqa: S102 - our own constant code: ops report this line as their user's
    return space["result"]


def _run(
    fn: Callable[..., Any], args: tuple[Any, ...], caller: tuple[str, int, str] | None = None
) -> tuple[str, Any, dict[str, Any]]:
    """What a worker runs: ``fn(*args)`` (from ``caller``'s line: :func:`_call`) with its record(s) as ``.fvz``
    bytes (``("ok", result, info)``), or ``("error", (text, partial record bytes or None), info)``; ``info``: the
    worker's pid, when it had imported fakeviz, when the point started and ended (``time.time()``), and the seconds
    its model build took."""
    _WORKER.on = True
    _BUILD_S[0] = 0.0
    info: dict[str, Any] = {"pid": os.getpid(), "imported": _IMPORTED, "start": time.time()}
    try:
        out: tuple[str, Any] = "ok", _pack(_call(fn, args, caller))
    except Exception as exc:  # noqa: BLE001 - reported in the point's row, never fatal for the others
        partial = getattr(exc, "trace", None)
        out = "error", (error_text(exc), partial.to_bytes() if partial is not None else None)
    return (*out, {**info, "end": time.time(), "build_s": _BUILD_S[0]})


def _pack(result: Any) -> Any:
    """A record as bytes; an object holding one (a plan) with its record as bytes and without its fake module."""
    if hasattr(result, "to_bytes") and hasattr(result, "ops"):
        return _Packed(result.to_bytes())
    if hasattr(result, "trace") and hasattr(result, "__dataclass_fields__"):
        import dataclasses

        extra = {"module": None} if "module" in result.__dataclass_fields__ else {}
        return dataclasses.replace(result, trace=_Packed(result.trace.to_bytes()), **extra)
    return result


@dataclass
class _Packed:
    data: bytes


def _unpack(result: Any) -> Any:
    from .._trace import Trace

    if isinstance(result, _Packed):
        return Trace.load(result.data)
    if isinstance(getattr(result, "trace", None), _Packed):
        result.trace = Trace.load(result.trace.data)
    return result


def error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = text.splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def _settings(task: Any) -> dict[str, Any]:
    return task if isinstance(task, dict) else {"task": task}


def cost(task: Any) -> float:
    """A point's relative cost, for the order ``"processes"`` runs points in (longest first, Note: [the default
    executor]): a guess at its recorded ops from the settings a sweep's or fit's points carry (a training step
    about three forwards; checkpointing one forward more; generation one forward per new token). Batch and
    sequence barely change a fake recording's time (measured: 70B, batch 1 x 1024 and 8 x 2048, 4.1-4.9 s each)."""
    if not isinstance(task, dict):
        return 1.0
    c = 1.0 + int(task.get("new_tokens") or 0)
    if task.get("train"):
        c *= 3.0
    if task.get("checkpointing") not in (None, False, 0):
        c *= 4.0 / 3.0
    return c


def _ops(result: Any) -> int | None:
    """The ops a point recorded (its record's ops times its recordings), or None when it has no single record."""
    trace = getattr(result, "trace", result)
    n = getattr(trace, "num_ops", None)
    if not isinstance(n, int) or isinstance(result, Failed):
        return None
    return n * max(1, int(getattr(result, "recordings", 1) or 1))


# --------------------------------------------------------------------------------------- the parent side
TIMELINES: list[dict[str, Any]] | None = None  # set to a list to collect each Runner's timeline (benchmarks)


@dataclass
class Runner:
    """The executor of one call (:func:`~fakeviz.sweep`, :func:`~fakeviz.fit`, ...), kept across its rounds of
    points: ``run(...)`` one round; ``close()`` shuts down a pool it made (it is a context manager). ``remote``
    says whether points may leave this process (``executor="processes"`` or a given executor; False for the
    default, ``executor=False``, a module, one core)."""

    executor: Any = None
    remote: bool = True
    pool: Any = None
    owned: bool = False
    note: str = ""
    points: int = field(default=0)  # points run so far, here or in workers
    in_workers: int = field(default=0)  # of them, in workers
    point_s: float | None = None  # "processes"' timed first point (Note: [the default executor])
    point_ops: int | None = None  # the ops it recorded: what "processes"' round widths depend on
    broken: bool = False  # a worker of our pool died: no more points go to it
    workers: int = 0
    timeline: dict[str, Any] = field(default_factory=lambda: {"t0": time.time(), "points": []})
    caller: tuple[str, int, str] | None = None  # the user's line the call came from (:func:`_call`)
    _feeders: list[threading.Thread] = field(default_factory=list, repr=False)
    _out: queue.SimpleQueue[tuple[int, Any]] = field(default_factory=queue.SimpleQueue, repr=False)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.owned and self.pool is not None:
            t0 = time.time()  # every point is back: the workers exit in the background (their teardown took 15 s
            self.pool.shutdown(wait=False, cancel_futures=True)  # of a 70B sweep's wall time under load, when awaited)
            self.timeline["shutdown_s"] = time.time() - t0
        self.pool, self.owned = None, False
        if TIMELINES is not None and self.timeline["points"]:
            TIMELINES.append({**self.timeline, "where": self.where})

    @property
    def where(self) -> str:
        """Where the points ran, in words (``df.attrs["executor"]``)."""
        if self.note:
            return self.note
        if not self.remote:
            return f"in this process, one point after another (executor={PROCESSES!r} uses this machine's cores)"
        if self.in_workers == 0:
            return "in this process, one point after another" + (
                f" (the first point took {self.point_s:.1f} s: a worker pool would not pay for itself)"
                if self.point_s is not None and self.points > 1 else "")  # fmt: skip
        if self.given:
            return f"{self.in_workers} of {self.points} points on {type(self.executor).__name__}"
        return (f"{self.in_workers} of {self.points} points in a pool of {self.workers} worker processes, the rest in "
                "this process")  # fmt: skip

    @property
    def given(self) -> bool:
        return isinstance(self.executor, cf.Executor)

    def _start_pool(self) -> None:
        self.workers = max(1, (os.cpu_count() or 1) - 1)
        ctx = multiprocessing.get_context(_CONTEXT)
        self.pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx)
        self.owned = True
        self.timeline["pool_started"] = time.time()

    def _slow(self, left: int) -> bool:
        """Whether ``left`` more points, one after another, would take longer than :data:`POOL_AFTER_S` by the
        first point's recorded ops (never by a clock: Note: [the default executor])."""
        return self.point_ops is not None and self.point_ops * OP_S * left >= POOL_AFTER_S

    def width(self, expected: int) -> int:
        """How many points one round should hold when about ``expected`` more will follow one after another
        (:func:`search_largest`): 1 where they run here; the workers (and this process) otherwise. ``"processes"``'
        width depends on the first point's recorded ops and the cores, never on how long anything took."""
        cores = os.cpu_count() or 1
        if not self.remote:
            return 1
        if self.given:
            return max(2, int(getattr(self.executor, "_max_workers", 0) or cores))
        return cores if cores >= 2 and self._slow(expected) else 1

    def _here(self, local: Callable[[Any], Any], task: Any) -> Any:
        """``local(task)`` in this process; a point that raises is a :class:`Failed`, as in a worker."""
        t0 = time.time()
        try:
            return local(task)
        except Exception as exc:  # noqa: BLE001 - a point's error is its row's, never fatal (Note: [failing points])
            return Failed(
                _settings(task), error_text(exc), getattr(exc, "trace", None), exception=exc.with_traceback(None)
            )  # no frames kept alive in df.attrs
        finally:
            self.timeline["points"].append({"where": "here", "start": t0, "end": time.time()})

    def run(self, tasks: list[Any], *, local: Callable[[Any], Any], remote: Callable[..., Any], shared: Any = None,
            progress: Callable[[int, Any], None] | None = None, done: int = 0, total: int | None = None,
            expected: int = 0) -> list[Any]:  # fmt: skip
        """Run ``tasks``: ``local(task)`` here, ``remote(shared, task)`` in a worker (a module-level function: it is
        pickled by name). Returns the results in the tasks' order, a :class:`Failed` for a task that raised, here or
        in a worker (Note: [failing points]). ``progress(i, result)`` after each. ``expected``: the points still to
        come after these, one round after another (a pool pays for them too). No task, no work: ``[]`` (a
        parallel plan whose ranks after rank 0 all stand in has no class left to record)."""
        if not tasks:
            return []
        total = len(tasks) if total is None else total
        results: list[Any] = [None] * len(tasks)
        count = [done]

        def finished(i: int, r: Any) -> None:
            results[i] = r
            count[0] += 1
            self.points += 1
            if progress is not None:
                progress(count[0], r)

        if not self.remote:
            for i, task in enumerate(tasks):
                finished(i, self._here(local, task))
            return results
        if len(tasks) == 1 and not self.given:  # a lone point runs here, timed: Note [the default executor]
            for i, task in enumerate(tasks):
                finished(i, self._timed(local, task) if self.point_s is None else self._here(local, task))
            self._maybe_start(expected)
            return results
        if self.given:
            self._submit_all(tasks, remote, shared, finished)
            return results
        todo = collections.deque(sorted(range(len(tasks)), key=lambda i: -cost(tasks[i])))  # longest first
        lock = threading.Lock()
        if self.pool is None and self.point_s is None:  # "processes": a point here, timed (Note: [the default ...])
            i = todo.popleft()
            left = max(len(todo), expected)
            over = [False]

            def early() -> None:  # the point is slow: the pool starts (and takes points) while it runs
                with lock:
                    if todo and not over[0]:
                        self._start_pool()
                        self._feed(tasks, todo, remote, shared, lock)

            timer = threading.Timer(POOL_AFTER_S / max(1, left), early)
            timer.daemon = True
            if todo and (os.cpu_count() or 1) >= 2:
                timer.start()
            try:
                finished(i, self._timed(local, tasks[i]))
            finally:
                timer.cancel()
                with lock:  # an early start under way is finished first; none starts after this
                    over[0] = True
        if self.pool is None:
            assert self.point_s is not None
            left = max(len(todo), expected)
            if (os.cpu_count() or 1) < 2 or (self.point_s * left < POOL_AFTER_S and not self._slow(left)):
                for i in todo:
                    finished(i, self._here(local, tasks[i]))
                return results
            with lock:
                self._start_pool()
        self._share(tasks, todo, local, remote, shared, finished, lock)
        return results

    def _timed(self, local: Callable[[Any], Any], task: Any) -> Any:
        t0 = clock()
        r = self._here(local, task)
        self.point_s, self.point_ops = clock() - t0, _ops(r)
        return r

    def _maybe_start(self, expected: int) -> None:
        """After a lone point of ``"processes"``: start the pool now when rounds of points are expected."""
        cores = os.cpu_count() or 1
        if self.remote and not self.given and self.pool is None and cores >= 2 and self.width(expected) > 1:
            self._start_pool()

    def _feed(self, tasks: list[Any], todo: collections.deque[int], remote: Callable[..., Any], shared: Any,
              lock: threading.Lock) -> None:  # fmt: skip
        """One feeder thread per worker: each takes the next point from the front of ``todo`` when its worker is
        free, so that a worker never waits for this process and none holds a queued point at the end."""
        while len(self._feeders) < self.workers:
            t = threading.Thread(target=self._feeder, args=(tasks, todo, remote, shared, lock), daemon=True)
            self._feeders.append(t)
            t.start()

    def _feeder(self, tasks: list[Any], todo: collections.deque[int], remote: Callable[..., Any], shared: Any,
                lock: threading.Lock) -> None:  # fmt: skip
        while True:
            with lock:
                if not todo or self.broken or self.pool is None:
                    return
                i = todo.popleft()
                pool = self.pool
            try:
                fut = pool.submit(_run, remote, (shared, tasks[i]), self.caller)
            except cf.BrokenExecutor:  # a worker died before: this point was not sent; it runs in this process
                with lock:
                    self.broken = True
                    todo.appendleft(i)
                return
            except RuntimeError:  # shut down: the call is over (it raised)
                return
            r, info = self._result(fut, tasks[i])
            self.timeline["points"].append({"where": "worker", **info})
            self._out.put((i, r))
            if isinstance(r, Failed) and "BrokenProcessPool" in r.error:
                self.broken = True
                return

    def _share(self, tasks: list[Any], todo: collections.deque[int], local: Callable[[Any], Any],
               remote: Callable[..., Any], shared: Any, finished: Callable[[int, Any], None],
               lock: threading.Lock) -> None:  # fmt: skip
        """``"processes"``' workers (through their feeders) and this process take points from the front of
        ``todo``, longest first, as each is free; this process reports every result as it comes."""
        with lock:
            self._feed(tasks, todo, remote, shared, lock)

        def drain(block: bool) -> None:
            while True:
                try:
                    i, r = self._out.get(block=block, timeout=0.05 if block else None)
                except queue.Empty:
                    return
                finished(i, r)
                self.in_workers += 1

        while True:
            with lock:
                i = todo.popleft() if todo else None
            if i is None:
                break
            finished(i, self._here(local, tasks[i]))
            drain(False)
        while any(t.is_alive() for t in self._feeders) or not self._out.empty():
            drain(True)
            with lock:  # points a broken pool left unsent run here
                rest = [todo.popleft() for _ in range(len(todo))] if self.broken else []
            for i in rest:
                finished(i, self._here(local, tasks[i]))
        self._feeders = []

    def _submit_all(self, tasks: list[Any], remote: Callable[..., Any], shared: Any,
                    finished: Callable[[int, Any], None]) -> None:  # fmt: skip
        futures: dict[cf.Future[Any], int] = {}
        for i, task in enumerate(tasks):
            try:
                futures[self.executor.submit(_run, remote, (shared, task), self.caller)] = i
            except (cf.BrokenExecutor, RuntimeError) as exc:  # broken, or shut down: this point fails, not the call
                finished(i, Failed(_settings(task), error_text(exc)))
        for fut in cf.as_completed(futures):
            r, info = self._result(fut, tasks[futures[fut]])
            self.timeline["points"].append({"where": "worker", **info})
            finished(futures[fut], r)
            self.in_workers += 1

    @staticmethod
    def _result(fut: cf.Future[Any], task: Any) -> tuple[Any, dict[str, Any]]:
        """A worker's point back: its result (or a :class:`Failed`) and its timings (:func:`_run`'s ``info``)."""
        from .._trace import Trace

        try:
            status, value, info = fut.result()
        except Exception as exc:  # noqa: BLE001 - the worker died or could not run it: this point fails, not the call
            return Failed(_settings(task), error_text(exc)), {}
        if status == "error":
            text, partial = value
            return Failed(_settings(task), text, Trace.load(partial) if partial is not None else None), info
        return _unpack(value), info


def runner(model: Any, executor: Any) -> Runner:
    """The :class:`Runner` for ``executor`` (checked) and ``model`` (a module runs here: :func:`note`)."""
    check(executor)
    why = note(model, executor)
    asked = executor == PROCESSES or isinstance(executor, cf.Executor)
    if asked and isinstance(model, torch.nn.Module):
        warnings.warn(f"executor={executor!r} is not used: {why}", stacklevel=3)
    return Runner(executor=executor, remote=asked and not why, note=why, caller=_caller())


def search_largest(
    probe: Callable[[list[int]], list[bool]], limit: int, width: Callable[[int], int]
) -> tuple[int, int]:
    """The largest value in 1..``limit`` that fits, by rounds of ``probe(values) -> fits`` (fitting is monotone:
    what fits at ``v`` fits below it): doubling from 1 (the limit itself last), then bisection, each round
    ``width(rounds left)`` values at once (the doubling phase's next values; the interval cut in ``width + 1``
    parts). ``width`` 1 is one value after another, the classic search. Returns ``(lo, hi)``: ``lo`` fits (0:
    none does), ``hi`` fails (``limit + 1``: none up to the limit)."""
    lo, hi, v = 0, None, 1
    while hi is None:
        w = width(max(1, limit.bit_length() - v.bit_length() + 1))
        values = sorted({min(v << k, limit) for k in range(w)})
        for x, ok in zip(values, probe(values)):
            if not ok:
                hi = x
                break
            lo = x
        if hi is None and lo == limit:
            hi = limit + 1
        v = lo * 2
    while hi - lo > 1:
        w = width(max(1, (hi - lo).bit_length() - 1))
        values = sorted({lo + (hi - lo) * j // (w + 1) for j in range(1, w + 1)} - {lo, hi})
        results = probe(values)
        fitting = [x for x, ok in zip(values, results) if ok]
        failing = [x for x, ok in zip(values, results) if not ok]
        hi = min([hi, *failing])
        lo = max([lo, *(x for x in fitting if x < hi)])
    return lo, hi
