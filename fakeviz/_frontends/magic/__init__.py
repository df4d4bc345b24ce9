"""``%%fake``: run a notebook cell under fake tensors and record it.

Loaded with ``%load_ext fakeviz``. This is the only package of fakeviz that imports IPython; the engine
does not. ``cells.py`` names cells as IPython does and shows progress; ``errors.py`` makes the short
error a notebook user reads and checks the variables a cell reads before it runs.
"""

from __future__ import annotations

import re
import sys
import weakref
from typing import Any

import torch
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Float, Unicode

from ..._api import record
from ..._core.errors import ArgumentError
from ..._core.gpus import Capacity, gpu_capability
from ..._core.notices import quiet_import_notices
from ..._engine.arguments import default_dtype, fake_device
from ..._engine.recorder import FakeSession
from ..._engine.session import check_device, is_fake
from ..._trace import Trace
from .cells import CellNames, CompiledAs, Progress, cell_number
from .errors import FakeCellError, check_names, short_error

__all__ = ["FakeCellError", "FakeMagics", "load_ipython_extension", "unload_ipython_extension"]

_ATTENTION = ("auto", "flash", "efficient", "cudnn", "math", "native")
_MAGICS = (("cell", "fake"), ("line", "fake_reset"), ("line", "fake_trace"), ("line", "fake_tb"))


def _parse_dtype(name: str | None) -> torch.dtype | None:
    """``--dtype``: the block's default dtype, by the engine's one parser (:func:`default_dtype`)."""
    if not name:
        return None
    try:
        return default_dtype(name)
    except ValueError:
        raise UsageError(f"--dtype {name!r}: use one of bf16, fp16, fp32, fp64 (or bfloat16, float16, ...)") from None


def _parse_device(name: str | None) -> str | None:
    """``--device``: read as ``fv.record(device=)`` reads it (:func:`fake_device`: ``mps``, ``xla``, ... are not
    faked), then checked against the fake cuda devices (``cuda:64``); one line naming the option."""
    if not name:
        return None
    try:
        dev = fake_device(name)
        check_device(dev)
    except (RuntimeError, ValueError) as exc:
        text = str(exc).splitlines()[0]
        why = text.split(": ", 1)[1] if isinstance(exc, ArgumentError) else text
        why = why if "fake" in why else "not a device"
        raise UsageError(f"--device {name!r}: {why} (use cpu, cuda, cuda:0 ... cuda:63, or meta)") from None
    return str(dev)


def _parse_capacity(spec: str | None, flag: str) -> Capacity | None:
    if not spec:
        return None
    try:
        return Capacity.parse(spec)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{flag} {spec!r}: {str(exc).splitlines()[0]}") from None


