"""Which kind of FLOP count each op gets, and ``op_flops``, the per-call entry point of the recorder.

Each ``OpOverload`` is classified once and its kind and formula cached (``_KIND``, ``_FORMULA``);
``op_flops`` is then one dict lookup and the formula call. The rules, first match wins:

1. in ``torch.utils.flop_counter.flop_registry``: ``"registry"`` (torch's formula);
2. not an ``OpOverload``: ``"unknown"``; a namespace in ``_ZERO_NAMESPACES``: ``"zero"``;
3. an aten op named in ``ADDED_FORMULAS`` (:mod:`.formulas`; another namespace's op as ``"<ns>::<name>"``):
   ``"added"``; ``_foreach_<op>``: the kind of ``<op>`` over the tensor list; a name in ``_ZERO_NAMES``: ``"zero"``;
4. no tensor argument (factories, SymInt arithmetic) or a view: ``"zero"``;
5. pointwise (``torch.Tag.pointwise`` on any overload of the op or its in-place/functional twin, or
   an aten name in ``_ELEMENTWISE``): ``"added"``, 1 FLOP per output element;
6. a reduction (``torch.Tag.reduction``): ``"added"``, 1 FLOP per input element;
7. returns no tensor and mutates nothing (metadata and scalar reads): ``"zero"``; else ``"unknown"``.

The name lists below (``_ELEMENTWISE``, ``_ZERO_NAMES``) correct what torch's tags and schemas miss;
formulas of ops that need their own go to ``ADDED_FORMULAS`` in :mod:`.formulas`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils import flop_counter as _fc

from .formulas import (
    ADDED_FORMULAS,
    SDPA_QUERY_ARG,
    Formula,
    NoHint,
    foreach_sum,
    per_elem,
    pointwise,
    registry_formula,
    sdpa_heads_broadcast,
    unknown_formula,
    zero_formula,
)

__all__ = ["FLOP_KINDS", "flop_kind", "op_flops", "resolve_op"]

REGISTRY, ADDED, ZERO, UNKNOWN = "registry", "added", "zero", "unknown"
#: The kinds ``flop_kind`` returns, in the order ``coverage`` sorts them (unknown first).
FLOP_KINDS: tuple[str, ...] = (UNKNOWN, ADDED, REGISTRY, ZERO)

#: Elementwise aten ops that torch does not tag ``pointwise`` (1 FLOP per output element).
_ELEMENTWISE: frozenset[str] = frozenset(
    {
        "elu_backward",
        "glu",
        "glu_backward",
        "hardsigmoid_backward",
        "hardswish",
        "hardswish_",
        "hardswish_backward",
        "hardtanh_backward",
        "leaky_relu_backward",
        "log_sigmoid_backward",
        "log_sigmoid_forward",
        "mish_backward",
        "softplus_backward",
        "_prelu_kernel",
        "_prelu_kernel_backward",
        "rrelu_with_noise",
        "rrelu_with_noise_",
        "rrelu_with_noise_backward",
        "polar",
        "_masked_scale",
        "floor_divide",  # torch leaves it untagged (MoE routers: token index // top_k)
        "floor_divide_",
    }
)

#: aten ops that do no arithmetic although their schema alone does not say so.
_ZERO_NAMES: frozenset[str] = frozenset(
    {
        # copies and casts
        "clone",
        "_to_copy",
        "copy",
        "copy_",
        "_copy_from",
        "_copy_from_and_resize",
        "lift",
        "lift_fresh",
        "lift_fresh_copy",
        "contiguous",
        "_unsafe_view",
        "cat",
        "stack",
        "constant_pad_nd",
        "reflection_pad1d",
        "reflection_pad2d",
        "reflection_pad3d",
        "replication_pad1d",
        "replication_pad2d",
        "replication_pad3d",
        "repeat",
        "roll",
        "flip",
        "tril",
        "tril_",
        "triu",
        "triu_",
        "narrow_copy",
        "resolve_conj",
        "resolve_neg",
        # gathers and index copies
        "index",
        "_unsafe_index",
        "index_select",
        "gather",
        "take",
        "embedding",
        "masked_select",
        "masked_scatter",
        "masked_scatter_",
        "nonzero",
        "nonzero_static",
        "index_copy",
        "index_copy_",
        "index_fill",
        "index_fill_",
        # backward of views and gathers: a copy into zeros
        "slice_backward",
        "select_backward",
        "diagonal_backward",
        "as_strided_scatter",
        "slice_scatter",
        "select_scatter",
        "diagonal_scatter",
        # fills, *_like / new_* factories and random sampling
        "fill",
        "fill_",
        "zero",
        "zero_",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
        "normal",
        "normal_",
        "uniform",
        "uniform_",
        "bernoulli",
        "bernoulli_",
        "random",
        "random_",
        "exponential",
        "exponential_",
        "geometric",
        "geometric_",
        "cauchy",
        "cauchy_",
        "log_normal",
        "log_normal_",
        "multinomial",
        # storage and bookkeeping
        "set_",
        "resize_",
        "resize_as_",
        "_resize_output_",
        "record_stream",
        "_pin_memory",
        "detach_",
        "_local_scalar_dense",
        "_assert_async",
        "_assert_scalar",
        "_functional_assert_async",
        "_functional_assert_scalar",
        "sym_constrain_range",
        "sym_constrain_range_for_size",
        "_functional_sym_constrain_range",
        "_functional_sym_constrain_range_for_size",
    }
)

#: Whole namespaces of ops that do no arithmetic.
_ZERO_NAMESPACES: frozenset[str] = frozenset({"profiler"})


# ---------------------------------------------------------------- classification
def _is_tensor_type(t: Any) -> bool:
    return "Tensor" in str(t)


def _packet_tagged(namespace: str, name: str, tag: torch.Tag) -> bool:
    """Whether any overload of op ``name`` or of its in-place/functional twin carries ``tag``."""
    ns = getattr(torch.ops, namespace)
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    for pname in (base, base + "_"):
        try:
            packet = getattr(ns, pname)
        except (AttributeError, RuntimeError):
            continue
        for overload in packet.overloads():
            if tag in getattr(packet, overload).tags:
                return True
    return False


def _is_view(func: OpOverload) -> bool:
    schema = func._schema
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return True
    tags = func.tags
    return torch.Tag.inplace_view in tags or torch.Tag.view_copy in tags


def _classify_foreach(func: OpOverload, name: str) -> tuple[str, Formula]:
    """``_foreach_<op>``: the kind of ``<op>``, counted over the whole tensor list."""
    base = name[len("_foreach_") :]
    target = base[:-1] if base.endswith("_") else base
    if base in _ZERO_NAMES or target in _ZERO_NAMES:
        return ZERO, zero_formula
    if (
        target in _ELEMENTWISE
        or _packet_tagged("aten", target, torch.Tag.pointwise)
        or _packet_tagged("aten", target, torch.Tag.reduction)
    ):
        return ADDED, foreach_sum(func)
    return UNKNOWN, unknown_formula


def _classify_uncached(func: Any) -> tuple[str, Formula]:
    packet = getattr(func, "_overloadpacket", func)
    torch_formula = _fc.flop_registry.get(packet)
    if torch_formula is not None:
        q = SDPA_QUERY_ARG.get(getattr(packet, "__name__", ""))
        formula = registry_formula(torch_formula)
        return REGISTRY, formula if q is None else sdpa_heads_broadcast(formula, q)
    if not isinstance(func, OpOverload):
        return UNKNOWN, unknown_formula
    namespace = func.namespace
    name = func._schema.name.split("::", 1)[-1]
    if namespace in _ZERO_NAMESPACES:
        return ZERO, zero_formula
    if namespace == "aten":
        factory = ADDED_FORMULAS.get(name)
        if factory is not None:
            return ADDED, factory(func)
        if name.startswith("_foreach_"):
            return _classify_foreach(func, name)
        if name in _ZERO_NAMES:
            return ZERO, zero_formula
    else:
        factory = ADDED_FORMULAS.get(f"{namespace}::{name}")
        if factory is not None:
            return ADDED, factory(func)
    schema = func._schema
    if not any(_is_tensor_type(a.type) for a in schema.arguments):
        return ZERO, zero_formula  # factories, SymInt/scalar arithmetic
    if _is_view(func):
        return ZERO, zero_formula
    if (namespace == "aten" and name in _ELEMENTWISE) or _packet_tagged(namespace, name, torch.Tag.pointwise):
        return ADDED, pointwise
    if _packet_tagged(namespace, name, torch.Tag.reduction):
        return ADDED, per_elem(1)(func)
    returns_tensor = any(_is_tensor_type(r.type) for r in schema.returns)
    mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if not returns_tensor and not mutates:
        return ZERO, zero_formula  # metadata and scalar reads
    return UNKNOWN, unknown_formula


_FORMULA: dict[Any, Formula] = {}
_KIND: dict[Any, str] = {}


def _classify(func: Any) -> Formula:
    kind, formula = _classify_uncached(func)
    _KIND[func] = kind
    _FORMULA[func] = formula
    return formula


# ---------------------------------------------------------------- public API
def op_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    """FLOPs of one op call, as a TorchDispatchMode sees it at the outermost dispatch.

    Args:
        func: the ``OpOverload`` (e.g. ``torch.ops.aten.mm.default``).
        args: its positional arguments (real or fake tensors and values).
        kwargs: its keyword arguments (``None`` or a dict).
        out: what the op returned.

    Returns:
        The FLOPs (see the module docstring for the conventions); ``0`` for ops
        that do no arithmetic; ``-1`` when there is no formula for ``func`` or a
        size it needs is symbolic without a hint.
    """
    formula = _FORMULA.get(func)
    if formula is None:
        formula = _classify(func)
    try:
        return formula(args, kwargs, out)
    except (NoHint, GuardOnDataDependentSymNode):
        return -1


def resolve_op(name: str) -> OpOverload | None:
    """The ``OpOverload`` named like ``"aten.mm.default"`` (``str(func)``), or ``None``."""
    parts = name.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    namespace, packet, overload = parts
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, OpOverload) else None


_NAME_KIND: dict[str, str] = {}


def flop_kind(func: Any) -> str:
    """Where ``op_flops`` gets its number for ``func`` (an ``OpOverload`` or its name).

    Returns:
        ``"registry"`` (torch's formula), ``"added"`` (ours), ``"zero"`` (no
        arithmetic) or ``"unknown"`` (no formula; also for names that do not
        resolve to an op).
    """
    if isinstance(func, str):
        kind = _NAME_KIND.get(func)
        if kind is None:
            op = resolve_op(func)
            kind = UNKNOWN if op is None else flop_kind(op)
            _NAME_KIND[func] = kind
        return kind
    kind = _KIND.get(func)
    if kind is None:
        _classify(func)
        kind = _KIND[func]
    return kind
