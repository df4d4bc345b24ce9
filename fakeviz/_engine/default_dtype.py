"""A default dtype for the calling thread only (Note: [a thread's default dtype]).

Note: [a thread's default dtype]
``torch.set_default_dtype`` is process-wide: a build at bf16 that set it (as fakeviz did, and as transformers'
``local_torch_dtype`` does inside ``_from_config``) made another thread's ``torch.zeros(3)`` bf16 while it ran.
:func:`default_dtype` gives the dtype to the calling thread alone: a ``TorchFunctionMode`` (torch keeps its mode
stack per thread) passes ``dtype=`` to every factory call that gives none and would take torch's default (``empty``,
``zeros``, ``rand``...; ``full``, ``arange`` and ``tensor`` where their values are Python floats), and, through the
patch registry (entry ``thread-default-dtype``, session scope, answering per thread), ``torch.get_default_dtype``
answers the thread's dtype and transformers' ``local_torch_dtype`` enters this context instead of setting torch's.
What C++ derives from torch's default on its own (an integer tensor times a Python float, ``torch.finfo()``, the
legacy ``torch.Tensor(3)``) still reads the process's dtype: the models of the catalog build the same modules
either way (``tests/engine/test_thread_dtype.py`` compares them, and a thread beside a build keeps float32).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import patches

__all__ = ["default_dtype", "thread_dtype"]

_LOCAL = threading.local()
_ALWAYS = frozenset(
    getattr(torch, n) for n in ("empty", "zeros", "ones", "rand", "randn", "eye", "empty_strided", "linspace",
                                "logspace", "scalar_tensor", "empty_permuted", "hann_window", "hamming_window",
                                "bartlett_window", "blackman_window", "kaiser_window") if hasattr(torch, n)
)  # fmt: skip
_BY_VALUES = frozenset(getattr(torch, n) for n in ("tensor", "as_tensor", "asarray", "full", "arange", "range"))
_FACTORIES = _ALWAYS | _BY_VALUES


def thread_dtype() -> torch.dtype | None:
    """The calling thread's default dtype set by :func:`default_dtype` (None: torch's own)."""
    stack = getattr(_LOCAL, "stack", None)
    return stack[-1] if stack else None


def _inferred(data: Any, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype torch infers from ``data`` (``torch.tensor(data)``) when its default dtype is ``dtype``, where the
    default takes part (a Python float, or no element at all); None where it does not, or where ``data`` holds
    something other than Python numbers and tensors (an array: torch's own inference, as it is)."""
    found, out, todo = False, None, [data]
    while todo:
        x = todo.pop()
        if isinstance(x, (list, tuple)):
            found = found or not x  # torch.tensor([]): the default dtype
            todo.extend(x)
            continue
        if isinstance(x, bool):
            t = torch.bool
        elif isinstance(x, int):
            t = torch.int64
        elif isinstance(x, float):
            t, found = dtype, True
        elif isinstance(x, torch.Tensor):
            t = x.dtype
        else:
            return None
        out = t if out is None else torch.promote_types(out, t)
    return (out or dtype) if found else None


def _dtype_for(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype) -> torch.dtype | None:
    """The ``dtype=`` to give factory ``func`` for a thread whose default is ``dtype``; None: the call as it is."""
    if kwargs.get("dtype") is not None or kwargs.get("out") is not None:
        return None
    if func in _ALWAYS:
        return dtype
    if func is torch.full:
        fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
        return dtype if isinstance(fill, float) else None
    if func in (torch.arange, torch.range):
        values = (*args, *(kwargs.get(k) for k in ("start", "end", "step")))
        return dtype if any(isinstance(a, float) for a in values) else None
    return _inferred(args[0] if args else kwargs.get("data", kwargs.get("obj")), dtype)


class _DefaultDtype(TorchFunctionMode):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES:
            dtype = _dtype_for(func, args, kwargs, self.dtype)
            if dtype is not None:
                kwargs = {**kwargs, "dtype": dtype}  # a copy: the caller's dict stays as it was
        return func(*args, **kwargs)


_TORCH_GET = torch.get_default_dtype


def _get_default_dtype() -> torch.dtype:
    return thread_dtype() or _TORCH_GET()


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Within the block, factory calls of the calling thread that give no dtype make ``dtype`` (a floating dtype
    ``torch.set_default_dtype`` takes; None: torch's own), and ``torch.get_default_dtype()`` says so there; other
    threads keep torch's (Note: [a thread's default dtype])."""
    if dtype is None:
        yield
        return
    if not dtype.is_floating_point:
        raise ValueError(f"a default dtype is a floating dtype, not {dtype}")
    stack = _LOCAL.__dict__.setdefault("stack", [])
    tokens = [patches.push(torch, "get_default_dtype", _get_default_dtype, entry="thread-default-dtype")]
    try:
        import transformers.modeling_utils as mu  # noqa: PLC0415 - only where transformers is installed
    except ImportError:
        mu = None
    if mu is not None and hasattr(mu, "local_torch_dtype"):
        tokens.append(patches.push(mu, "local_torch_dtype", _local_torch_dtype, entry="thread-default-dtype"))
    stack.append(dtype)
    try:
        with _DefaultDtype(dtype):
            yield
    finally:
        stack.pop()
        for t in reversed(tokens):
            patches.pop(t)


@contextlib.contextmanager
def _local_torch_dtype(dtype: torch.dtype, model_class_name: str | None = None) -> Iterator[None]:
    """transformers' ``local_torch_dtype`` for the calling thread only (Note: [a thread's default dtype])."""
    if not dtype.is_floating_point:  # transformers' own error, before anything changes
        import transformers.modeling_utils as mu  # noqa: PLC0415

        with patches.original(mu, "local_torch_dtype")(dtype, model_class_name):
            yield
        return
    with default_dtype(dtype):
        yield