@magics_class
class FakeMagics(Magics):
    """``%%fake``, ``%fake_trace``, ``%fake_tb`` and ``%fake_reset``.

    Defaults are configurable: ``%config FakeMagics.device = "cuda:0"``.
    """

    device = Unicode(None, allow_none=True, help="default --device").tag(config=True)
    dtype = Unicode(None, allow_none=True, help="default --dtype").tag(config=True)
    gpu = Unicode(None, allow_none=True, help="default --gpu (or a capacity like '80GB')").tag(config=True)
    attention = Unicode("auto", help="default --attention").tag(config=True)
    display = Bool(True, help="show the result after the cell").tag(config=True)
    full_traceback = Bool(False, help="show the full traceback of an error (as --tb)").tag(config=True)
    progress = Bool(True, help="show a progress line while a cell records (Jupyter only)").tag(config=True)
    progress_interval = Float(0.5, help="seconds between progress updates").tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.sessions: dict[str, FakeSession] = {}
        self._active: dict[str, Trace] = {}
        self._dropped: Any = weakref.WeakSet()  # fake modes of sessions %fake_reset dropped
        self.last_error: BaseException | None = None

    # ------------------------------------------------------------- %%fake
    @magic_arguments()
    @argument("--device", "-d", default=None, help="default device in the cell, e.g. cuda:0 (fake on CPU-only torch)")
    @argument("--dtype", default=None, help="default floating dtype in the cell (bfloat16, float16, float32)")
    @argument("--gpu", default=None, help="GPU name for the fits/does-not-fit verdict (H100, A100 40GB, ...)")
    @argument("--capacity", default=None, help="device capacity for the verdict, e.g. 80GB or 24GiB")
    @argument("-o", "--output", default=None, help="name to store the Trace under (default: _fake)")
    @argument("--session", default="default", help="fake session name; objects are shared within one session")
    @argument("--real", action="store_true", help="record a real run instead of a fake one")
    @argument("--no-display", action="store_true", help="show nothing after the cell")
    @argument(
        "--attention",
        default=None,
        choices=_ATTENTION,
        help="SDPA kernel a fake cuda run records: auto (the GPU's own choice), flash, efficient, cudnn, math, or native",
    )
    @argument("--symbolic", action="store_true", help="data-dependent output sizes become symbols")
    @argument("--tb", action="store_true", help="on an error, show the full traceback (torch internals included)")
    @argument("--verbose", action="store_true", help="keep optional libraries' import-time notices (torchao, ...)")
    @no_var_expand
    @cell_magic
    def fake(self, line: str, cell: str) -> None:
        """Run the cell under fake tensors and record every op.

        Variables made in the cell stay in the namespace as fake objects; later
        ``%%fake`` cells of the same ``--session`` keep using them, and memory is
        one story: a cell's trace starts with every storage the session still
        holds (parameters, gradients, optimizer state: carried in, category kept),
        so its peak is the peak at that point of the notebook. ``%fake_trace``
        gives the whole session as one trace, cells marked. The Trace is stored
        under ``-o NAME`` (or ``_fake``). A trailing ``;`` suppresses the display.
        User lines name cells as IPython does (``Cell In[3], line 2``).

        On an error the cell's line and what went wrong come first (torch
        internals hidden: ``%fake_tb`` or ``--tb`` shows them), the partial
        trace is kept and shown with an error banner, and no fake mode stays
        active. ``%fake_reset`` forgets the sessions. Defaults:
        ``%config FakeMagics.device = "cuda:0"`` (also dtype, gpu, attention,
        display, full_traceback, progress).
        """
        args = parse_argstring(self.fake, line)
        device = _parse_device(args.device or self.device)
        dtype = _parse_dtype(args.dtype or self.dtype)
        capacity_spec = args.capacity or args.gpu or self.gpu
        capacity = _parse_capacity(capacity_spec, "--capacity" if args.capacity else "--gpu")
        attention = args.attention or self.attention
        if attention not in _ATTENTION:
            raise UsageError(f"--attention {attention!r}: use one of {', '.join(_ATTENTION)}")
        out_name = args.output or "_fake"
        if not out_name.isidentifier():
            raise UsageError(f"-o {out_name!r}: not a Python name")
        quiet = args.no_display or not self.display or _ends_with_semicolon(cell)
        full_tb = args.tb or self.full_traceback

        if not args.real and args.session in self._active:  # nested %%fake on a busy session
            return self._nested(args.session, cell, out_name)

        code = self._code(cell)
        problems, warnings = check_names(code, self.shell.user_ns, dropped=self._dropped, device=device, real=args.real)
        if problems:
            raise FakeCellError("the cell did not run: " + " ".join(problems))
        for w in warnings:
            print(w, file=sys.stderr)

        session = None
        if not args.real:
            session = self.sessions.get(args.session)
            if session is None or session.symbolic != args.symbolic:
                if session is not None and session.started is not None:
                    self._dropped.add(session.started)
                session = self.sessions[args.session] = FakeSession(symbolic=args.symbolic)
        progress = None
        if self.progress and not quiet and getattr(self.shell, "kernel", None) is not None:
            progress = Progress(self.progress_interval)
        gpu_name = (args.gpu or self.gpu) if not args.capacity else None
        rec = record(
            device=device, dtype=dtype, fake=not args.real, session=session, progress=progress,
            attention=attention or "auto", gpu=gpu_name if gpu_name and gpu_capability(gpu_name) else None,
        )  # fmt: skip
        number = cell_number(self.shell)  # the prompt's [N], on IPython 8 and 9
        label = f"Cell In[{number}]"
        rec.trace.meta.update({"cell": cell[:2000], "label": label, "session": args.session if session else None,
                               "attention": attention, **({"real_inputs": warnings} if warnings else {})})  # fmt: skip
        if capacity is not None:
            rec.trace.meta["capacity"] = capacity
            rec.trace.meta["capacity_spec"] = str(capacity_spec)
        error: BaseException | None = None
        before = False  # a SyntaxError: the cell did not run
        hidden = _HiddenTracebacks(self.shell)
        try:
            # Note: [import notices]: torchao's and pytree's notices when the cell first builds a model
            with hidden, CompiledAs(self.shell, number), quiet_import_notices(args.verbose), rec as trace:
                if session is not None:
                    self._active[args.session] = trace
                try:
                    result = self.shell.run_cell(cell, store_history=False)
                finally:
                    self._active.pop(args.session, None)
                if result.error_before_exec is not None:
                    error, before = result.error_before_exec, True  # IPython showed it
                elif result.error_in_exec is not None:
                    raise result.error_in_exec  # inside the block: the recorder names it (Note: [carried storages])
        except BaseException as exc:  # noqa: BLE001 - every error of the cell is the user's, shown below
            error = exc
        finally:
            if progress is not None:
                progress.close()
        trace = rec.trace
        CellNames(self.shell).rename(trace)
        self.shell.user_ns[out_name] = trace
        if error is None:
            if not quiet:
                from IPython.display import display

                display(trace)
            return None
        return self._failed(error, trace, out_name=out_name, device=device, full_tb=full_tb, before=before)

    def _nested(self, name: str, cell: str, out_name: str) -> None:
        trace = self._active[name]
        result = self.shell.run_cell(cell, store_history=False)
        self.shell.user_ns[out_name] = trace
        if result.error_in_exec is not None:
            raise FakeCellError(
                f"the nested %%fake cell failed ({type(result.error_in_exec).__name__}); "
                "it was recorded into the enclosing cell's trace",
                trace,
            ) from result.error_in_exec

    def _code(self, cell: str) -> str:
        try:
            return self.shell.transform_cell(cell)
        except Exception:  # noqa: BLE001 - IPython syntax it cannot transform: skip the checks
            return ""

    def _failed(
        self, error: BaseException, trace: Trace, *, out_name: str, device: str | None, full_tb: bool, before: bool
    ) -> None:
        """Show the partial trace, then raise the cell's own error with the short text (see errors.py)."""
        from IPython.display import display

        self.last_error = error
        cells = CellNames(self.shell)
        if before:
            raise FakeCellError(f"the cell did not run ({type(error).__name__} above); nothing was recorded", trace)
        lines = short_error(error, out_name=out_name, n_ops=trace.num_ops, cells=cells, device=device)
        plain = _strip_ansi(lines[0]).rstrip(":")
        explanation = next((_strip_ansi(x) for x in lines[1:] if not x.startswith("---->")), "")
        err = dict(trace.error or {})
        err.update({"type": type(error).__name__, "message": f"{plain}: {explanation}"[:2000]})
        trace.error = err  # the banner names the exception the text names
        display(trace)
        if not full_tb:
            try:
                error._render_traceback_ = lambda: list(lines)  # type: ignore[attr-defined]
            except (AttributeError, TypeError):  # an exception type without a __dict__
                raise FakeCellError("\n".join(_strip_ansi(x) for x in lines), trace) from error
        raise error

    # --------------------------------------------------------- %fake_trace
    @magic_arguments()
    @argument("-o", "--output", default=None, help="name to store the session's Trace under (default: return it)")
    @argument("--session", default="default", help="fake session name")
    @line_magic
    def fake_trace(self, line: str) -> Trace | None:
        """The whole fake session as one Trace: every ``%%fake`` cell of ``--session`` so far, in order.

        Cells are marked in ``trace.meta["cells"]`` (label, first op, end op) and their user lines name
        them (``Cell In[3], line 2``); the memory curve is the one the same code gives run as one block.
        """
        args = parse_argstring(self.fake_trace, line)
        session = self.sessions.get(args.session)
        if session is None or not session.records:
            raise UsageError(f"no %%fake cell has run in session {args.session!r} (since %fake_reset)")
        trace = session.joined(Trace)
        if args.output:
            self.shell.user_ns[args.output] = trace
            from IPython.display import display

            display(trace)
            return None
        return trace

    # ------------------------------------------------------------ %fake_tb
    @line_magic
    def fake_tb(self, line: str) -> None:
        """The full traceback of the last ``%%fake`` error, torch internals included."""
        err = self.last_error
        if err is None:
            print("fakeviz: no %%fake cell has failed")
            return
        tb = self.shell.InteractiveTB
        stb = tb.structured_traceback(type(err), err, err.__traceback__)
        print(tb.stb2text(stb))

    # --------------------------------------------------------- %fake_reset
    @magic_arguments()
    @argument("--session", default=None, help="reset only this session (default: all)")
    @line_magic
    def fake_reset(self, line: str) -> None:
        """Forget fake sessions: the next ``%%fake`` cell starts a new fake mode (and a new memory story)."""
        args = parse_argstring(self.fake_reset, line)
        names = [args.session] if args.session else list(self.sessions)
        dropped = [n for n in names if self.sessions.get(n) is not None]
        for n in dropped:
            mode = self.sessions.pop(n).started
            if mode is not None:
                self._dropped.add(mode)
        stale = sorted(k for k, v in self.shell.user_ns.items() if not k.startswith("_") and _holds_fake(v))
        msg = f"fakeviz: reset {len(dropped)} fake session(s)"
        if stale:
            msg += f"; these variables still hold fake objects of the old session(s): {', '.join(stale[:20])}"
        print(msg)


