"""``torch.export`` on fake tensors, recorded like any other run, and a failed export explained in plain words.

:func:`export_program` exports a model whose parameters are fake (made under ``fakeviz.fake_mode`` or
``fakeviz.record``), meta or real, placed on cpu, on a fake cuda device or on both, with
``torch.export.export``, inside the recorder. It returns an :class:`ExportRun`: the ``ExportedProgram``
(or None), the record of the export, and on failure the exception and a short reason (what failed, the
user's line, what to change). The facade (``fakeviz._export``) turns it into ``fakeviz.check_export``'s
result.

Note: [export under the recorder]
Non-strict ``torch.export`` fakifies the inputs, parameters and buffers into a fake mode and traces the
forward under it. It makes that mode itself, unless a ``TracingContext`` is active: then it takes the
context's (what it does when dynamo calls it). A fake mode of its own would displace the recorder's
(there is one slot for the fake dispatch mode), and the recorder would see no op. So:

* a :class:`~fakeviz._engine.recorder.FakeSession` makes the recorder's mode before recording starts, and
  it is set up the way export sets up its own: a ShapeEnv that tracks fakes (``tracked_fakes = []``,
  ``trace_asserts``, the model's ``co_fields`` for messages) and ``export=True`` (0-d cpu tensors are not
  turned into constants);
* the model is copied into that mode with :func:`~fakeviz._engine.session.fakeify` (a real, a meta or a
  fake model of another mode alike; the user's model is never modified; ties survive), meta tensors are
  then placed on ``device``, and each parameter and buffer of the copy is memoised as its own fake, so
  export's fakification hands back the very tensors the recorder registered instead of a second copy of
  the weights;
* export runs inside ``record(session=..., modules=[copy])`` and ``tracing(TracingContext(mode))``.

Strict export (TorchDynamo) cannot trace through the recorder's global module hooks (they are Python
that dynamo inlines and refuses), so with ``strict=True`` the record is that of the same model exported
non-strict, and the strict export runs after it, unrecorded, on the same fake copy.

Known limitations
-----------------
* The record names parameter storages as export's wrapper module sees them
  (``Wrapper._export_root.fc1.weight``); op rows carry the model's own module paths (``MLP.fc1``).
* The program's tensors belong to the session's fake mode (:attr:`ExportRun.mode`): to run
  ``program.module()`` on fake inputs, make them in that mode (``with run.mode:``).
"""

from __future__ import annotations

import contextlib
import io
import linecache
import logging
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._guards import TracingContext, tracing

from .._core.errors import DataDependentError
from .._core.record import Record
from .fx import is_user_file, user_frames
from .recorder import FakeSession, record
from .session import DATA_DEPENDENT_ERRORS, check_device, fakeify, new_fake_mode

__all__ = ["ExportRun", "export_program", "user_frame"]


@dataclass
class ExportRun:
    """What :func:`export_program` did.

    Attributes:
        program: the ``torch.export.ExportedProgram``, None when the export failed.
        record: the export, recorded (a ``record_cls``); ``record.error`` is set when it stopped early.
        error: the exception torch raised (its ``__cause__`` chain kept), None on success.
        kind: what failed: ``"data-dependent"``, ``"device mismatch"``, ``"graph break"``,
            ``"dynamic shapes"``, ``"no fake kernel"`` or ``"other"``; None on success.
        reason: at most about 15 lines in plain words: what failed, the user's line, what to change.
        user_line: ``"file:line in function"`` of the user's code where it failed, if found.
        log: what torch printed or logged while exporting (kept out of the user's output).
        model: the fake copy that was exported.
        mode: the fake mode the copy's tensors and the program's belong to.
        strict: whether the program comes from a strict (TorchDynamo) export.
    """

    program: Any
    record: Record
    error: BaseException | None = None
    kind: str | None = None
    reason: str | None = None
    user_line: str | None = None
    log: str = ""
    model: Any = None
    mode: Any = None
    strict: bool = False

    @property
    def ok(self) -> bool:
        return self.program is not None and self.error is None


