"""Mixture of experts under fake tensors: the fake rule of ``aten._grouped_mm`` and the routing assumption.

Note: [grouped_mm under fake tensors]
``torch._grouped_mm`` (``F.grouped_mm``, what transformers' default ``"grouped_mm"`` experts implementation
calls) is one kernel for all experts: row ``i`` of the jagged operand belongs to the group whose offset
(``offs``, a cumulative int32 count of tokens per expert) first exceeds ``i``.

What the real kernels of this torch build do (``ATen/native/GroupedMMUtils.h``, shipped in the wheel's
``include/``; CPU: the ``CompositeExplicitAutograd`` kernel, CUDA: ``_grouped_mm_cuda`` in
``native/cuda/GroupedBlas.cpp``):

* both take float32, bfloat16 and float16 (``_grouped_mm_validate_inputs``); the two operands must have the
  same dtype (else the per-group ``mm``/``bmm`` fails), ``out_dtype`` must be ``mat_a``'s, ``offs`` int32 and
  1-D exactly when an operand is 2-D, no bias, and each operand's leading stride a multiple of 16 bytes (on
  CUDA the data pointer too);
* a real GPU takes CUTLASS's grouped GEMM only for bfloat16 on sm90/sm100 (H100, H200, B200); otherwise, and
  on CPU, a loop of ``mm_out`` per group after copying ``offs`` to the host. Both write into the same output:
  ``create_grouped_gemm_output_tensor``, whose last dimension's stride is padded to 16 bytes (except on ROCm).

torch's Python meta kernel (``_meta_grouped_mm_common``) still checks for bfloat16 only, so float32 and
float16 fail under FakeTensorMode (with an ERROR traceback logged by ``fake_tensor.py`` for each failure),
and it pads the output only when ``torch.version.cuda`` is set, so on a CPU-only build its strides are not
the real CPU kernel's.

The rule below is the real kernels' (same checks and messages, same output size, strides and dtype). It is
registered in FakeTensorMode's table of op implementations (``fake_impls.op_implementations_dict``), which
FakeTensorMode consults before the meta kernel, and it applies only to the fake modes fakeviz makes
(:func:`adopt`, called by ``session.new_fake_mode``: recordings, ``FakeSession``, ``fake_mode()``, ``prop``,
``check_export``); for every other FakeTensorMode it returns ``NotImplemented`` and torch's meta kernel runs
as before. Why not replace the meta kernel: torch.compile and inductor trace with the meta kernel, and
inductor's ``tuned_grouped_mm`` assumes bfloat16; widening it for every FakeTensorMode would change what
compile accepts. Why not only during a recording: a ``FakeSession`` or ``fake_mode()`` scope is also
fakeviz's, and the rule is what the real kernel does, so it holds whenever the tensors are ours.

One residue: FakeTensorMode's dispatch cache (``FakeTensorMode.cache``) is shared by every mode of the
process and its key does not name the mode. An entry this rule made can answer a later identical call of a
plain FakeTensorMode (which then gets the real kernel's answer), and an entry a plain mode made on a CPU-only
build (bfloat16 with an unpadded last dimension, i.e. ``N * 2`` not a multiple of 16) can answer ours. It
takes the same op on the same shapes, strides and dtypes in both kinds of mode in one process.

Routing (the ``offs`` values) is unknown under fake tensors. Nothing in the record depends on it: the
output of ``_grouped_mm`` is ``[rows, N]`` (``[groups, M, N]`` for 2-D x 2-D) whatever the split, and the
FLOPs, ``2 * rows * K * N``, are the same for any split as long as every row is routed
(``offs[-1] == rows``, which transformers' experts guarantee unless expert parallelism marks rows as
sentinels). That is the assumption, named for each such op by :func:`op_assumption` and listed by
``fidelity()["assumptions"]``. The time of the op on a GPU does depend on the split (and on which kernel
runs, above); fakeviz does not model time. So a balanced or a skewed routing gives the same record on this
path (and on transformers' ``batched_mm`` path: a gather of the chosen experts' weights, then ``bmm``).
Routing changes the record only where code reads it: transformers' ``eager`` experts loop over the experts
hit (``nonzero``, ``torch.where`` of the routing mask), whose sizes follow the values the run knows or
assumes (Note: [values under fake tensors]).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import in_kernel_invocation_manager

from . import patches as _patches
from . import torch_compat

__all__ = [
    "ACCEPTED_DTYPES",
    "FAKE_RULE_OPS",
    "adopt",
    "adopted",
    "grouped_mm_output",
    "op_assumption",
]

#: The dtypes the real ``_grouped_mm`` kernels accept (CPU and CUDA alike).
ACCEPTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

_C10_NAME = {
    torch.float32: "float",
    torch.float64: "double",
    torch.bfloat16: "c10::BFloat16",
    torch.float16: "c10::Half",
}
_SCALAR_NAME = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.bfloat16: "BFloat16",
    torch.float16: "Half",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}

_MODES: weakref.WeakSet[Any] = weakref.WeakSet()


def adopt(mode: Any) -> Any:
    """Apply fakeviz's fake rules (Note: [grouped_mm under fake tensors]) to the fake mode ``mode``; returns it."""
    _MODES.add(mode)
    return mode


