"""Fake sessions: the torchdistx-style API on top of torch's FakeTensorMode.

``fake_mode()`` makes every tensor created in its scope fake (shape, dtype,
stride, device and storage identity, but no data). It records nothing; see
:func:`fakeviz.record` for that.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensor, FakeTensorMode

from . import _cuda_shim

__all__ = ["fake_mode", "fakeify", "is_fake", "meta_like", "patched_swap_tensors"]


def is_fake(tensor: Any) -> bool:
    """True if ``tensor`` is a fake tensor (also a fake ``nn.Parameter``)."""
    return isinstance(tensor, FakeTensor)


def meta_like(fake: torch.Tensor) -> torch.Tensor:
    """A meta tensor with the shape, dtype, stride and storage offset of ``fake``; detached.

    Raises ``ValueError`` if ``fake`` is not a fake tensor.
    """
    if not is_fake(fake):
        raise ValueError(f"meta_like expects a fake tensor, got {type(fake).__name__}")
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        return torch.empty_strided(
            tuple(fake.shape), tuple(fake.stride()), dtype=fake.dtype, device="meta"
        ).detach()


# Note: [Module.to on fake parameters]
# nn.Module._apply swaps a fake parameter with its converted twin through
# torch.utils.swap_tensors, which refuses tensors that have weak references. The
# fake tensor converter's MetaConverter memoises fake tensors in
# WeakValueDictionaries, so every fake parameter has one. While a fake session
# is active we route swap_tensors through a wrapper that first drops those memo
# entries for the two tensors (the memo is a cache; losing an entry only costs a
# re-conversion).
_swap_lock = threading.Lock()
_swap_depth = 0
_original_swap = torch.utils.swap_tensors


def _drop_memo(t: torch.Tensor) -> None:
    if not isinstance(t, FakeTensor):
        return
    mc = t.fake_mode.fake_tensor_converter.meta_converter
    for memo in (mc.tensor_memo,):
        for key in [k for k, v in list(memo.items()) if v is t]:
            memo.pop(key, None)


def _swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    _drop_memo(t1)
    _drop_memo(t2)
    # swap_tensors also swaps __dict__; keep the recorder's tensor ids on their Python
    # objects, as `param.data = new` would in a real run (the parameter keeps its id)
    tags = (t1.__dict__.get("_fakeviz_tid"), t2.__dict__.get("_fakeviz_tid"))
    result = _original_swap(t1, t2)
    for t, tag in zip((t1, t2), tags):
        if tag is None:
            t.__dict__.pop("_fakeviz_tid", None)
        else:
            t.__dict__["_fakeviz_tid"] = tag
    return result


@contextlib.contextmanager
def patched_swap_tensors() -> Iterator[None]:
    """Route ``torch.utils.swap_tensors`` through the memo-dropping wrapper (nestable)."""
    global _swap_depth
    with _swap_lock:
        _swap_depth += 1
        torch.utils.swap_tensors = _swap_tensors
    try:
        yield
    finally:
        with _swap_lock:
            _swap_depth -= 1
            if _swap_depth == 0:
                torch.utils.swap_tensors = _original_swap


def new_fake_mode(*, symbolic: bool = False, cls: type[FakeTensorMode] = FakeTensorMode, **kwargs: Any) -> Any:
    """A FakeTensorMode configured the fakeviz way (non-fake inputs allowed)."""
    _cuda_shim.ensure_fake_cuda()
    shape_env = None
    if symbolic:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        shape_env = ShapeEnv(allow_dynamic_output_shape_ops=True)
    return cls(allow_non_fake_inputs=True, shape_env=shape_env, **kwargs)


@contextlib.contextmanager
def fake_mode(*, device: str | torch.device | None = None, symbolic: bool = False) -> Iterator[FakeTensorMode]:
    """Instantiate every tensor created in this scope as a fake tensor.

    ``device`` optionally sets the default device inside the scope (``"cuda:0"``
    works on a CPU-only torch build too). ``symbolic=True`` attaches a ShapeEnv
    so data-dependent output shapes (``nonzero``) become symbolic sizes.
    Yields the underlying :class:`~torch._subclasses.fake_tensor.FakeTensorMode`.
    """
    if device is not None:
        _cuda_shim.ensure_fake_cuda()
        _cuda_shim.warn_if_unavailable(device)
    mode = new_fake_mode(symbolic=symbolic)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_swap_tensors())
        stack.enter_context(mode)
        if device is not None:
            stack.enter_context(torch.device(device))
        yield mode


def fakeify(
    obj: Any,
    *,
    mode: FakeTensorMode | None = None,
    device: str | torch.device | None = None,
) -> Any:
    """A fake copy of a real tensor, module or nested container of them.

    Aliasing survives: tied weights stay tied, views stay views of the same
    storage. ``mode`` is the fake mode to convert into (the active one, or a new
    one). ``device`` optionally moves the copy there afterwards.
    """
    if mode is None:
        mode = torch._guards.detect_fake_mode() or new_fake_mode()
    with torch._subclasses.fake_tensor.unset_fake_temporarily(), FakeCopyMode(mode):
        out = copy.deepcopy(obj)
    if device is not None:
        with patched_swap_tensors(), mode:
            if isinstance(out, torch.nn.Module):
                out = out.to(device)
            elif isinstance(out, torch.Tensor):
                out = out.to(device)
    return out
