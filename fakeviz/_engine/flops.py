"""FLOPs of one aten op call, for every op a recorded run dispatches.

``op_flops(func, args, kwargs, out)`` gives the FLOPs of one op call as a
TorchDispatchMode sees it at the outermost dispatch (real or fake tensors),
and ``flop_kind(func)`` says where the number comes from; ``fakeviz._analysis.flops.coverage(names)``
lists, for the op names of a record, which ops have a formula and which do not.

Kinds
-----
``"registry"``
    The op's overload packet is in ``torch.utils.flop_counter.flop_registry``
    (mm, addmm, bmm, baddbmm, _scaled_mm, convolution and its backward, the
    CUDA/cuDNN SDPA and flash/efficient attention ops, ...). The formula is
    called exactly as ``FlopCounterMode`` calls it (``formula(*args, **kwargs,
    out_val=out)``; torch's ``shape_wrapper`` turns tensors into shapes), so the
    number is the one ``FlopCounterMode`` adds for that call.
``"added"``
    A formula of ours for an op the registry does not count (it would count 0).
``"zero"``
    An op that does no arithmetic: views, metadata and scalar queries,
    factories, copies and casts, gathers, fills, random sampling.
``"unknown"``
    No formula: ``op_flops`` returns ``-1`` (never 0), and ``coverage`` lists
    the op, so a report can say which ops its total leaves out.

Conventions
-----------
* One FLOP is one floating-point operation; a multiply-add counts 2, as in
  torch's registry (``mm``: ``2*m*n*k``; the ``beta*self`` add of
  ``addmm``-like ops is not counted, as in the registry). Integer and boolean
  arithmetic is counted like floating point.
* Pointwise ops count 1 FLOP per element of their (first) output, whatever
  the function (``add`` and ``gelu`` alike; in-place ops: the elements of
  ``self``). An op is pointwise when it or another overload of the same op
  (in-place or functional variant included) carries ``torch.Tag.pointwise``
  (torch tags overloads unevenly: ``masked_fill.Scalar`` is tagged,
  ``masked_fill.Tensor`` is not), or it is in ``_ELEMENTWISE`` (activations
  and their backward ops that torch leaves untagged). Selections that torch
  tags pointwise (``where``, ``masked_fill``, comparisons) count 1 too.
* Reductions (``torch.Tag.reduction``: sum, mean, amax, var, std, norm,
  argmax, any, ...) and scans (cumsum, cumprod, ...) count 1 FLOP per element
  read (the elements of the first input), whatever the reduction.
* Fused ops count what their unfused reference computation counts under the
  two rules above (per element ``n`` of the input; terms proportional to the
  number of rows/channels, such as ``rsqrt`` of the variance, are ignored):

  =====================================  =====================================
  softmax, log_softmax                   5n (max, sub, exp, sum, div/sub)
  softmax / log_softmax backward         4n
  _safe_softmax                          8n (softmax + eq, all, where)
  layer / group / batch norm (training)  5n + n per weight + n per bias
  batch norm (eval statistics)           2n + n per weight + n per bias
  rms norm                               3n + n per weight
  norm backward, grad_input              2n (x-hat) + 7n (+n with weight);
                                         eval batch norm: n (+n with weight);
                                         rms: 1n (x-hat) + 5n (+n)
  norm backward, grad_weight / grad_bias 2n (+x-hat if not yet counted) / n
  AdamW / Adam (fused), per element      7 (+1 weight decay, +1 amsgrad,
                                         +1 maximize, +1 grad_scale)
  SGD (fused), per element               1 (+1 weight decay, +1 maximize,
                                         +2 momentum after the first step,
                                         +1 nesterov, +1 grad_scale)
  nll_loss forward / backward            1 per target element
  mse_loss / backward                    3n (2n with reduction='none') / 3n
  embedding_dense_backward               1 per grad_output element (adds)
  index_put(accumulate=True)             1 per values element, else 0
  index_add, scatter_add, scatter_reduce 1 per source/index element
  avg_pool2d (+backward)                 1 per output element and window cell
  max_pool2d_with_indices / backward     same / 1 per grad_output element
  adaptive_avg_pool2d (+backward)        1 per input element
  _foreach_<op>                          the per-tensor rule, summed over the
                                         list (``_foreach_add_``: pointwise,
                                         ``_foreach_norm``: reduction)
  =====================================  =====================================

* Matmul-like ops the registry misses (``addmm_``, ``baddbmm_``, ``addbmm``,
  ``mv``, ``addmv``, ``dot``, ``vdot``, ``addr``, ``_int_mm``,
  ``_addmm_activation``): ``2 * m * n * k`` like ``mm`` (``addr``: ``k=1``;
  ``_addmm_activation`` adds 1 per output element for the activation).
* The CPU flash SDPA op ``_scaled_dot_product_flash_attention_for_cpu`` (and
  ``_scaled_dot_product_fused_attention_overrideable``) and their backward ops
  take ``(query, key, value)`` / ``(grad_out, query, key, value)`` as
  ``[batch, heads, seq, dim]`` like the CUDA flash op, and get the registry's
  formula for ``_scaled_dot_product_flash_attention`` (and its backward) on the
  same shapes: the two matmuls (forward) or five (backward); softmax,
  masking, dropout and causality are not counted, as in the registry.
* Zero: views (a return that aliases an input without writing it,
  ``Tag.inplace_view``, ``Tag.view_copy``), ops without tensor arguments
  (factories: empty, zeros, arange, randn, scalar_tensor, ...; SymInt
  arithmetic), ops that return no tensor and mutate nothing (metadata and
  scalar reads: ``_local_scalar_dense``, ``_fused_sdp_choice``), the ``profiler``
  namespace, and the aten names in ``_ZERO_NAMES`` (copies and casts: clone,
  ``_to_copy``, ``copy_``, cat, pad, tril/triu; gathers: index, gather,
  embedding, index_select; the backward of views: slice/select/diagonal
  backward; fills and ``*_like``/``new_*`` factories; in-place random
  sampling: ``normal_``, ``uniform_``, ``bernoulli_``; storage bookkeeping).
  Data movement and random-number generation are not FLOPs here.
* Everything else is unknown (``-1``): sort, topk, upsampling, other losses,
  custom ops, ops whose name does not resolve.

Symbolic sizes: sizes are read as Python ints. A ``SymInt`` size counts with
its hint when it has one (a backed symbol: the concrete size it was made from,
the size of this very run); an unbacked symbol (a data-dependent size such as
the length of a ``nonzero`` result) has no hint to trust, and the op gets
``-1``. Registry formulas get the symbolic shapes as ``FlopCounterMode`` would
and their symbolic result is resolved the same way.

Speed: each ``OpOverload`` is classified once (tags, schema, tables) and its
formula cached; a call is one dict lookup and, for zero/unknown ops, a call
returning a constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils import flop_counter as _fc

__all__ = ["FLOP_KINDS", "flop_kind", "op_flops", "resolve_op"]

REGISTRY, ADDED, ZERO, UNKNOWN = "registry", "added", "zero", "unknown"
#: The kinds ``flop_kind`` returns, in the order ``coverage`` sorts them (unknown first).
FLOP_KINDS: tuple[str, ...] = (UNKNOWN, ADDED, REGISTRY, ZERO)

aten = torch.ops.aten
_Tensor = torch.Tensor

#: ``formula(args, kwargs, out) -> flops``; kwargs may be ``None``.
Formula = Callable[[tuple[Any, ...], dict[str, Any] | None, Any], int]
#: Builds the formula of one overload (it may read the overload's schema).
_Factory = Callable[[OpOverload], Formula]
#: Reads one argument of a call: ``getter(args, kwargs) -> value``.
_Getter = Callable[[tuple[Any, ...], dict[str, Any] | None], Any]


class _NoHint(Exception):
    """A size is an unbacked SymInt: no trustworthy concrete value."""


# ----------------------------------------------------------------------------- sizes
def _as_int(x: Any) -> int:
    """A size or count as an int: SymInts by their hint; raises ``_NoHint`` without one."""
    if type(x) is int:
        return x
    if isinstance(x, torch.SymInt):
        node = x.node
        if node.has_hint():
            hint = node.hint
            if type(hint) is int:
                return hint
        raise _NoHint
    return int(x)


def _numel(t: _Tensor) -> int:
    n = t.numel()
    return n if type(n) is int else _as_int(n)


def _first_tensor(x: Any) -> _Tensor | None:
    """``x`` if it is a tensor, else the first tensor in a (nested) tuple or list."""
    if isinstance(x, _Tensor):
        return x
    if isinstance(x, (tuple, list)):
        for item in x:
            t = _first_tensor(item)
            if t is not None:
                return t
    return None


# ------------------------------------------------------------------- constant formulas
def _zero(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    return 0


def _unknown(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
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


def _registry_formula(formula: Callable[..., Any]) -> Formula:
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


def _registry_of(packet: Any) -> _Factory:
    """An added op that takes the registry formula of another op (same argument order)."""

    def factory(func: OpOverload) -> Formula:
        return _registry_formula(_fc.flop_registry[packet])

    return factory


# ---------------------------------------------------------------- generic formulas
def _pointwise(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    """1 FLOP per element of the first output (of the first tensor argument without one)."""
    if isinstance(out, _Tensor):
        n = out.numel()
        return n if type(n) is int else _as_int(n)
    t = _first_tensor(out)
    if t is None:
        t = _first_tensor(args)
    if t is None:
        return -1
    return _numel(t)


def _per_elem(per: int, arg: str | None = None) -> _Factory:
    """``per`` FLOPs per element of argument ``arg`` (the first argument by default)."""

    def factory(func: OpOverload) -> Formula:
        get = _getter(func, arg) if arg else _first_arg(func)

        def flops(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
            return per * _numel(get(args, kwargs))

        return flops

    return factory


def _foreach_sum(func: OpOverload) -> Formula:
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
                total += _pointwise(args, kwargs, out)
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
        return 0 if get_train(args, kwargs) is False else _pointwise(args, kwargs, out)

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
            n = _pointwise(args, kwargs, out) if get_count is None else _numel(get_count(args, kwargs))
            return n * _window_cells(get_k(args, kwargs))

        return flops

    return factory


_FLASH = aten._scaled_dot_product_flash_attention
_FLASH_BWD = aten._scaled_dot_product_flash_attention_backward

#: Added formulas, by aten op name (every overload; in-place variants are listed by name).
_ADDED: dict[str, _Factory] = {
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
    # softmax
    "_softmax": _per_elem(5),
    "_log_softmax": _per_elem(5),
    "_safe_softmax": _per_elem(8),
    "_softmax_backward_data": _per_elem(4),
    "_log_softmax_backward_data": _per_elem(4),
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
    "nll_loss_forward": _per_elem(1, "target"),
    "nll_loss_backward": _per_elem(1, "target"),
    "nll_loss2d_forward": _per_elem(1, "target"),
    "nll_loss2d_backward": _per_elem(1, "target"),
    "mse_loss": _mse_loss,
    "mse_loss_backward": _per_elem(3, "self"),
    # accumulating scatters
    "embedding_dense_backward": _per_elem(1, "grad_output"),
    "index_put": _if_arg("accumulate", "values"),
    "index_put_": _if_arg("accumulate", "values"),
    "_index_put_impl_": _if_arg("accumulate", "values"),
    "_unsafe_index_put": _if_arg("accumulate", "values"),
    "index_add": _per_elem(1, "source"),
    "index_add_": _per_elem(1, "source"),
    "scatter_add": _per_elem(1, "index"),
    "scatter_add_": _per_elem(1, "index"),
    "scatter_reduce": _per_elem(1, "index"),
    "scatter_reduce_": _per_elem(1, "index"),
    "scatter": _if_arg("reduce", "index", when=lambda r: r is not None),
    "scatter_": _if_arg("reduce", "index", when=lambda r: r is not None),
    # scans
    "cumsum": _per_elem(1),
    "cumsum_": _per_elem(1),
    "cumprod": _per_elem(1),
    "cumprod_": _per_elem(1),
    "logcumsumexp": _per_elem(1),
    "cummax": _per_elem(1),
    "cummin": _per_elem(1),
    "_cummax_helper": _per_elem(1),
    "_cummin_helper": _per_elem(1),
    # pooling
    "avg_pool2d": _pool("out"),
    "avg_pool2d_backward": _pool("grad_output"),
    "max_pool2d_with_indices": _pool("out"),
    "max_pool2d_with_indices_backward": _per_elem(1, "grad_output"),
    "_adaptive_avg_pool2d": _per_elem(1, "self"),
    "_adaptive_avg_pool2d_backward": _per_elem(1, "self"),
    # dropout and fused optimizers
    "native_dropout": _dropout,
    "_fused_adam_": _fused_adam,
    "_fused_adamw_": _fused_adam,
    "_fused_sgd_": _fused_sgd,
}

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
        return ZERO, _zero
    if (
        target in _ELEMENTWISE
        or _packet_tagged("aten", target, torch.Tag.pointwise)
        or _packet_tagged("aten", target, torch.Tag.reduction)
    ):
        return ADDED, _foreach_sum(func)
    return UNKNOWN, _unknown


def _classify_uncached(func: Any) -> tuple[str, Formula]:
    packet = getattr(func, "_overloadpacket", func)
    registry_formula = _fc.flop_registry.get(packet)
    if registry_formula is not None:
        return REGISTRY, _registry_formula(registry_formula)
    if not isinstance(func, OpOverload):
        return UNKNOWN, _unknown
    namespace = func.namespace
    name = func._schema.name.split("::", 1)[-1]
    if namespace in _ZERO_NAMESPACES:
        return ZERO, _zero
    if namespace == "aten":
        factory = _ADDED.get(name)
        if factory is not None:
            return ADDED, factory(func)
        if name.startswith("_foreach_"):
            return _classify_foreach(func, name)
        if name in _ZERO_NAMES:
            return ZERO, _zero
    schema = func._schema
    if not any(_is_tensor_type(a.type) for a in schema.arguments):
        return ZERO, _zero  # factories, SymInt/scalar arithmetic
    if _is_view(func):
        return ZERO, _zero
    if (namespace == "aten" and name in _ELEMENTWISE) or _packet_tagged(namespace, name, torch.Tag.pointwise):
        return ADDED, _pointwise
    if _packet_tagged(namespace, name, torch.Tag.reduction):
        return ADDED, _per_elem(1)(func)
    returns_tensor = any(_is_tensor_type(r.type) for r in schema.returns)
    mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if not returns_tensor and not mutates:
        return ZERO, _zero  # metadata and scalar reads
    return UNKNOWN, _unknown


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
    except (_NoHint, GuardOnDataDependentSymNode):
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
