"""Many recordings at once: the points of a :func:`~fakeviz.sweep`, a :func:`~fakeviz.fit`, the probes of
:func:`~fakeviz.max_batch` / :func:`~fakeviz.max_seq` and the distinct rank classes of a parallel plan run on any
:class:`concurrent.futures.Executor` (``executor=``): a process pool on this machine, or a dask.distributed
``Client(...).get_executor()`` on a cluster.

Note: [points on an executor]
Each point is independent: what goes to a worker is a picklable description (the model's name, folder or
config, never a live module; the point's settings; the GPUs) and a function of fakeviz's to run it with, passed
by reference (pickle names it; the worker imports it). What comes back is the record as the bytes of a ``.fvz``
file (:meth:`fakeviz.Trace.to_bytes`), never a pickled record or tensor, loaded back in the parent with every
check of the format; the plan around it comes back without its fake module (``Plan.module`` is None: the worker's
fake tensors stay in the worker). A worker keeps the model it built for the next point of the same build (one
model alive at a time, as a sequential sweep does). A point that raises is a :class:`Failed` in its place (the
error's type and text, and its partial record where the error carries one): the other points go on. A worker
process that dies (killed for memory) breaks a process pool: the points queued on it fail the same way (their
error names the broken pool), and the default's points not yet sent run in this process.

The figures are the same as one point after another in this process (``tests/frontends/test_executors.py``
checks peaks and bytes exactly): a point's record depends on its settings and its build only (Note: [one fake
mode per sweep] in :mod:`fakeviz._frontends.planning`: what an earlier point leaves alive is carried in as
existing before it, not recorded).

Note: [the default executor]
``executor=None`` runs the first point here and times it. A worker process costs seconds before its first
point (``spawn``: a fresh interpreter imports torch, transformers and fakeviz; then it builds the model), so a pool
is started only when the remaining points, run one after another, would take longer than :data:`POOL_AFTER_S`
(a sweep of a small model stays in this process, as before). It starts as soon as that is known, while the first
point still runs (a timer: once the first point has taken ``POOL_AFTER_S / points left``), so that the workers'
start-up overlaps it. The pool then holds ``os.cpu_count() - 1``
processes and this process runs points too (it is idle otherwise): ``os.cpu_count()`` recordings at once. It is
made with the ``spawn`` context (``fork`` after torch has started threads is unsafe), kept across the points of
one call, and shut down before the call returns. ``executor=False`` (or one core) runs every point here, one
after another; a module passed as the model runs here too (it cannot be sent to a worker; :func:`note` says so);
so does the default when the environment has ``FAKEVIZ_EXECUTOR=serial`` (or ``0``: for a test suite whose
processes already use every core, e.g. under pytest-xdist, where a pool would only oversubscribe them).
An executor the caller gives is used as given (every point submitted to it) and left running.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import multiprocessing
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .._core.errors import ArgumentError

__all__ = ["POOL_AFTER_S", "Failed", "Runner", "error_text", "failed_row", "search_largest", "worker_cache"]

POOL_AFTER_S = 8.0  # start a pool when the points left would take longer than this one after another
_CONTEXT = "spawn"
_SERIAL = ("0", "false", "no", "off", "serial")  # FAKEVIZ_EXECUTOR values that make the default one at a time


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
    """``executor`` is None, False, or a :class:`concurrent.futures.Executor` (refused otherwise)."""
    if executor is None or executor is False or isinstance(executor, cf.Executor):
        return
    raise ArgumentError("executor", executor, "not an executor",
                        "Give a concurrent.futures.Executor (a ProcessPoolExecutor, a dask Client(...).get_executor()),"
                        " None (a process pool over this machine's cores when the points are slow enough to pay for "
                        "it) or False (one point after another in this process).")  # fmt: skip


def note(model: Any, executor: Any) -> str:
    """Why the points run in this process, or ""."""
    if executor is False:
        return "executor=False: one point after another in this process"
    if isinstance(model, torch.nn.Module):
        return ("the model is a module, which cannot be sent to another process: every point ran in this process "
                "(give its name, folder or config to run points at once)")  # fmt: skip
    if executor is None and os.environ.get("FAKEVIZ_EXECUTOR", "").strip().lower() in _SERIAL:
        return f"FAKEVIZ_EXECUTOR={os.environ['FAKEVIZ_EXECUTOR']}: one point after another in this process"
    if executor is None and (os.cpu_count() or 1) < 2:
        return "one core: one point after another in this process"
    if executor is None and getattr(_WORKER, "on", False):
        return "a worker's own points (a fit's parallel plan, its rank classes) run in the worker: no pool in a pool"
    return ""


# --------------------------------------------------------------------------------------- the worker side
_CACHE: dict[Any, Any] = {}
_WORKER = threading.local()  # .on: this thread runs a point for another process (:func:`_run`)


def worker_cache(key: Any, make: Callable[[], Any]) -> Any:
    """In a worker: the value made for ``key`` by the last point (the built model), or ``make()`` (the last one
    dropped first: one model alive at a time)."""
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = make()
    return _CACHE[key]


# The user's line of an op recorded in a worker: the worker runs no line of the user's, and the spawn bootstrap's
# ``<string>:1`` would read as a line of user code; so a point runs from this one line, named for what it is.
_IN_WORKER = compile("result = fn(*args)", "<fakeviz worker>", "exec")


def _run(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    """What a worker runs: ``fn(*args)`` with its record(s) as ``.fvz`` bytes (``("ok", result)``), or
    ``("error", (text, partial record bytes or None))``."""
    _WORKER.on = True
    try:
        space = {"fn": fn, "args": args}
        exec(_IN_WORKER, space)  # noqa: S102 - our own constant code: ops report this line as their user's
        return "ok", _pack(space["result"])
    except Exception as exc:  # noqa: BLE001 - reported in the point's row, never fatal for the others
        partial = getattr(exc, "trace", None)
        return "error", (error_text(exc), partial.to_bytes() if partial is not None else None)


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


# --------------------------------------------------------------------------------------- the parent side
@dataclass
class Runner:
    """The executor of one call (:func:`~fakeviz.sweep`, :func:`~fakeviz.fit`, ...), kept across its rounds of
    points: ``run(...)`` one round; ``close()`` shuts down a pool it made (it is a context manager). ``remote``
    says whether points may leave this process (False for a module, ``executor=False``, one core)."""

    executor: Any = None
    remote: bool = True
    pool: Any = None
    owned: bool = False
    note: str = ""
    points: int = field(default=0)  # points run so far, here or in workers
    in_workers: int = field(default=0)  # of them, in workers
    point_s: float | None = None  # the default's timed first point (Note: [the default executor])
    broken: bool = False  # a worker of our pool died: no more points go to it
    workers: int = 0

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.owned and self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool, self.owned = None, False

    @property
    def where(self) -> str:
        """Where the points ran, in words (``df.attrs["executor"]``)."""
        if self.note:
            return self.note
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

    def width(self, expected: int) -> int:
        """How many points one round should hold when about ``expected`` more will follow one after another
        (:func:`search_largest`): 1 where they run here; the workers (and this process) otherwise."""
        cores = os.cpu_count() or 1
        if not self.remote:
            return 1
        if self.given:
            return max(2, int(getattr(self.executor, "_max_workers", 0) or cores))
        if self.pool is not None:
            return self.workers + 1
        if self.point_s is None or cores < 2 or self.point_s * expected < POOL_AFTER_S:
            return 1
        return cores

    def run(self, tasks: list[Any], *, local: Callable[[Any], Any], remote: Callable[..., Any], shared: Any = None,
            progress: Callable[[int, Any], None] | None = None, done: int = 0, total: int | None = None,
            expected: int = 0) -> list[Any]:  # fmt: skip
        """Run ``tasks``: ``local(task)`` here, ``remote(shared, task)`` in a worker (a module-level function: it is
        pickled by name). Returns the results in the tasks' order, a :class:`Failed` for a task that raised in a
        worker (here: raised, as one point after another always did). ``progress(i, result)`` after each.
        ``expected``: the points still to come after these, one round after another (a pool pays for them too)."""
        total = len(tasks) if total is None else total
        results: list[Any] = [None] * len(tasks)
        count = [done]

        def finished(i: int, r: Any) -> None:
            results[i] = r
            count[0] += 1
            self.points += 1
            if progress is not None:
                progress(count[0], r)

        todo = collections.deque(range(len(tasks)))
        if not self.remote or not todo:
            for i in todo:
                finished(i, local(tasks[i]))
            return results
        if self.given:
            self._submit_all(tasks, todo, remote, shared, finished)
            return results
        inflight: dict[cf.Future[Any], int] = {}
        if self.pool is None:  # the default: a point here, timed (Note: [the default executor])
            if self.point_s is None:
                i = todo.popleft()
                left = max(len(todo), expected)
                lock = threading.Lock()

                def early() -> None:  # the point is slow: the pool starts (and takes points) while it runs
                    with lock:
                        if todo:
                            self._start_pool()
                            self._submit(tasks, todo, remote, shared, inflight)

                timer = threading.Timer(POOL_AFTER_S / max(1, left), early)
                timer.daemon = True
                if todo and (os.cpu_count() or 1) >= 2:
                    timer.start()
                t0 = time.perf_counter()
                try:
                    finished(i, local(tasks[i]))
                finally:
                    timer.cancel()
                    with lock:  # an early start under way is finished first
                        self.point_s = time.perf_counter() - t0
            if self.pool is None:
                if (os.cpu_count() or 1) < 2 or self.point_s * max(len(todo), expected) < POOL_AFTER_S:
                    for i in todo:
                        finished(i, local(tasks[i]))
                    return results
                self._start_pool()
        self._share(tasks, todo, local, remote, shared, finished, inflight)
        return results

    def _submit(self, tasks: list[Any], todo: collections.deque[int], remote: Callable[..., Any], shared: Any,
                inflight: dict[cf.Future[Any], int]) -> None:  # fmt: skip
        """Queue points from the front of ``todo`` until each worker has two."""
        while todo and len(inflight) < 2 * self.workers and not self.broken:
            try:
                fut = self.pool.submit(_run, remote, (shared, tasks[todo[0]]))
                inflight[fut] = todo.popleft()
            except cf.BrokenExecutor:  # a worker died: its queued points fail, the rest run in this process
                self.broken = True

    def _submit_all(self, tasks: list[Any], todo: Iterator[int], remote: Callable[..., Any], shared: Any,
                    finished: Callable[[int, Any], None]) -> None:  # fmt: skip
        futures: dict[cf.Future[Any], int] = {}
        for i in todo:
            try:
                futures[self.executor.submit(_run, remote, (shared, tasks[i]))] = i
            except (cf.BrokenExecutor, RuntimeError) as exc:  # broken, or shut down: this point fails, not the call
                settings = tasks[i] if isinstance(tasks[i], dict) else {"task": tasks[i]}
                finished(i, Failed(settings, error_text(exc)))
        for fut in cf.as_completed(futures):
            finished(futures[fut], self._result(fut, tasks[futures[fut]]))
            self.in_workers += 1

    def _share(self, tasks: list[Any], todo: collections.deque[int], local: Callable[[Any], Any],
               remote: Callable[..., Any], shared: Any, finished: Callable[[int, Any], None],
               inflight: dict[cf.Future[Any], int]) -> None:  # fmt: skip
        """The default pool's workers take points from the front, this process from the back; each worker has one
        more point queued so that it never waits while this process records."""
        while todo or inflight:
            self._submit(tasks, todo, remote, shared, inflight)
            if todo and self.broken:
                i = todo.popleft()
                finished(i, local(tasks[i]))
                ready = [f for f in inflight if f.done()]
            elif todo:
                i = todo.pop()
                finished(i, local(tasks[i]))
                ready = [f for f in inflight if f.done()]
            else:
                ready = list(cf.wait(inflight, return_when=cf.FIRST_COMPLETED).done)
            for fut in ready:
                i = inflight.pop(fut)
                finished(i, self._result(fut, tasks[i]))
                self.in_workers += 1

    @staticmethod
    def _result(fut: cf.Future[Any], task: Any) -> Any:
        from .._trace import Trace

        settings = task if isinstance(task, dict) else {"task": task}
        try:
            status, value = fut.result()
        except Exception as exc:  # noqa: BLE001 - the worker died or could not run it: this point fails, not the call
            return Failed(settings, error_text(exc))
        if status == "error":
            text, partial = value
            return Failed(settings, text, Trace.load(partial) if partial is not None else None)
        return _unpack(value)


def runner(model: Any, executor: Any) -> Runner:
    """The :class:`Runner` for ``executor`` (checked) and ``model`` (a module runs here: :func:`note`)."""
    check(executor)
    why = note(model, executor)
    if why and isinstance(executor, cf.Executor):
        warnings.warn(f"executor= is not used: {why}", stacklevel=3)
    return Runner(executor=executor, remote=not why, note=why)


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
