"""FLOP formulas: their building blocks and ``ADDED_FORMULAS``, our formulas by aten op name.

Where to add an op's FLOP formula
---------------------------------
* An op that does arithmetic which ``torch.utils.flop_counter.flop_registry``
  does not count: add ``"<aten op name>": <factory>`` to ``ADDED_FORMULAS`` at
  the end of this file (the entry covers every overload of that name; list
  in-place variants by their own name; an op of another namespace, such as a
  library's custom op, as ``"<namespace>::<name>"``). A factory gets the ``OpOverload`` once
  (it may read the schema, e.g. with ``_getter``) and returns a ``Formula``,
  ``formula(args, kwargs, out) -> flops``, called on every recorded call of
  the op. Build it from the helpers here (``per_elem``, ``_matmul``,
  ``_norm_forward``, ``_if_arg``, ``_pool``, ``_registry_of``, ...) or write a
  new one, and add the rule to the conventions of :mod:`fakeviz._engine.flops`
  (the package docstring).
* An elementwise op that torch does not tag ``pointwise``: ``_ELEMENTWISE`` in
  :mod:`.classify` (counted with ``pointwise``, 1 FLOP per output element).
* An op that does no arithmetic although its schema does not say so:
  ``_ZERO_NAMES`` in :mod:`.classify`.

Sizes are read as ints: a ``SymInt`` by its hint; an unbacked one raises
``NoHint``, which ``op_flops`` turns into ``-1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils import flop_counter as _fc

__all__ = [
    "ADDED_FORMULAS",
    "SDPA_QUERY_ARG",
    "Formula",
    "NoHint",
    "first_tensor",
    "foreach_sum",
    "per_elem",
    "pointwise",
    "registry_formula",
    "sdpa_heads_broadcast",
    "unknown_formula",
    "zero_formula",
]

aten = torch.ops.aten
_Tensor = torch.Tensor

#: ``formula(args, kwargs, out) -> flops``; kwargs may be ``None``.
Formula = Callable[[tuple[Any, ...], dict[str, Any] | None, Any], int]
#: Builds the formula of one overload (it may read the overload's schema).
_Factory = Callable[[OpOverload], Formula]
#: Reads one argument of a call: ``getter(args, kwargs) -> value``.
_Getter = Callable[[tuple[Any, ...], dict[str, Any] | None], Any]


class NoHint(Exception):
    """A size is an unbacked SymInt: no trustworthy concrete value."""


# ----------------------------------------------------------------------------- sizes
def _as_int(x: Any) -> int:
    """A size or count as an int: SymInts by their hint; raises ``NoHint`` without one."""
    if type(x) is int:
        return x
    if isinstance(x, torch.SymInt):
        node = x.node
        if node.has_hint():
            hint = node.hint
            if type(hint) is int:
                return hint
        raise NoHint
    return int(x)


def _numel(t: _Tensor) -> int:
    n = t.numel()
    return n if type(n) is int else _as_int(n)


def first_tensor(x: Any) -> _Tensor | None:
    """``x`` if it is a tensor, else the first tensor in a (nested) tuple or list."""
    if isinstance(x, _Tensor):
        return x
    if isinstance(x, (tuple, list)):
        for item in x:
            t = first_tensor(item)
            if t is not None:
                return t
    return None


# ------------------------------------------------------------------- constant formulas
def zero_formula(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    """The formula of ops that do no arithmetic: 0."""
    return 0


def unknown_formula(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    """The formula of ops without one: -1."""
    return -1


# ------------------------------------------------------------------- argument getters
def _getter(func: OpOverload, name: str) -> _Getter:
    """A reader for argument ``name`` of ``func``'s calls, positional or keyword.

    The dispatcher drops trailing positional arguments that equal their
    default, so a missing one reads as the schema's default.

    Raises:
        KeyError: ``func`` has no argument ``name``.
    """
    found = [(i, a) for i, a in enumerate(func._schema.arguments) if a.name == name]
    if not found:
        raise KeyError(f"{func} has no argument {name!r}")
    index, arg = found[0]
    default = arg.default_value if arg.has_default_value() else None
    if arg.kwarg_only:
        return lambda args, kwargs: kwargs.get(name, default) if kwargs else default

    def get(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
        if index < len(args):
            return args[index]
        return kwargs.get(name, default) if kwargs else default

    return get


def _opt_getter(func: OpOverload, name: str) -> _Getter:
    """Like ``_getter``, reading ``None`` when ``func`` has no argument ``name``."""
    try:
        return _getter(func, name)
    except KeyError:
        return lambda args, kwargs: None


def _const(value: Any) -> _Getter:
    return lambda args, kwargs: value


def _first_arg(func: OpOverload) -> _Getter:
    return _getter(func, func._schema.arguments[0].name)


def _tensor_list_arg(func: OpOverload) -> _Getter:
    """A reader for the first ``Tensor[]`` argument of a ``_foreach_*``/fused op."""
    for arg in func._schema.arguments:
        if str(arg.type) in ("List[Tensor]", "Tensor[]"):
            return _getter(func, arg.name)
    raise KeyError(f"{func} has no Tensor[] argument")


def _mask(value: Any, n: int) -> tuple[bool, ...]:
    return (True,) * n if value is None else tuple(bool(v) for v in value)


# ---------------------------------------------------------------- registry formulas
def _shapes(x: Any) -> Any:
    """``tree_map(get_shape, x)`` as torch's ``shape_wrapper`` does it, without pytree's cost.

    Tensors become their ``.shape``; tuples (``torch.Size`` and structseqs
    included) and lists are rebuilt as plain tuples and lists, dicts with the
    same keys; everything else is left as is.
    """
    if isinstance(x, _Tensor):
        return x.shape
    if type(x) is list:
        return [_shapes(i) for i in x]
    if isinstance(x, tuple):
        return tuple(_shapes(i) for i in x)
    if type(x) is dict:
        return {k: _shapes(v) for k, v in x.items()}
    return x


_SHAPE_WRAPPER_CODE = _fc.shape_wrapper(lambda: 0).__code__


def registry_formula(formula: Callable[..., Any]) -> Formula:
    """Call a registry formula exactly as ``FlopCounterMode._count_flops`` does.

    FlopCounterMode calls ``formula(*args, **kwargs, out_val=out)``. Most
    registry formulas are torch's ``shape_wrapper`` around a function of
    shapes; for those the shapes are taken here with ``_shapes`` and the inner
    function is called directly (pytree's ``tree_map`` costs about 10 µs a call).
    """
    inner = getattr(formula, "__wrapped__", None)
    if inner is not None and getattr(formula, "__code__", None) is _SHAPE_WRAPPER_CODE:

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            shapes = tuple(_shapes(a) for a in args)
            if kwargs:
                r = inner(*shapes, out_shape=_shapes(out), **_shapes(kwargs))
            else:
                r = inner(*shapes, out_shape=_shapes(out))
            return r if type(r) is int else _as_int(r)

        return flops

    def flops_raw(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        r = formula(*args, **kwargs, out_val=out) if kwargs else formula(*args, out_val=out)
        return r if type(r) is int else _as_int(r)

    return flops_raw


#: SDPA ops whose formula (torch's registry or ``ADDED_FORMULAS``) counts ``[batch, heads, seq, dim]`` query, key
#: and value: op name -> position of the query argument (the key and the value follow it).
SDPA_QUERY_ARG: dict[str, int] = {
    **dict.fromkeys(("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_dot_product_fused_attention_overrideable"), 0),
    **dict.fromkeys(("_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
                     "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
                     "_scaled_dot_product_fused_attention_overrideable_backward"), 1),
}  # fmt: skip


def sdpa_heads_broadcast(formula: Formula, q: int) -> Formula:
    """``formula`` of an SDPA op with the key and value (arguments ``q + 1``, ``q + 2``) counted at the query's heads.

    Grouped-query attention passes a key and value with fewer heads than the query. torch >= 2.12's SDPA formulas
    count every product at the query's heads; older ones (2.10, 2.11) assert equal heads, and the op got no FLOPs
    (Note: [torch versions]). Counting the key and value as broadcast to the query's heads is what 2.12's formulas
    do, so a record's FLOPs are the same on every torch.
    """

    def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        if len(args) > q + 2:
            query, key, value = args[q], args[q + 1], args[q + 2]
            if (
                isinstance(key, _Tensor) and isinstance(value, _Tensor) and isinstance(query, _Tensor)
                and query.dim() == key.dim() == value.dim() == 4 and key.shape[1] != query.shape[1]
            ):  # fmt: skip
                heads = query.shape[1]
                k = (key.shape[0], heads, key.shape[2], key.shape[3])
                v = (value.shape[0], heads, value.shape[2], value.shape[3])
                args = (*args[: q + 1], k, v, *args[q + 3 :])
        return formula(args, kwargs, out)

    return flops


def _registry_of(packet: Any) -> _Factory:
    """An added op that takes the registry formula of another op (same argument order)."""

    def factory(func: OpOverload) -> Formula:
        formula = registry_formula(_fc.flop_registry[packet])
        q = SDPA_QUERY_ARG.get(func._schema.name.split("::", 1)[-1])
        return formula if q is None else sdpa_heads_broadcast(formula, q)

    return factory


# ---------------------------------------------------------------- generic formulas
def pointwise(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    """1 FLOP per element of the first output (of the first tensor argument without one)."""
    if isinstance(out, _Tensor):
        n = out.numel()
        return n if type(n) is int else _as_int(n)
    t = first_tensor(out)
    if t is None:
        t = first_tensor(args)
    if t is None:
        return -1
    return _numel(t)


def per_elem(per: int, arg: str | None = None) -> _Factory:
    """``per`` FLOPs per element of argument ``arg`` (the first argument by default)."""

    def factory(func: OpOverload) -> Formula:
        get = _getter(func, arg) if arg else _first_arg(func)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            return per * _numel(get(args, kwargs))

        return flops

    return factory


def foreach_sum(func: OpOverload) -> Formula:
    """1 FLOP per element of every tensor of the op's first tensor list."""
    get = _tensor_list_arg(func)

    def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        return sum(_numel(t) for t in get(args, kwargs))

    return flops


# ---------------------------------------------------------------- added formulas
def _matmul(a_name: str, b_name: str, *, outer: bool = False, activation: bool = False) -> _Factory:
    """``2*m*n*k`` (``bmm``-like: times the batch) from the two operands' shapes.

    ``a`` is ``[..., m, k]`` (or ``[k]``), ``b`` is ``[..., k, n]`` (or ``[k]``:
    ``n = 1``); with ``outer`` ``a`` and ``b`` are vectors ``[m]``, ``[n]`` (k=1).
    """

    def factory(func: OpOverload) -> Formula:
        get_a, get_b = _getter(func, a_name), _getter(func, b_name)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            a, b = get_a(args, kwargs), get_b(args, kwargs)
            if outer:
                mn = _numel(a) * _numel(b)
                return 2 * mn
            n = _as_int(b.shape[-1]) if b.dim() >= 2 else 1
            total = 2 * _numel(a) * n
            if activation:
                total += pointwise(args, kwargs, out)
            return total

        return flops

    return factory


def _norm_forward(*, rms: bool = False, training: str | bool = True, bias: bool = True) -> _Factory:
    """Layer/group/batch/RMS norm forward (see the module table)."""

    def factory(func: OpOverload) -> Formula:
        get_x = _first_arg(func)
        get_w = _opt_getter(func, "weight")
        get_b = _opt_getter(func, "bias") if bias else _const(None)
        get_train = _getter(func, training) if isinstance(training, str) else _const(training)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            if rms:
                per = 3
            else:
                per = 5 if get_train(args, kwargs) else 2
            per += (get_w(args, kwargs) is not None) + (get_b(args, kwargs) is not None)
            return per * _numel(get_x(args, kwargs))

        return flops

    return factory


def _norm_backward(
    *, input_name: str = "input", rms: bool = False, training: str | bool = True, mask: str | None = "output_mask"
) -> _Factory:
    """Layer/group/batch/RMS norm backward (see the module table)."""

    def factory(func: OpOverload) -> Formula:
        get_x = _getter(func, input_name)
        get_w = _opt_getter(func, "weight")
        get_train = _getter(func, training) if isinstance(training, str) else _const(training)
        get_mask = _getter(func, mask) if mask else _const(None)
        n_out = len(func._schema.returns)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            m = _mask(get_mask(args, kwargs), n_out)
            grad_in, grad_w = m[0], m[1]
            grad_b = len(m) > 2 and m[2]
            w = get_w(args, kwargs) is not None
            per = 0
            if rms:
                per += 1 if grad_in or grad_w else 0  # x-hat
                per += 5 + w if grad_in else 0
            else:
                train = bool(get_train(args, kwargs))
                per += 2 if (grad_in and train) or grad_w else 0  # x-hat
                if grad_in:
                    per += (7 if train else 1) + w
                per += 1 if grad_b else 0
            per += 2 if grad_w else 0
            return per * _numel(get_x(args, kwargs))

        return flops

    return factory


def _fused_adam(func: OpOverload) -> Formula:
    get_params = _tensor_list_arg(func)
    get_wd, get_ams = _getter(func, "weight_decay"), _getter(func, "amsgrad")
    get_max, get_scale = _getter(func, "maximize"), _getter(func, "grad_scale")

    def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        per = 7 + (get_wd(args, kwargs) != 0) + bool(get_ams(args, kwargs)) + bool(get_max(args, kwargs))
        per += get_scale(args, kwargs) is not None
        return per * sum(_numel(p) for p in get_params(args, kwargs))

    return flops


def _fused_sgd(func: OpOverload) -> Formula:
    get_params = _tensor_list_arg(func)
    get_wd, get_mom = _getter(func, "weight_decay"), _getter(func, "momentum")
    get_nesterov, get_max = _getter(func, "nesterov"), _getter(func, "maximize")
    get_first, get_scale = _getter(func, "is_first_step"), _getter(func, "grad_scale")

    def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        per = 1 + (get_wd(args, kwargs) != 0) + bool(get_max(args, kwargs)) + (get_scale(args, kwargs) is not None)
        if get_mom(args, kwargs) != 0:
            per += (0 if get_first(args, kwargs) else 2) + bool(get_nesterov(args, kwargs))
        return per * sum(_numel(p) for p in get_params(args, kwargs))

    return flops


def _dropout(func: OpOverload) -> Formula:
    get_train = _getter(func, "train")

    def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        return 0 if get_train(args, kwargs) is False else pointwise(args, kwargs, out)

    return flops


def _if_arg(cond_arg: str, count_arg: str, *, when: Callable[[Any], bool] = bool) -> _Factory:
    """1 FLOP per element of ``count_arg`` when ``when(cond_arg)`` holds, else 0 (a plain copy)."""

    def factory(func: OpOverload) -> Formula:
        get_cond = _opt_getter(func, cond_arg)
        get_count = _getter(func, count_arg)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            return _numel(get_count(args, kwargs)) if when(get_cond(args, kwargs)) else 0

        return flops

    return factory


def _mse_loss(func: OpOverload) -> Formula:
    get_x, get_red = _first_arg(func), _getter(func, "reduction")

    def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        return (3 if get_red(args, kwargs) else 2) * _numel(get_x(args, kwargs))

    return flops


def _window_cells(kernel_size: Any) -> int:
    k = [_as_int(v) for v in kernel_size]
    return k[0] * k[0] if len(k) == 1 else math.prod(k)


def _pool(count: str) -> _Factory:
    """avg/max pool 2d: elements of ``count`` (``"out"``: the first output) times window cells."""

    def factory(func: OpOverload) -> Formula:
        get_k = _getter(func, "kernel_size")
        get_count = None if count == "out" else _getter(func, count)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            n = pointwise(args, kwargs, out) if get_count is None else _numel(get_count(args, kwargs))
            return n * _window_cells(get_k(args, kwargs))

        return flops

    return factory


def _grouped_mm(func: OpOverload) -> Formula:
    """``aten._grouped_mm``: ``2 * m_g * k_g * n_g`` per group, summed over the groups.

    The group sizes (``offs``) are not needed: every layout sums to ``2 * M * K * N`` of the whole
    jagged operand, as long as every row of it is routed (``offs[-1]`` = its length; Note: [grouped_mm
    under fake tensors]):

    * 2-D x 3-D ``[rows, K] x [G, K, N]``: group ``g`` multiplies its ``m_g`` rows, ``sum m_g = rows``;
    * 2-D x 2-D ``[M, K] x [K, N]`` (the weight gradient): group ``g`` contracts its ``k_g`` of ``K``;
    * 3-D x 2-D ``[G, M, K] x [K, N]``: group ``g`` makes its ``n_g`` of ``N`` columns;
    * 3-D x 3-D ``[G, M, K] x [G, K, N]``: a ``bmm``.
    """
    get_a, get_b = _getter(func, "self"), _getter(func, "mat2")

    def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        a, b = get_a(args, kwargs), get_b(args, kwargs)
        n = _as_int(b.shape[-1])
        if a.dim() == 3 and b.dim() == 3:
            return 2 * _numel(a) * n
        if a.dim() == 3:  # [G, M, K] x [K, N]: one [M, K] per group
            return 2 * _as_int(a.shape[1]) * _as_int(a.shape[2]) * n
        return 2 * _numel(a) * n  # [rows, K] x [G, K, N] or [M, K] x [K, N]

    return flops


def _grouped_mm_fallback(*, backward: bool) -> _Factory:
    """transformers' ``grouped_mm_fallback`` (``[S, K] x [E, K, N]`` by group): ``2 * S * K * N``; its backward
    computes the input's and the weight's gradients: twice that. Every row routed, as for ``_grouped_mm``."""

    def factory(func: OpOverload) -> Formula:
        get_x, get_w = _getter(func, "input"), _getter(func, "weight")

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            one = 2 * _numel(get_x(args, kwargs)) * _as_int(get_w(args, kwargs).shape[-1])
            return 2 * one if backward else one

        return flops

    return factory


def _quantized_matmul(weight: str, dim: int) -> _Factory:
    """A pre-quantized layer's kernel (``fakeviz::gptq_gemm``, ``awq_gemm``, ``scaled_matmul``; Note: [quantized
    kernels through fake rules]): the matmul it computes, ``2 * rows * K * N``, ``N`` from ``weight``'s ``dim``."""

    def factory(func: OpOverload) -> Formula:
        get_x, get_w = _getter(func, "x"), _getter(func, weight)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            return 2 * _numel(get_x(args, kwargs)) * _as_int(get_w(args, kwargs).shape[dim])

        return flops

    return factory


def _bnb_matmul(x: str, n_from: str, *, shape: bool = False) -> _Factory:
    """bitsandbytes' quantized matmuls (``gemm_4bit``, ``int8_scaled_mm``, ...; Note: [bitsandbytes under fake
    tensors]): ``2 * rows * K * N`` from the input ``x`` and the weight's ``N``, its first dimension (``n_from`` a
    tensor ``[N, K]``, or with ``shape`` the ``[N, K]`` list a packed weight's op takes)."""

    def factory(func: OpOverload) -> Formula:
        get_x, get_n = _getter(func, x), _getter(func, n_from)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            n = get_n(args, kwargs)
            return 2 * _numel(get_x(args, kwargs)) * _as_int(n[0] if shape else n.shape[0])

        return flops

    return factory


_FLASH = aten._scaled_dot_product_flash_attention
_FLASH_BWD = aten._scaled_dot_product_flash_attention_backward

#: Added formulas, by aten op name (every overload; in-place variants are listed by name); ops of another
#: namespace by ``"<namespace>::<name>"``.
ADDED_FORMULAS: dict[str, _Factory] = {
    # attention: the registry's flash formulas on the same [batch, heads, seq, dim] shapes
    "_scaled_dot_product_flash_attention_for_cpu": _registry_of(_FLASH),
    "_scaled_dot_product_flash_attention_for_cpu_backward": _registry_of(_FLASH_BWD),
    "_scaled_dot_product_fused_attention_overrideable": _registry_of(_FLASH),
    "_scaled_dot_product_fused_attention_overrideable_backward": _registry_of(_FLASH_BWD),
    # matmul-like ops the registry misses
    "addmm_": _matmul("mat1", "mat2"),
    "_addmm_activation": _matmul("mat1", "mat2", activation=True),
    "_int_mm": _matmul("self", "mat2"),
    "baddbmm_": _matmul("batch1", "batch2"),
    "addbmm": _matmul("batch1", "batch2"),
    "addbmm_": _matmul("batch1", "batch2"),
    "mv": _matmul("self", "vec"),
    "addmv": _matmul("mat", "vec"),
    "addmv_": _matmul("mat", "vec"),
    "dot": _matmul("self", "tensor"),
    "vdot": _matmul("self", "other"),
    "addr": _matmul("vec1", "vec2", outer=True),
    "addr_": _matmul("vec1", "vec2", outer=True),
    # mixture of experts: grouped matmuls, FLOPs summed over the groups (Note: [grouped_mm under fake tensors])
    "_grouped_mm": _grouped_mm,
    "transformers::grouped_mm_fallback": _grouped_mm_fallback(backward=False),
    "transformers::grouped_mm_fallback_backward": _grouped_mm_fallback(backward=True),
    # pre-quantized layers' kernels (the dequantizations are elementwise: not counted)
    "fakeviz::gptq_gemm": _quantized_matmul("scales", -1),
    "fakeviz::awq_gemm": _quantized_matmul("scales", -1),
    "fakeviz::scaled_matmul": _quantized_matmul("weight", 0),
    # bitsandbytes' quantized matmuls (its quantize / dequantize ops are elementwise: not counted)
    "bitsandbytes::gemm_4bit": _bnb_matmul("A", "shapeB", shape=True),
    "bitsandbytes::gemv_4bit": _bnb_matmul("A", "shapeB", shape=True),
    "bitsandbytes::int8_scaled_mm": _bnb_matmul("A", "B"),
    "bitsandbytes::int8_mixed_scaled_mm": _bnb_matmul("A", "CB"),
    "bitsandbytes::int8_linear_matmul": _bnb_matmul("A", "B"),
    # softmax
    "_softmax": per_elem(5),
    "_log_softmax": per_elem(5),
    "_safe_softmax": per_elem(8),
    "_softmax_backward_data": per_elem(4),
    "_log_softmax_backward_data": per_elem(4),
    # normalization
    "native_layer_norm": _norm_forward(),
    "native_group_norm": _norm_forward(),
    "native_batch_norm": _norm_forward(training="training"),
    "_native_batch_norm_legit": _norm_forward(training="training"),
    "_native_batch_norm_legit_functional": _norm_forward(training="training"),
    "_native_batch_norm_legit_no_training": _norm_forward(training=False),
    "_batch_norm_with_update": _norm_forward(),
    "_batch_norm_with_update_functional": _norm_forward(),
    "_batch_norm_no_update": _norm_forward(training=False),
    "cudnn_batch_norm": _norm_forward(training="training"),
    "miopen_batch_norm": _norm_forward(training="training"),
    "_fused_rms_norm": _norm_forward(rms=True, bias=False),
    "native_layer_norm_backward": _norm_backward(),
    "native_group_norm_backward": _norm_backward(),
    "native_batch_norm_backward": _norm_backward(training="train"),
    "batch_norm_backward": _norm_backward(training="update"),
    "cudnn_batch_norm_backward": _norm_backward(mask=None),
    "miopen_batch_norm_backward": _norm_backward(mask=None),
    "_fused_rms_norm_backward": _norm_backward(rms=True),
    # losses
    "nll_loss_forward": per_elem(1, "target"),
    "nll_loss_backward": per_elem(1, "target"),
    "nll_loss2d_forward": per_elem(1, "target"),
    "nll_loss2d_backward": per_elem(1, "target"),
    "mse_loss": _mse_loss,
    "mse_loss_backward": per_elem(3, "self"),
    # accumulating scatters
    "embedding_dense_backward": per_elem(1, "grad_output"),
    "index_put": _if_arg("accumulate", "values"),
    "index_put_": _if_arg("accumulate", "values"),
    "_index_put_impl_": _if_arg("accumulate", "values"),
    "_unsafe_index_put": _if_arg("accumulate", "values"),
    "index_add": per_elem(1, "source"),
    "index_add_": per_elem(1, "source"),
    "scatter_add": per_elem(1, "index"),
    "scatter_add_": per_elem(1, "index"),
    "scatter_reduce": per_elem(1, "index"),
    "scatter_reduce_": per_elem(1, "index"),
    "histc": per_elem(1),  # one add per input element into its bin (MoE: tokens per expert)
    "scatter": _if_arg("reduce", "index", when=lambda r: r is not None),
    "scatter_": _if_arg("reduce", "index", when=lambda r: r is not None),
    # scans
    "cumsum": per_elem(1),
    "cumsum_": per_elem(1),
    "cumprod": per_elem(1),
    "cumprod_": per_elem(1),
    "logcumsumexp": per_elem(1),
    "cummax": per_elem(1),
    "cummin": per_elem(1),
    "_cummax_helper": per_elem(1),
    "_cummin_helper": per_elem(1),
    # pooling
    "avg_pool2d": _pool("out"),
    "avg_pool2d_backward": _pool("grad_output"),
    "max_pool2d_with_indices": _pool("out"),
    "max_pool2d_with_indices_backward": per_elem(1, "grad_output"),
    "_adaptive_avg_pool2d": per_elem(1, "self"),
    "_adaptive_avg_pool2d_backward": per_elem(1, "self"),
    # dropout and fused optimizers
    "native_dropout": _dropout,
    "_fused_adam_": _fused_adam,
    "_fused_adamw_": _fused_adam,
    "_fused_sgd_": _fused_sgd,
}