def adopted(mode: Any) -> bool:
    """Whether ``mode`` is one of fakeviz's fake modes (:func:`adopt`)."""
    return mode in _MODES


# --------------------------------------------------------------------------- the rule
def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


def _valid_strides(mat: torch.Tensor) -> None:
    """``check_valid_strides_and_return_transposed``: 16-byte leading stride (and, off CPU, data pointer)."""
    stride, size = mat.stride(), mat.shape
    end = mat.dim() - 1
    item = mat.element_size()
    alignment = 16 // item
    if mat.device.type not in ("cpu", "meta"):
        # a fake storage starts where the caching allocator puts blocks (512-byte aligned): the offset decides
        _check(mat.storage_offset() * item % 16 == 0, "expected data_ptr to be aligned to 16 bytes")
    if stride[end - 1] == 1 and stride[end] >= max(1, size[end - 1]):
        _check(stride[end] % alignment == 0, "strides should be multiple of 16 bytes")
    elif stride[end] == 1 and stride[end - 1] >= max(1, size[end]):
        _check(stride[end - 1] % alignment == 0, "strides should be multiple of 16 bytes")
    else:
        _check(False, f"Invalid strides/sizes, got {list(stride)} for strides and {list(size)} for sizes")


def _out_size(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None) -> list[Any]:
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:
        assert offs is not None
        return [offs.size(0), mat_a.size(0), mat_b.size(1)]
    if a2:
        assert offs is not None
        _check(offs.size(0) == mat_b.size(0), "matrix batch sizes have to match")
        return [mat_a.size(0), mat_b.size(-1)]
    if b2:
        assert offs is not None
        _check(offs.size(0) == mat_a.size(0), "matrix batch sizes have to match")
        return [mat_a.size(1), mat_b.size(1)]
    _check(mat_a.size(0) == mat_b.size(0), "batched dimension has to match")
    return [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]


