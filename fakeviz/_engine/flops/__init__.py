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
  ``masked_fill.Tensor`` is not), or it is in ``_ELEMENTWISE`` of :mod:`.classify`
  (activations and their backward ops that torch leaves untagged). Selections that torch
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
  histc                                  1 per input element
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
* Grouped matmuls of mixture-of-experts layers (``_grouped_mm``; transformers'
  ``grouped_mm_fallback`` and its backward, whose count is twice the forward's):
  ``2 * m_g * k_g * n_g`` per group, summed, which is ``2 * M * K * N`` of the
  whole jagged operand whatever the split, as long as every row is routed
  (``offs[-1]`` is the jagged length: the routing assumption listed by
  ``fidelity()``, Note: [grouped_mm under fake tensors] in ``fakeviz._engine.moe``).
* The CPU flash SDPA op ``_scaled_dot_product_flash_attention_for_cpu`` (and
  ``_scaled_dot_product_fused_attention_overrideable``) and their backward ops
  take ``(query, key, value)`` / ``(grad_out, query, key, value)`` as
  ``[batch, heads, seq, dim]`` like the CUDA flash op, and get the registry's
  formula for ``_scaled_dot_product_flash_attention`` (and its backward) on the
  same shapes: the two matmuls (forward) or five (backward); softmax,
  masking, dropout and causality are not counted, as in the registry.
  torch 2.15 registers the CPU op itself with the same formula; there the
  registry's entry is used (an added formula never shadows the registry).
* Zero: views (a return that aliases an input without writing it,
  ``Tag.inplace_view``, ``Tag.view_copy``), ops without tensor arguments
  (factories: empty, zeros, arange, randn, scalar_tensor, ...; SymInt
  arithmetic), ops that return no tensor and mutate nothing (metadata and
  scalar reads: ``_local_scalar_dense``, ``_fused_sdp_choice``), the ``profiler``
  namespace, and the aten names in ``_ZERO_NAMES`` of :mod:`.classify` (copies and
  casts: clone,
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

Modules
-------
:mod:`.formulas`
    Where to add an op's FLOP formula: the formula builders (sizes, argument
    getters, registry wrapper, matmul/norm/optimizer/pooling formulas, ...) and
    ``ADDED_FORMULAS``, the table of our formulas by aten op name.
:mod:`.classify`
    Which kind each op gets (registry, added, zero, unknown) and the name lists
    that torch's tags get wrong (``_ELEMENTWISE``, ``_ZERO_NAMES``); ``op_flops``,
    ``flop_kind`` and ``resolve_op``, re-exported here.
"""

from __future__ import annotations

from .classify import FLOP_KINDS, flop_kind, op_flops, resolve_op

__all__ = ["FLOP_KINDS", "flop_kind", "op_flops", "resolve_op"]
