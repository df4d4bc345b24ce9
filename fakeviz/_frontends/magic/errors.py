"""Errors inside ``%%fake`` as a notebook user reads them, and the checks made before a cell runs.

An error in a cell is shown as: the exception's name and the user's own cell line, the explanation
(fakeviz's message, in the magic's terms: ``--symbolic``, ``-o NAME``, ``--capacity``), what to do,
and where the partial trace is; at most :data:`MAX_LINES` lines, torch's frames hidden (``%fake_tb`` or
``--tb`` shows the full traceback). The exception raised is the user's own (its name is what the
notebook's error header shows), with that text as its ``_render_traceback_``.
"""

from __future__ import annotations

import ast
import os
import re
import sysconfig
import traceback
from typing import Any

import torch

from ..._core.errors import FakeVizError
from ..._engine.session import is_fake
from .cells import CellNames

__all__ = ["MAX_LINES", "FakeCellError", "check_names", "short_error", "translate"]

MAX_LINES = 25
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_FAKEVIZ_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))) + os.sep
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_RED, _RESET = "\x1b[31m", "\x1b[39m"


class FakeCellError(FakeVizError):
    """A ``%%fake`` cell could not run, or a nested one failed; ``trace`` is the partial trace (or None)."""

    def __init__(self, message: str, trace: Any = None) -> None:
        super().__init__(message)
        self.trace = trace

    def _render_traceback_(self) -> list[str]:
        # IPython prints this instead of a fakeviz-internal traceback
        return [f"{_RED}FakeCellError{_RESET}: {self}"]


def _is_user_file(filename: str, cells: CellNames) -> bool:
    if filename in cells.files:
        return True
    if filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    if real.startswith((_TORCH_DIR, _FAKEVIZ_DIR)) or "site-packages" in real or "dist-packages" in real:
        return False
    return not real.startswith(_STDLIB)


def user_frame(exc: BaseException, cells: CellNames) -> tuple[str, int, str] | None:
    """The innermost frame of the user's own code (a notebook cell or their file): (where, line, source)."""
    found = None
    chain: BaseException | None = exc
    for _ in range(8):  # the error, then what caused it (fakeviz raises its own from torch's)
        if chain is None or found is not None:
            break
        for fs in traceback.extract_tb(chain.__traceback__):
            if _is_user_file(fs.filename, cells):
                found = fs
        chain = chain.__cause__ or chain.__context__
    if found is None:
        return None
    where = cells.label(found.filename) or found.filename
    if found.name != "<module>":
        where += f", line {found.lineno} in {found.name}"
    else:
        where += f", line {found.lineno}"
    return where, int(found.lineno or 0), (found.line or "").strip()


_PARTIAL = re.compile(r"The partial trace( up to this op)? is on this exception as `\.trace`\.?")
_REWRITES = (
    (re.compile(r"record without symbolic=True"), "run the cell without --symbolic"),
    (re.compile(r"[Ww]ith record\(symbolic=True\)"), "With --symbolic"),
    (re.compile(r"(?:fv\.|fakeviz\.)?record\(symbolic=True\)"), "--symbolic"),
    (re.compile(r"`?symbolic=True`?"), "--symbolic"),
    (re.compile(r"`?capacity=`?"), "--capacity "),
    (re.compile(r" ?\(Note: \[[^\]]*\][^)]*\)"), ""),  # contributor notes
    (re.compile(r"outside the recorded block"), "in a cell without %%fake"),
    (re.compile(r"before the (?:recorded )?block"), "before the cell"),
    (re.compile(r"`\.trace`|\bexception\.trace\b|\berr\.trace\b"), "`{out}`"),
)


def translate(text: str, out_name: str, cells: CellNames) -> str:
    """fakeviz's API terms in an engine message -> the magic's (``--symbolic``, ``-o NAME``), cells named."""
    text = _PARTIAL.sub(lambda m: f"The partial trace{m.group(1) or ''} is in `{out_name}`.", text)
    for pattern, repl in _REWRITES:
        text = pattern.sub(lambda _m, r=repl: r.replace("{out}", out_name), text)
    return cells(text)