def grouped_mm_output(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[list[Any], list[Any], torch.dtype]:
    """The checks of the real ``_grouped_mm`` kernel, and its output's size, stride and dtype.

    Works on the metadata only (real, fake or meta tensors; sizes may be SymInts).

    Raises:
        RuntimeError: what the real kernel raises for these arguments (same message), for every error that
            does not depend on the values of ``offs``.
    """
    for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        _check(
            mat.dtype in ACCEPTED_DTYPES,
            f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {_SCALAR_NAME.get(mat.dtype, mat.dtype)}",
        )
    _check(mat_a.dim() in (2, 3), "mat_a has to be 2 or 3d")
    _check(mat_b.dim() in (2, 3), "mat_b has to be 2 or 3d")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if not a2 or not b2:
        _check(mat_a.size(-1) == mat_b.size(-2), "contraction dimension of mat_a and mat_b must match")
    _valid_strides(mat_a)
    _valid_strides(mat_b)
    _check(
        (offs is not None) == (a2 or b2),
        "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d",
    )
    if offs is not None:
        _check(offs.dim() == 1, "offs has to be 1D")
        _check(offs.dtype == torch.int32, "Offsets have to be int32")
    _check(bias is None, "Bias not supported yet")
    dtype = out_dtype if out_dtype is not None else mat_a.dtype
    _check(dtype == mat_a.dtype, "Grouped gemm output dtype must match `mat_a` dtype")
    size = _out_size(mat_a, mat_b, offs)
    if mat_a.dtype != mat_b.dtype:  # the per-group mm_out / bmm_out of the kernel
        a, b = _C10_NAME.get(mat_a.dtype, str(mat_a.dtype)), _C10_NAME.get(mat_b.dtype, str(mat_b.dtype))
        if a2 or b2:
            _check(False, f"expected m1 and m2 to have the same dtype, but got: {a} != {b}")
        _check(False, f"Expected out tensor to have dtype {b}, but got {a} instead")
    if torch.version.hip:
        stride = _contiguous(size)  # ROCm: at::empty (at::zeros for 2-D x 2-D)
    else:
        alignment = 16 // dtype.itemsize
        padded = (size[-1] + alignment - 1) // alignment * alignment
        stride = [padded, 1] if a2 != b2 else [size[1] * padded, padded, 1]
    return size, stride, dtype


def _contiguous(size: list[Any]) -> list[Any]:
    stride: list[Any] = []
    acc: Any = 1
    for s in reversed(size):
        stride.append(acc)
        acc = acc * s
    return stride[::-1]


def _grouped_mm_rule(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """FakeTensorMode's implementation of ``aten._grouped_mm`` for fakeviz's modes."""
    if mode not in _MODES:
        prev = _PREVIOUS.get(func)
        return prev(mode, func, *args, **kwargs) if prev is not None else NotImplemented
    names = ("mat_a", "mat_b", "offs", "bias", "out_dtype")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    mat_a, mat_b = bound["mat_a"], bound["mat_b"]
    size, stride, dtype = grouped_mm_output(mat_a, mat_b, bound.get("offs"), bound.get("bias"), bound.get("out_dtype"))
    with in_kernel_invocation_manager(mode):
        if torch.version.hip and mat_a.dim() == 2 and mat_b.dim() == 2:
            meta = torch.zeros(size, dtype=dtype, device="meta")
        else:
            meta = torch.empty_strided(size, stride, dtype=dtype, device="meta")
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, mat_a.device)


#: Ops that get a fake rule of fakeviz's (``fidelity()`` reports their rule as ``"fakeviz rule"``): ``_grouped_mm``
#: where this torch has it (torch >= 2.8; without it there is nothing to rule, Note: [torch versions]).
FAKE_RULE_OPS: frozenset[str] = frozenset(
    name for name in ("aten._grouped_mm.default",) if torch_compat.op_or_none(name) is not None
)

_PREVIOUS: dict[Any, Any] = {}  # op -> the rule fakeviz's replaced


def _install() -> None:
    op = torch_compat.op_or_none("aten._grouped_mm.default")
    if op is not None:
        _patches.install_fake_rule(op, _grouped_mm_rule, _PREVIOUS)


_install()


# ------------------------------------------------------------------------ assumptions
_ROUTED = (
    "routing: tokens per expert (offs) are not known without data; output shape and memory do not depend on "
    "them, FLOPs assume every row is routed (offs[-1] = rows: {rows}), whatever the split among experts "
    "(balanced or skewed alike; the time on a GPU does depend on it, and is not modelled)"
)

#: Ops whose FLOPs or memory would depend on routing, and the argument that holds the jagged rows.
_ROUTED_OPS: dict[str, str] = {
    "aten._grouped_mm.default": "_grouped_mm",
    "transformers.grouped_mm_fallback.default": "fallback",
    "transformers.grouped_mm_fallback_backward.default": "fallback",
}


def op_assumption(op: str) -> str | None:
    """The routing assumption behind op ``op``'s record (FLOPs per group), or ``None`` for ops without one.

    See Note: [grouped_mm under fake tensors]. The same assumption holds for a real run's record, whose FLOP
    counts are the same function of the shapes.
    """
    kind = _ROUTED_OPS.get(op)
    if kind is None:
        return None
    rows = "all rows of the jagged operand" if kind == "_grouped_mm" else "all rows of input"
    return _ROUTED.format(rows=rows)
