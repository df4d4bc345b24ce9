"""The arguments and real kernels of ops, as the values layer reads them (Note: [values under fake tensors] in
:mod:`fakeviz._engine.values`): the tensors of an op's arguments, symbolic sizes, storage keys, and an op run for
real on the CPU values of its arguments. Shared by :mod:`fakeviz._engine.values`, :mod:`fakeviz._engine.sparse`
and :mod:`fakeviz._engine.device_fallback`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, _check_for_subclass_arg
from torch.utils._mode_utils import no_dispatch

__all__ = [
    "FAILED", "Unknown", "arg_tensors", "device_of", "flat", "has_subclass", "has_sym", "is_subclass", "real_call", "sole", "storage_key", "to_real",
]  # fmt: skip

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


def flat(x: Any, into: list[Any]) -> list[Any]:
    """Tensors of an op's outputs or arguments (top level and lists), in order."""
    if isinstance(x, _Tensor):
        into.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            if isinstance(y, _Tensor):
                into.append(y)
            elif isinstance(y, (list, tuple)):
                flat(y, into)
    return into


def arg_tensors(args: Any, kwargs: Any) -> list[Any]:
    out = flat(args, [])
    if kwargs:
        flat(list(kwargs.values()), out)
    return out


def is_subclass(x: Any) -> bool:
    """A tensor of a subclass FakeTensorMode does not run (a torchao ``Int8Tensor``, a DTensor): torch's own test
    (``fake_tensor._check_for_subclass_arg``), the plain types answered at once."""
    tx = type(x)
    if tx is FakeTensor or tx is _Tensor or tx is _Parameter or not isinstance(x, _Tensor):
        return False
    return _check_for_subclass_arg(x)


def has_subclass(args: Any, kwargs: Any) -> bool:
    """Whether an argument of an op is a tensor subclass FakeTensorMode does not run (Note: [tensor subclasses
    under the values layer] in :mod:`fakeviz._engine.values`)."""
    return any(is_subclass(t) for t in arg_tensors(args, kwargs))


def has_sym(args: Any, kwargs: Any) -> bool:
    def sym(x: Any) -> bool:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(x, (list, tuple)):
            return any(sym(y) for y in x)
        return isinstance(x, FakeTensor) and x._has_symbolic_sizes_strides

    return sym(args) or (bool(kwargs) and sym(list(kwargs.values())))


def storage_key(t: Any) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (NotImplementedError, RuntimeError):
        return None


def sole(t: Any) -> bool:
    """Whether no other tensor shares ``t``'s storage now (so giving ``t`` a value cannot leave a stale
    alias): the storage's reference count is one for ``t`` and one for the Python storage object."""
    key = storage_key(t)
    return key is not None and torch._C._storage_Use_Count(key) <= 2


FAILED = object()  # the real kernel could not run (a result of None is an op's own: _foreach_add_)


class Unknown(Exception):
    """A tensor argument without a value: the op's result is not known."""


def to_real(x: Any, placeholder: bool) -> Any:
    if isinstance(x, FakeTensor):
        c = x.constant
        if c is not None:
            return c
        if placeholder:
            with no_dispatch():
                return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype).zero_()
        raise Unknown
    if isinstance(x, torch.device):
        return torch.device("cpu")
    if isinstance(x, list):
        return [to_real(y, placeholder) for y in x]
    if isinstance(x, tuple):
        return tuple(to_real(y, placeholder) for y in x)
    return x


def real_call(func: Any, args: Any, kwargs: Any, *, placeholder: bool = False, **over: Any) -> Any:
    """``func`` run for real on the CPU values of its arguments (``Unknown`` if one has none)."""
    rargs = to_real(tuple(args), placeholder)
    rkw = {k: to_real(v, placeholder) for k, v in (kwargs or {}).items()}
    if "pin_memory" in rkw:
        rkw["pin_memory"] = None
    rkw.update(over)
    with no_dispatch():
        return func(*rargs, **rkw)


def device_of(args: Any, kwargs: Any) -> torch.device:
    dev = (kwargs or {}).get("device")
    if dev is not None:
        return torch.device(dev)
    for t in arg_tensors(args, kwargs):
        if isinstance(t, FakeTensor):
            return t.fake_device
    return torch.device("cpu")