# %%fake? shows the cell magic's usage: magic_arguments names it after the function (%fake)
FakeMagics.fake.__doc__ = (FakeMagics.fake.__doc__ or "").replace("%fake [", "%%fake [", 1)
FakeMagics.fake.parser.prog = "%%fake"


class _HiddenTracebacks:
    """While the cell runs, IPython does not print its traceback: the magic shows the short one after."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.saved: Any = None

    def __enter__(self) -> None:
        self.saved = self.shell.__dict__.get("showtraceback")
        self.shell.showtraceback = lambda *a, **k: None

    def __exit__(self, *exc: Any) -> None:
        if self.saved is None:
            self.shell.__dict__.pop("showtraceback", None)
        else:
            self.shell.showtraceback = self.saved


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _holds_fake(v: Any) -> bool:
    if is_fake(v):
        return True
    if isinstance(v, torch.nn.Module):
        return any(is_fake(p) for p in v.parameters())
    return False


def _ends_with_semicolon(cell: str) -> bool:
    for raw in reversed(cell.splitlines()):
        stripped = raw.split("#", 1)[0].strip()
        if stripped:
            return stripped.endswith(";")
    return False


_registered: dict[int, FakeMagics] = {}


def load_ipython_extension(ip: Any) -> None:
    magics = FakeMagics(shell=ip)
    ip.register_magics(magics)
    _registered[id(ip)] = magics


def unload_ipython_extension(ip: Any) -> None:
    magics = _registered.pop(id(ip), None)
    for kind, name in _MAGICS:
        ip.magics_manager.magics[kind].pop(name, None)
    if magics is not None:
        ip.magics_manager.registry.pop(type(magics).__name__, None)