def export_program(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    device: str | torch.device | None = None,
    record_cls: type[Record] = Record,
) -> ExportRun:
    """Export ``model`` with ``torch.export.export`` on fake tensors, recorded; never raises for a failed export.

    Args:
        model: an ``nn.Module`` with fake, meta or real parameters, on cpu, a (fake) cuda device, or both.
        args: positional example inputs (fake, meta or real tensors; real ones are never read).
        kwargs: keyword example inputs.
        dynamic_shapes: passed to ``torch.export.export``.
        strict: export with TorchDynamo (``strict=True``) or by running the Python (default).
        device: where meta parameters, buffers and inputs are placed (default ``"cpu"``); others stay put.
        record_cls: the record class to fill (the facade passes ``fakeviz.Trace``).

    Returns:
        An :class:`ExportRun`. No fake mode is active afterwards, whether the export worked or not.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``args`` is not a tuple.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"check_export takes an nn.Module, not {type(model).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple of example inputs, not {type(args).__name__}: write (x,)")
    place = torch.device(device) if device is not None else torch.device("cpu")
    check_device(place)
    session = FakeSession(symbolic=True)
    mode = _export_ready(session.mode, model)
    copy, fargs, fkwargs = _fake_copy(model, args, kwargs or {}, mode, place)
    recording = record(session=session, modules=[copy], record_cls=record_cls)
    run = ExportRun(program=None, record=recording.trace, model=copy, mode=mode, strict=strict)
    program: Any = None
    with _captured_output() as log:
        try:
            with recording, tracing(TracingContext(mode)), _fake_rules_for(type(mode)):
                program = torch.export.export(copy, fargs, fkwargs, dynamic_shapes=dynamic_shapes, strict=False)
        except Exception as exc:  # noqa: BLE001 - a failed export is a result, explained below
            run.error = exc
        if strict:
            program = None
            try:
                program = torch.export.export(copy, fargs, fkwargs, dynamic_shapes=dynamic_shapes, strict=True)
                run.error = None
            except Exception as exc:  # noqa: BLE001 - as above
                run.error = exc
    run.log = "\n".join(log)
    run.program = program if run.error is None else None
    if run.error is not None:
        err = run.record.error if isinstance(run.record.error, dict) else None
        run.kind = classify(run.error)
        frame = user_frame(run.error, err)
        run.user_line = _where(frame) if frame else None
        run.reason = explain(run.error, run.kind, frame, err, strict=strict)
    return run


def _export_ready(mode: Any, model: torch.nn.Module) -> Any:
    """The session's recording mode set up like the fake mode export makes (Note: [export under the recorder])."""
    env = mode.shape_env
    env.tracked_fakes = []
    env.trace_asserts = True
    code = getattr(getattr(model.forward, "__func__", model.forward), "__code__", None)
    if code is not None:
        env.co_fields = {"co_name": code.co_name, "co_filename": code.co_filename,
                         "co_firstlineno": str(code.co_firstlineno)}  # fmt: skip
    mode.export = True
    return mode


def _fake_copy(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], mode: Any, device: torch.device
) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    """The model as fakes of ``mode``, meta tensors (of the model and the inputs) placed on ``device``.

    Inputs are left to export, which fakifies them itself with the symbolic sizes ``dynamic_shapes`` asks
    for; a meta input becomes a fake of a mode of its own on ``device`` first (export does not re-fakify a
    tensor of its own mode: its sizes would stay static). Each parameter and buffer of the copy is
    memoised as its own fake (Note: [export under the recorder]). Meta tensors are placed one by one (not
    with ``to_empty``, which unties tied weights): each becomes an empty fake of the same shape, stride and
    dtype on ``device``, once per tensor object, so ties survive.
    """
    copy = fakeify(model, mode=mode)
    placed: dict[int, torch.Tensor] = {}

    def place(t: torch.Tensor, into: Any) -> torch.Tensor:
        if t.device.type != "meta" or device.type == "meta":
            return t
        new = placed.get(id(t))
        if new is None:
            with into:
                new = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
            if isinstance(t, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            placed[id(t)] = new
        return new

    for sub in copy.modules():
        for table in (sub._parameters, sub._buffers):
            for name, t in list(table.items()):
                if isinstance(t, torch.Tensor):
                    table[name] = place(t, mode)
    inputs_mode = new_fake_mode()
    fargs, fkwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: place(t, inputs_mode), (args, kwargs))
    conv = mode.fake_tensor_converter
    for t in [*copy.parameters(), *copy.buffers()]:
        conv.set_tensor_memo(t, t)
    return copy, fargs, fkwargs