def _advice(exc: BaseException, text: str, device: str | None) -> list[str]:
    if "found at least two devices" in text or "Expected all tensors to be on the same device" in text:
        dev = device or "the cell's device"
        return [
            f"What to do: every tensor of one op must be on one device. In this --device {dev} cell, tensors made "
            "with an explicit device= (or real tensors from outside %%fake) stay where they are: make them without "
            f"device=, or move them with .to('{dev}')."
        ]
    return []


def short_error(
    exc: BaseException, *, out_name: str, n_ops: int | None, cells: CellNames, device: str | None
) -> list[str]:
    """The lines a notebook shows for ``exc`` raised in a ``%%fake`` cell (at most :data:`MAX_LINES`)."""
    name = type(exc).__name__
    head = []
    where = user_frame(exc, cells)
    if where is not None:
        head.append(f"{_RED}{name}{_RESET} in {where[0]}:")
        if where[2]:
            head.append(f"----> {where[1]} {where[2]}")
    else:
        head.append(f"{_RED}{name}{_RESET}:")
    text = translate(str(exc), out_name, cells)
    body = [ln for ln in text.splitlines() if ln.strip() and (where is None or ln.strip() != where[2])]
    for note in getattr(exc, "__notes__", None) or []:
        body += [translate(ln, out_name, cells) for ln in str(note).splitlines() if ln.strip()]
    body += _advice(exc, text, device)
    foot = []
    if n_ops is not None and f"`{out_name}`" not in text:
        foot.append(f"The partial trace ({n_ops:,} ops) is in `{out_name}`; no fake mode is active.")
    foot.append("Torch internals are hidden: %fake_tb shows the full traceback (or run the cell with --tb).")
    room = MAX_LINES - len(head) - len(foot)
    if len(body) > room:
        cut = len(body) - room + 1
        body = body[: room - 1] + [f"… ({cut} more lines: %fake_tb)"]
    return head + body + foot


def _tensors_of(obj: Any) -> list[Any]:
    """A few tensors an object holds: itself, a module's first parameters/buffers, a container's items."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        out = []
        for t in obj.parameters():
            out.append(t)
            break
        for t in obj.buffers():
            out.append(t)
            break
        return out
    if isinstance(obj, torch.optim.Optimizer):
        return [p for g in obj.param_groups[:1] for p in g["params"][:1]]
    if isinstance(obj, (list, tuple)):
        return [x for x in obj[:8] if isinstance(x, torch.Tensor)]
    if isinstance(obj, dict):
        return [x for x in list(obj.values())[:8] if isinstance(x, torch.Tensor)]
    return []


def check_names(
    code: str, ns: dict[str, Any], *, dropped: Any, device: str | None, real: bool
) -> tuple[list[str], list[str]]:
    """Before a cell runs: (errors, warnings) about the variables it reads.

    An object holding fake tensors of a session ``%fake_reset`` dropped is an error (torch would copy it
    into the new session without a word). A real tensor read in a fake cuda cell is a warning: it becomes
    a fake tensor on its own device (cpu), not on the cell's.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [], []
    stored: dict[str, int] = {}  # name -> first line that assigns it
    loads: dict[str, int] = {}  # name -> first line that reads it
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            seen = stored if isinstance(n.ctx, ast.Store) else loads
            seen[n.id] = min(seen.get(n.id, n.lineno), n.lineno)
    # read before the cell assigns it (``x = x + 1`` reads the old x)
    names = sorted(k for k, line in loads.items() if k not in stored or line <= stored[k])
    errors, warnings = [], []
    cuda = device is not None and torch.device(device).type == "cuda"
    for name in names:
        if name not in ns or name.startswith("_"):
            continue
        for t in _tensors_of(ns[name]):
            if is_fake(t):
                mode = getattr(t, "fake_mode", None)
                if mode is not None and mode in dropped:
                    errors.append(
                        f"`{name}` holds fake tensors made before %fake_reset: their fake session is gone, and "
                        f"this cell would silently copy them into the new one. Re-run the cell that made `{name}`, "
                        f"or `del {name}`."
                    )
                    break
            elif cuda and not real and t.device.type == "cpu":
                warnings.append(
                    f"fakeviz: `{name}` holds a real cpu tensor (made outside %%fake): in this fake {device} cell it "
                    f"becomes a fake tensor on cpu, not {device}. Make it inside %%fake, or use "
                    f"`{name}.to('{device}')` in the cell."
                )
                break
    return errors, warnings
