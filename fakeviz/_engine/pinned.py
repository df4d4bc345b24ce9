"""Pinned host memory under fake tensors: ``Tensor.pin_memory()`` in fakeviz's fake modes.

Note: [pinned memory under fake tensors]
torch's FakeTensorMode has no rule for ``aten._pin_memory`` (``fake_impls`` raises ``NYI``), and FSDP2's CPU offload
(``CPUOffloadPolicy(pin_memory=True)``, Note: [offload] in :mod:`fakeviz._frontends.offload`) pins every sharded
parameter with it. The real kernel (``at::native::_pin_memory``, ``aten/src/ATen/native/Memory.cpp``) allocates a
host storage of ``computeStorageNbytes(sizes, strides)`` bytes from the pinned-memory allocator, sets a cpu tensor of
the input's sizes and strides on it and copies the input in: a new host storage, the input left as it was. The rule
below makes that output (same sizes, strides and dtype, on the cpu) for the fake modes fakeviz makes
(:func:`fakeviz._engine.moe.adopted`); other fake modes get torch's behaviour. Pinned or pageable, the bytes are the
same: the record does not mark which host storages are pinned.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import in_kernel_invocation_manager

from . import patches as _patches
from . import torch_compat
from .moe import adopted

__all__ = ["FAKE_RULE_OPS"]

#: the ops that get a fake rule here (``fidelity()`` reports their rule as ``"fakeviz rule"``)
FAKE_RULE_OPS: frozenset[str] = frozenset(
    name for name in ("aten._pin_memory.default",) if torch_compat.op_or_none(name) is not None
)

_PREVIOUS: dict[Any, Any] = {}  # op -> the rule fakeviz's replaced


def _pin_memory_rule(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """FakeTensorMode's implementation of ``aten._pin_memory`` for fakeviz's modes: a new host tensor of the
    input's sizes, strides and dtype."""
    if not adopted(mode):
        prev = _PREVIOUS.get(func)
        if prev is not None:
            return prev(mode, func, *args, **kwargs)
        raise NotImplementedError(f"NYI: {func}")  # torch's own answer for this op
    src = args[0] if args else kwargs["self"]
    with in_kernel_invocation_manager(mode):
        meta = torch.empty_strided(src.size(), src.stride(), dtype=src.dtype, device="meta")
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, torch.device("cpu"))


def _install() -> None:
    op = torch_compat.op_or_none("aten._pin_memory.default")
    if op is not None:
        _patches.install_fake_rule(op, _pin_memory_rule, _PREVIOUS)


_install()