@contextlib.contextmanager
def _fake_rules_for(mode_cls: type) -> Iterator[None]:
    """Let higher-order ops (``torch.cond``, ``torch.map``, ...) run under the recorder's fake mode while exporting.

    Note: [higher-order ops under the recording mode]
    A higher-order op finds its rule for the current dispatch mode by the mode's exact type
    (``python_key_table[type(mode)]``), so the FakeTensorMode rule of ``torch.cond`` does not apply to the
    recorder's subclass of it, and export under the recorder fails with "no rule registered for
    HigherOrderOperator cond". For the export, each higher-order op that has a FakeTensorMode rule gets
    the same rule for ``mode_cls`` (the ops inside both branches are then recorded); removed afterwards.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    added = []
    for hop in list(torch._ops._higher_order_ops.values()):
        table = hop.python_key_table
        if FakeTensorMode in table and mode_cls not in table:
            table[mode_cls] = table[FakeTensorMode]
            added.append(hop)
    try:
        yield
    finally:
        for hop in added:
            hop.python_key_table.pop(mode_cls, None)


@contextlib.contextmanager
def _captured_output() -> Iterator[list[str]]:
    """Keep what torch prints to stderr or logs while exporting (a partial graph, warnings) out of the user's output.

    Yields a list that holds those lines once the block ends.
    """
    lines: list[str] = []
    buf = io.StringIO()

    class _Keep(logging.Filter):
        def filter(self, rec: logging.LogRecord) -> bool:
            if not rec.name.startswith("torch") or rec.name.startswith("torch.__trace"):
                return True  # not torch's, or its structured trace (TORCH_TRACE): let it through
            with contextlib.suppress(Exception):
                lines.append(f"{rec.levelname} {rec.name}: {rec.getMessage()}")
            return False

    keep = _Keep()
    loggers = [logging.getLogger(), logging.getLogger("torch")]
    loggers += [lg for name, lg in list(logging.root.manager.loggerDict.items())
                if name.startswith("torch.") and isinstance(lg, logging.Logger)]  # fmt: skip
    handlers = {h for lg in loggers for h in lg.handlers}
    for h in handlers:
        h.addFilter(keep)
    try:
        with contextlib.redirect_stderr(buf):
            yield lines
    finally:
        for h in handlers:
            h.removeFilter(keep)
        if buf.getvalue().strip():
            lines.append(buf.getvalue().strip())


# --------------------------------------------------------------------- the user's line
# which files are the user's, and the frames a text names: fakeviz._engine.fx (is_user_file, user_frames)
_LINE_RE = re.compile(r"^(.*):(\d+) in (\S+)$")


def _frame(filename: str, lineno: int, name: str, line: str | None = None) -> traceback.FrameSummary:
    text = line if line else linecache.getline(filename, lineno).strip()
    return traceback.FrameSummary(filename, lineno, name, line=text or None)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not x for x in out) and len(out) < 20:
        out.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return out


def user_frame(exc: BaseException, error: dict[str, Any] | None = None) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code where ``exc`` happened, or None.

    Looked for, in order: the user stack TorchDynamo keeps on its exceptions (``real_stack``), the
    tracebacks of ``exc`` and its causes, the ``File "...", line N`` frames torch writes into its
    messages, and the recorder's ``error["user_line"]``.
    """
    chain = _chain(exc)
    for e in chain:
        stack = getattr(e, "real_stack", None)
        frames = [f for f in stack or () if is_user_file(f.filename)]
        if frames:
            f = frames[-1]
            return _frame(f.filename, f.lineno or 0, f.name, f.line)
    for e in chain:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if is_user_file(f.filename)]
        if frames:
            f = frames[-1]
            return _frame(f.filename, f.lineno or 0, f.name, f.line)
    for e in chain:
        found = user_frames(str(e))
        if found:
            return _frame(*found[-1])
    line = (error or {}).get("user_line") or getattr(exc, "user_line", None)
    m = _LINE_RE.match(line or "")
    if m:
        return _frame(m.group(1), int(m.group(2)), m.group(3))
    return None


