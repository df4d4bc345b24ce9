"""``%%fake``: run a notebook cell under fake tensors and record it.

Loaded with ``%load_ext fakeviz``. This is the only module of fakeviz that
imports IPython; the engine does not.
"""

from __future__ import annotations

import html
import time
from typing import Any

import torch
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Float, Unicode

from .._api import record
from .._core.errors import FakeVizError
from .._core.gpus import gpu_capability, parse_capacity
from .._engine.recorder import FakeSession
from .._engine.session import is_fake
from .._trace import Trace

__all__ = ["FakeCellError", "FakeMagics", "load_ipython_extension", "unload_ipython_extension"]

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}  # fmt: skip
_ATTENTION = ("auto", "flash", "efficient", "cudnn", "math", "native")


class FakeCellError(FakeVizError):
    """A ``%%fake`` cell failed. The user's traceback was already shown; ``__cause__`` is the error."""

    def __init__(self, message: str, trace: Trace) -> None:
        super().__init__(message)
        self.trace = trace

    def _render_traceback_(self) -> list[str]:
        # IPython prints this instead of a second, fakeviz-internal traceback.
        return [str(self)]


def _parse_dtype(name: str | None) -> torch.dtype | None:
    if not name:
        return None
    key = name.lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"--dtype {name!r}: use one of {', '.join(sorted(_DTYPES))}")
    return _DTYPES[key]


class _Progress:
    """A throttled one-line progress display that disappears when done (Jupyter only)."""

    def __init__(self, interval: float) -> None:
        from IPython.display import display

        self.interval = interval
        self.last = 0.0
        self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def __call__(self, n_ops: int, phase: str, module: str | None) -> None:
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last = now
        text = f"fakeviz: {n_ops:,} ops recorded, {phase} in {module or 'top level'}…"
        where = html.escape(module or "top level")
        self.handle.update(
            {
                "text/plain": text,
                "text/html": f"<span class='fv-progress'>fakeviz: {n_ops:,} ops recorded, {phase} in <code>{where}</code>…</span>",
            },
            raw=True,
        )

    def close(self) -> None:
        self.handle.update({"text/plain": ""}, raw=True)


@magics_class
class FakeMagics(Magics):
    """``%%fake`` and ``%fake_reset``. Defaults are configurable: ``%config FakeMagics.device = "cuda:0"``."""

    device = Unicode(None, allow_none=True, help="default --device").tag(config=True)
    dtype = Unicode(None, allow_none=True, help="default --dtype").tag(config=True)
    gpu = Unicode(None, allow_none=True, help="default --gpu (or a capacity like '80GB')").tag(config=True)
    attention = Unicode("auto", help="default --attention").tag(config=True)
    display = Bool(True, help="show the result after the cell").tag(config=True)
    progress = Bool(True, help="show a progress line while a cell records (Jupyter only)").tag(config=True)
    progress_interval = Float(0.5, help="seconds between progress updates").tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.sessions: dict[str, FakeSession] = {}
        self._active: dict[str, Trace] = {}

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
    @no_var_expand
    @cell_magic
    def fake(self, line: str, cell: str) -> None:
        """Run the cell under fake tensors and record every op.

        Variables made in the cell stay in the namespace as fake objects; later
        ``%%fake`` cells of the same ``--session`` can keep using them. The Trace
        is stored under ``-o NAME`` (or ``_fake``). A trailing ``;`` suppresses
        the display. On an error the user's traceback is shown, the partial
        trace is kept and shown with an error banner, and no fake mode stays
        active.
        """
        args = parse_argstring(self.fake, line)
        device = args.device or self.device
        dtype = _parse_dtype(args.dtype or self.dtype)
        capacity_spec = args.capacity or args.gpu or self.gpu
        capacity = parse_capacity(capacity_spec) if capacity_spec else None
        attention = args.attention or self.attention
        out_name = args.output or "_fake"
        quiet = args.no_display or not self.display or _ends_with_semicolon(cell)

        if not args.real and args.session in self._active:  # nested %%fake on a busy session
            trace = self._active[args.session]
            result = self.shell.run_cell(cell, store_history=False)
            self.shell.user_ns[out_name] = trace
            if result.error_in_exec is not None:
                raise FakeCellError(
                    f"fakeviz: the nested %%fake cell failed ({type(result.error_in_exec).__name__}); "
                    "it was recorded into the enclosing cell's trace",
                    trace,
                ) from result.error_in_exec
            return None

        session = None
        if not args.real:
            session = self.sessions.get(args.session)
            if session is None or session.symbolic != args.symbolic:
                session = self.sessions[args.session] = FakeSession(symbolic=args.symbolic)
        progress = None
        if self.progress and not quiet and getattr(self.shell, "kernel", None) is not None:
            progress = _Progress(self.progress_interval)
        gpu_name = (args.gpu or self.gpu) if not args.capacity else None
        rec = record(
            device=device, dtype=dtype, fake=not args.real, session=session, progress=progress,
            attention=attention or "auto", gpu=gpu_name if gpu_name and gpu_capability(gpu_name) else None,
        )  # fmt: skip
        result = None
        try:
            with rec as trace:
                trace.meta.update(
                    {"cell": cell[:2000], "session": args.session if session else None, "attention": attention}
                )
                if capacity is not None:
                    trace.meta["capacity"] = capacity
                    trace.meta["capacity_spec"] = str(capacity_spec)
                if session is not None:
                    self._active[args.session] = trace
                try:
                    result = self.shell.run_cell(cell, store_history=False)
                finally:
                    self._active.pop(args.session, None)
        finally:
            if progress is not None:
                progress.close()
        self.shell.user_ns[out_name] = trace
        error = result.error_in_exec if result is not None else None
        if error is not None and trace.error is None:
            trace.error = {"type": type(error).__name__, "message": str(error)[:2000], "op": None}
        if not quiet or error is not None:
            from IPython.display import display

            display(trace)
        if error is not None:
            raise FakeCellError(
                f"fakeviz: the %%fake cell failed with {type(error).__name__} (traceback above); "
                f"no fake mode is active; the partial trace ({trace.num_ops:,} ops) is in `{out_name}`",
                trace,
            ) from error
        return None

    # --------------------------------------------------------- %fake_reset
    @magic_arguments()
    @argument("--session", default=None, help="reset only this session (default: all)")
    @line_magic
    def fake_reset(self, line: str) -> None:
        """Forget fake sessions: the next ``%%fake`` cell starts a new fake mode."""
        args = parse_argstring(self.fake_reset, line)
        names = [args.session] if args.session else list(self.sessions)
        dropped = [n for n in names if self.sessions.pop(n, None) is not None]
        stale = sorted(k for k, v in self.shell.user_ns.items() if not k.startswith("_") and _holds_fake(v))
        msg = f"fakeviz: reset {len(dropped)} fake session(s)"
        if stale:
            msg += f"; these variables still hold fake objects of the old session(s): {', '.join(stale[:20])}"
        print(msg)


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
    for kind, name in (("cell", "fake"), ("line", "fake_reset")):
        ip.magics_manager.magics[kind].pop(name, None)
    if magics is not None:
        ip.magics_manager.registry.pop(type(magics).__name__, None)