def _where(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


# --------------------------------------------------------------------- what failed
def _is(exc: BaseException, module: str, name: str) -> bool:
    return any(c.__name__ == name and c.__module__ == module for c in type(exc).__mro__)


_DATA_DEPENDENT = (*DATA_DEPENDENT_ERRORS, DataDependentError)


def classify(exc: BaseException) -> str:
    """What made an export fail, in one word or two (see :attr:`ExportRun.kind`)."""
    chain = _chain(exc)
    text = "\n".join(str(e) for e in chain).lower()
    if any(isinstance(e, _DATA_DEPENDENT) for e in chain) or "data-dependent" in text:
        return "data-dependent"
    if any(_is(e, "torch._subclasses.fake_tensor", "FakeTensorDeviceMismatchError") for e in chain) or (
        "expected all tensors to be on the same device" in text
    ):
        return "device mismatch"
    if any(_is(e, "torch.fx.experimental.symbolic_shapes", "ConstraintViolationError") for e in chain) or any(
        _is(e, "torch._dynamo.exc", "UserError") and getattr(e, "error_type", None) is not None
        and e.error_type.name in ("CONSTRAINT_VIOLATION", "DYNAMIC_DIM")  # type: ignore[attr-defined]
        for e in chain
    ):  # fmt: skip
        return "dynamic shapes"
    if any(_is(e, "torch._subclasses.fake_tensor", "UnsupportedOperatorException") for e in chain):
        return "no fake kernel"
    if any(_is(e, "torch._dynamo.exc", "Unsupported") for e in chain):
        return "graph break"
    return "other"


_DEVICES_RE = re.compile(r"devices?,? ([\w:]+) and ([\w:]+)")


def _clip(line: str, width: int = 200) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return _clip(line.strip())
    return type(exc).__name__


def explain(
    exc: BaseException,
    kind: str,
    frame: traceback.FrameSummary | None,
    error: dict[str, Any] | None = None,
    *,
    strict: bool = False,
) -> str:
    """The reason an export failed, in at most about 15 lines: what failed, the user's line, what to change.

    Names no torch-internal frame; torch's own message stays on the exception.
    """
    chain = _chain(exc)
    error = error or {}
    op, module = error.get("op"), error.get("module")
    at = f" ({op} in {module})" if op and module else (f" ({op})" if op else "")
    if kind == "data-dependent":
        head = "the model needs a tensor's value (data-dependent control flow or a value used as a Python number)"
        why = ["An exported graph is traced on shapes, not values: export cannot decide this line for every input."]
        todo = [
            "a branch on a tensor: write it with torch.cond(pred, true_fn, false_fn, (x,)) so both sides are "
            "exported, or with torch.where for an element-wise choice;",
            "a value known in advance: compute it outside the model and pass it in as a Python number;",
            "a check that always holds: state it with torch._check(...) instead of `if`, so export can assume it.",
        ]
    elif kind == "device mismatch":
        m = next((m for e in chain if (m := _DEVICES_RE.search(str(e)))), None)
        devs = f"{m.group(1)} and {m.group(2)}" if m else "two devices"
        head = f"an op got tensors on different devices: {devs}{at}"
        why = ["Each op runs on one device; export checks placement as a real run on those devices would."]
        todo = [
            "move the tensor with `.to(device)` before this line (between two parts of a model placed on "
            "different devices);",
            "or place this module's parameters on the device of its input.",
        ]
    elif kind == "dynamic shapes":
        text = next((str(e) for e in chain if "Suggested fixes" in str(e)), str(exc))
        head = "the dynamic_shapes given do not hold for this model"
        why = [_clip(t.strip()[2:]) for t in text.splitlines() if t.strip().startswith("- ")][:3]
        why = why or [_first_line(exc)]
        fixes = text.split("Suggested fixes:", 1)[1].strip().split("\n\n", 1)[0] if "Suggested fixes:" in text else ""
        tail = [t.strip() for t in fixes.splitlines() if t.strip()][:4]
        todo = ["apply torch's suggested fixes to dynamic_shapes" + (":" if tail else " (see `.error`);")]
        todo += [f"    {t}" for t in tail]
        todo.append("or mark fewer dimensions dynamic (Dim.AUTO lets export find which are).")
    elif kind == "no fake kernel":
        head = f"an op has no fake (meta) implementation, so it cannot run without data{at}"
        why = [_first_line(exc)]
        todo = [
            "a custom op: register one with @torch.library.register_fake;",
            "otherwise keep this op out of the exported forward.",
        ]
    elif kind == "graph break":
        head = "strict export (TorchDynamo) cannot trace this Python"
        why = [_first_line(next((e for e in chain if _is(e, "torch._dynamo.exc", "Unsupported")), exc))]
        todo = [
            "export with strict=False (the default): it runs your Python as is and traces only the tensor ops;",
            "or rewrite this line with code TorchDynamo supports.",
        ]
    else:
        head = f"{type(exc).__name__}{at}"
        why = [_first_line(exc)]
        todo = ["see torch's full message on `.error`."]
    lines = [f"export failed{' (strict)' if strict else ''}: {head}"]
    if frame is not None:
        lines.append(f"  at {_where(frame)}")
        if frame.line:
            lines.append(f"      {frame.line.strip()}")
    else:
        lines.append("  (torch names no line of your code for this failure)")
    lines += why
    lines.append("What to change:")
    lines += [t if t.startswith("    ") else f"  - {t}" for t in todo]
    lines.append(f"torch's full message is on `.error` ({type(exc).__name__}).")
    return "\n".join(lines)
