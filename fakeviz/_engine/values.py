"""Values under fake tensors: what a fake run knows of tensor *values*, and what it assumes where it knows nothing.

Note: [values under fake tensors]
Fake tensors carry no data, yet real code reads values back to decide what to do next: ``.item()`` of a
bound in ``nn.init.trunc_normal_``, ``nonzero`` of a label mask, ``labels.max()`` checks, ``bool(t)`` in
``generate()``'s stopping test. A fake run must do what the real run does there. Three sources of truth, in
this order:

1. **Known values** (exact). A small tensor (at most ``VALUE_LIMIT`` elements) carries its real values on
   CPU in ``FakeTensor.constant``, torch's own slot for them, when they are knowable from what the run has:
   tensors made from Python numbers (``torch.tensor``, ``arange``, ``full``, ``ones``, ``zeros_like``, ...),
   real tensors handed to the fake run, random draws from a CPU generator the run is in step with (below),
   in-place overwrites of a tensor nothing else aliases (``fill_``, ``zero_``, ``copy_``, ``normal_`` of a
   fresh parameter), and every op whose tensor inputs all carry values. torch's own constant propagation
   stops at one element and at the device (a constant of a fake cuda tensor would come out on cpu), so
   ``_FakeRecordingMode._dispatch_impl`` hands every op that touches a value to :func:`dispatch`, which
   (a) runs the op's ordinary fake rule with the inputs' values hidden, so the output's metadata (and so
   the record) is exactly what it is without values, then (b) runs the real kernel on the CPU values and
   attaches the result. Aliasing is kept: a view's value is a view of its base's value, an in-place op
   writes its input's value in place, and anything that writes a value with unknown data (or makes an
   alias that cannot carry one) drops the value of every tensor on that storage
   (``invalidate_constant_aliases``). A FakeTensor with a constant is never served from FakeTensorMode's
   dispatch cache (torch bypasses it), so no op on a value is missed; tensors without values never reach
   this module except on a cache miss, where the test costs a dictionary lookup and a scan of the
   arguments: the recorder's hot path for large tensors is unchanged. The cost is on the ops with values
   (a full fake dispatch and the real kernel, about 0.5 ms each): a value that meets a large tensor without
   one (a norm's weight times the activations, in every layer) is dropped there, since it can give no
   value to that op and would make each of its later uses slow. Tensor constructors are cached by
   their arguments alone, so the entries a fake mode made before this one are dropped when a recording
   mode starts (:func:`forget_cached_constructors`); a constructor whose output carries a value is then
   cached as "bypass", as torch does for any constant output.

2. **Random draws in step with the real run** (exact). A random op on a fake *cpu* tensor (``normal_``,
   ``rand``, ``randint``, ``native_dropout``, ``bernoulli_``...) is run for real on a CPU tensor of the same
   shape, strides and dtype with the generator the real run would use (the default CPU generator or the
   one passed in), so the generator advances exactly as in the real run and a later small draw
   (``torch.rand([])`` of LayerDrop, ``torch.randint`` of input ids) gets the real run's values. A draw
   larger than ``DRAW_LIMIT`` elements is not run: from then on that generator's values are unknown
   until its state changes (``manual_seed``, ``set_rng_state``), when it is in step again. A fake run so
   advances the user's generators as the real run does, for the draws it runs. Draws on a fake cuda device
   use the GPU's generator in a real run: never simulated, never known. FakeTensorMode caches in-place random
   ops by their metadata like any in-place op; a recording mode never caches a random op
   (``never_cached``), so every draw reaches :func:`Values.dispatch`. A draw that cannot be run (an
   exception) loses its generator the same way. Known limitation: re-seeding to the very state the
   generator was lost in (``manual_seed(s)`` twice, a skipped draw between) is not noticed: values stay
   unknown there, never wrong.

3. **Bounds** (exact). Without values, a read may still be decided by what the draws can be: a normal draw
   lies within ``NORMAL_BOUND`` standard deviations of its mean whatever the generator (every kernel torch
   has draws it by Box-Muller from a uniform of at most 64 bits: ``sqrt(-2 ln 2**-64) < 9.5``), a uniform
   draw within its bounds. ``value_reads.bounds`` follows the read tensor back through the recorded ops
   (the record is the provenance: no cost before a read) over comparisons with numbers, logical ops,
   ``any``/``all``, ``where``, copies and views, so ``((w < -2) | (w > 2)).any()`` on ``w.normal_(0, 0.02)``
   is ``False`` for a weight of any size, as in every real run.

4. **Routing** (``record(routing=...)``): a MoE router's ``topk`` of unknown scores gets assumed indices
   (Note: [routing under fake tensors] in :mod:`fakeviz._engine.routing`).

Note: [tensor subclasses under the values layer]
A tensor subclass that wraps fake tensors (torchao's ``Int8Tensor``, ``Float8Tensor``, ``Int4TilePackedTo4dTensor``,
its optimizer states ``OptimState8bit`` / ``OptimState4bit``; a DTensor) is not a FakeTensor and has no ``constant``:
it is neither a real tensor to lift nor a value. An op with one among its arguments goes to FakeTensorMode's own
rule, which answers ``NotImplemented``; the subclass's ``__torch_dispatch__`` then runs the op on its inner tensors
(int8 data and scales, fp8 data and scales, packed int4 and scales/zeros), which reach this layer as ordinary fake
tensors with or without values. The recorder's real-run mode answers ``NotImplemented`` for them too
(``recorder/modes.py``), so a real CPU run records the same inner ops as the fake one (the outer call is not an op:
Note: [wrapper calls are not ops]), and a wrapper's memory is its inner tensors' storages (Note: [wrapper tensors
hold no memory]).

Otherwise the value is unknown. A read the library code makes for a known reason is answered by a
**documented assumption** (``value_reads.ASSUMPTIONS``: no early stop in ``generate()``, no padding in its
inputs, labels in range, no re-draw in ``trunc_normal_``). An op whose output *size* depends on unknown
values (``nonzero``, ``masked_select``, reading with a boolean mask) assumes every element is selected:
the largest output, so memory is never under-estimated; ``_ctc_loss`` assumes equal target lengths.
Writing with a boolean mask (``x[mask] = v``) outputs ``x`` whatever the mask: no assumption, but the
check that ``v`` fits the selection is not made. Each assumption is a row ``[seq, op, assumption, module,
user line]`` of the trace's ``meta["assumptions"]``, shown by ``fidelity()["assumptions"]``. Any other read
of an unknown value raises (the recorder names op, module and line; :func:`advice` says what to do). Reads
of unknown values are handled in :mod:`fakeviz._engine.value_reads`.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._mode_utils import no_dispatch

from . import device_fallback as _device_fallback
from . import routing as _routing
from . import sparse as _sparse
from . import value_args as _args
from . import value_reads as _reads
from .ctc import ctc_loss_outputs
from .quant.bnb import outlier_outputs
from .routing import ROUTING_LIMIT, ROUTINGS, routing_indices
from .value_reads import NORMAL_BOUND, guard_error, known_value

__all__ = [
    "DRAW_LIMIT", "FAST_KEY", "NORMAL_BOUND", "ROUTINGS", "ROUTING_LIMIT", "VALUE_LIMIT", "Values", "advice",
    "forget_cached_constructors", "guard_error", "known_value", "never_cached", "routing_indices",
]  # fmt: skip

#: A tensor with at most this many elements keeps its values when they are knowable (0: values off).
VALUE_LIMIT = 1 << 16
#: A random draw of at most this many elements is run for real to keep its generator in step.
DRAW_LIMIT = 1 << 22

aten = torch.ops.aten
_Tensor = torch.Tensor
_DD_ERRORS = (DataDependentOutputException, DynamicOutputShapeException)
_READS = frozenset((aten._local_scalar_dense.default,))
_LIFTS = frozenset((aten.lift_fresh.default, aten.lift_fresh_copy.default))
_LIKE = frozenset(
    (aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.new_zeros.default,
     aten.new_ones.default, aten.new_full.default)
)  # fmt: skip
_OVERWRITE = frozenset((aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.copy_.default))
_INDEX = frozenset(
    (aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default,
     aten._unsafe_index.Tensor, aten._unsafe_index_put.default)
)  # fmt: skip
K_OTHER, K_FACTORY, K_RANDOM, K_READ, K_OVERWRITE, K_INDEX, K_ROUTE = range(7)
_KINDS: dict[Any, int] = {}


def _kind(func: Any) -> int:
    k = _KINDS.get(func)
    if k is None:
        from torch._subclasses.fake_impls import _is_tensor_constructor

        if func is aten.topk.default:
            k = K_ROUTE
        elif func in _READS:
            k = K_READ
        elif torch.Tag.nondeterministic_seeded in func.tags:
            k = K_RANDOM
        elif func in _LIKE or (_is_tensor_constructor(func) and "empty" not in func.name()):
            k = K_FACTORY
        elif func in _OVERWRITE:
            k = K_OVERWRITE
        elif func in _INDEX:
            k = K_INDEX
        else:
            k = K_OTHER
        _KINDS[func] = k
    return k


@functools.cache
def _returns_self(func: Any) -> bool:
    """Whether ``func`` returns its first argument, written in place (``normal_``: ``Tensor(a!)``)."""
    schema = func._schema
    return (
        len(schema.returns) == 1
        and schema.returns[0].alias_info is not None
        and schema.returns[0].alias_info.is_write
        and bool(schema.arguments)
        and schema.arguments[0].alias_info is not None
        and schema.arguments[0].alias_info.is_write
    )


def never_cached(func: Any) -> bool:
    """Whether ``func`` must not get a dispatch-cache entry in a recording mode: a random op must reach
    :meth:`Values.dispatch` every time, or its draw would not be run (FakeTensorMode caches in-place
    random ops by their metadata, as any in-place op); so must ``topk``, a router's choice (4. in the Note)."""
    return isinstance(func, torch._ops.OpOverload) and _kind(func) in (K_RANDOM, K_ROUTE)


# The first element of the recorder's own dispatch-cache keys (Note: [fast dispatch-cache key] in
# recorder/fastpath.py, which takes it from here: the values layer must tell those keys from torch's)
FAST_KEY = ("fakeviz-fast-key", 1)


def forget_cached_constructors() -> None:
    """Drop FakeTensorMode's cache entries of tensor constructors, random ops and ``fill_``/``zero_``/``copy_``
    (Note: [values under fake tensors]): a recording mode must see the ops that give their outputs values."""
    cache = FakeTensorMode.cache
    op = torch._ops.OpOverload
    kinds = (K_FACTORY, K_OVERWRITE, K_RANDOM)
    drop = []
    for k in cache:
        # torch's key starts with the op, a fast key (Note: [fast dispatch-cache key]) with _FAST, then the op:
        # an entry of either kind, made by an earlier mode, would give this one's constructors no value
        func = k.key[1] if k.key[0] is FAST_KEY and len(k.key) > 1 else k.key[0]
        if isinstance(func, op) and _kind(func) in kinds:
            drop.append(k)
    for key in drop:
        cache.pop(key, None)


# -------------------------------------------------------------------------------------------- Values
class Values:
    """What one fake mode knows of tensor values: see Note: [values under fake tensors].

    ``impl`` is FakeTensorMode's own ``_dispatch_impl`` (unbound), run for every op, and ``cached`` its
    ``_cached_dispatch_impl`` (``impl`` where the mode uses no dispatch cache), both called as
    ``(mode, func, types, args, kwargs)`` (Note: [private torch signatures]); ``recorder`` (set by the
    recording that uses the mode, None otherwise) is told each assumption (``note_assumption(func, text)``)
    and is the provenance :func:`bounds` reads (its ``b``, ``tid_base``, ``tid_limit``).
    """

    def __init__(self, mode: Any, impl: Callable[..., Any], cached: Callable[..., Any] | None = None) -> None:
        self.mode = mode
        self.impl = impl
        # with the values hidden, an op's fake rule can come from FakeTensorMode's dispatch cache (its metadata
        # is the key): about 20 us instead of a full dispatch
        self.cached = impl if cached is None else cached
        self.recorder: Any = None
        self.local = threading.local()
        self.seen: set[tuple[Any, ...]] = set()  # in-place random ops the fake rule ran for (_inplace_seen)
        self.lost: dict[int, tuple[Any, Any]] = {}  # id(generator) -> (generator, its state when a draw was skipped)
        self.routing: str | None = "balanced"  # 4. in the Note: what a router's unknown topk is assumed to pick
        self.any_routed = False  # whether a tensor got values from assumed routing (marked ``_fv_routed``)

    # -------------------------------------------------------------------------------- dispatch
    def dispatch(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """The mode's ``_dispatch_impl`` with values (Note: [values under fake tensors]), sparse results (Note:
        [sparse results under fake tensors]) and ops without a fake rule on a fake accelerator (Note: [fallback
        kernels on fake devices])."""
        try:
            out = self._dispatch(func, types, args, kwargs)
        except (NotImplementedError, RuntimeError, AssertionError):  # what torch raises without a GPU
            out = _device_fallback.retry(self, func, types, args, kwargs)  # sparse: stand-ins
            if out is _device_fallback.NOT_RETRIED:
                # re-raised here, not in retry: a frame that holds the exception it raises is a reference cycle
                # (exception -> traceback -> frame -> exception), which kept every frame up the stack, and the
                # user's tensors in them, alive until the garbage collector ran, where the real run freed them
                raise
            return out
        _device_fallback.check_kernel(func, args, kwargs)  # a meta kernel where a real GPU has none
        if type(out) is FakeTensor and out.layout is not torch.strided:  # (no sparse input: out as it is)
            return _sparse.stand_in(self, func, args, kwargs, out)
        return out

    def _dispatch(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        kind = _KINDS.get(func)
        if kind is None:
            kind = _kind(func)
        loc = self.local.__dict__
        if func in _LIFTS:  # torch.tensor(data): FakeTensorMode keeps the value (the mode's may_turn_const)
            out = self.impl(self.mode, func, types, args, kwargs)
            src = args[0] if args else None
            if (
                isinstance(out, FakeTensor)
                and isinstance(src, _Tensor)
                and not isinstance(src, FakeTensor)
                and (out.constant is None or out.constant.device.type != "cpu")
                and src.layout == torch.strided
                # torch >= 2.15 makes the data on a meta device context's device: no values
                and src.device.type != "meta"
                and src.numel() <= VALUE_LIMIT
            ):
                # a CUDA build copies torch.tensor(data, device="cuda") to the GPU before lifting it: torch then
                # keeps no constant, or a real cuda one; the lifted tensor's values are known all the same, and
                # every value here lives on the CPU (a real GPU is there to read it)
                with no_dispatch():
                    out.constant = None
                    self._attach(out, src.detach().cpu().clone())
            return out
        if loc.get("inner"):
            # an op of the decomposition of an op handled here (uniform_ -> prims.uniform): its values come
            # from the outer op's real kernel, and a random one must not draw a second time
            return self.impl(self.mode, func, types, args, kwargs)
        if func in _sparse.FROM_DENSE:  # Note: [sparse conversions under fake tensors]
            out = _sparse.from_dense(self, func, args, kwargs)
            if out is not None:
                return out
        if kind == K_OTHER or kind == K_OVERWRITE or kind == K_INDEX:
            for a in args:
                if isinstance(a, _Tensor):
                    if type(a) is not FakeTensor or a.constant is not None:
                        break
                elif type(a) is list and a and isinstance(a[0], (_Tensor, type(None))):
                    if any(isinstance(x, _Tensor) and (type(x) is not FakeTensor or x.constant is not None) for x in a):
                        break
            else:
                if not kwargs or not any(
                    isinstance(v, _Tensor) and (type(v) is not FakeTensor or v.constant is not None)
                    for v in kwargs.values()
                ):
                    if kind == K_OTHER:
                        try:
                            return self.impl(self.mode, func, types, args, kwargs)
                        except _DD_ERRORS:
                            out = self.dynamic(func, args, kwargs)
                            if out is None:
                                raise
                            return out
                    if kind == K_OVERWRITE:
                        return self._overwrite(func, types, args, kwargs)
                    return self._index(func, types, args, kwargs)
        if _args.has_subclass(args, kwargs):
            # Note: [tensor subclasses under the values layer]: FakeTensorMode answers NotImplemented, and the
            # subclass's own dispatch runs the op on its inner tensors, whose values this layer keeps
            return self.impl(self.mode, func, types, args, kwargs)
        if VALUE_LIMIT <= 0 and kind != K_RANDOM:
            return self.impl(self.mode, func, types, args, kwargs)
        args, kwargs = self._lift_real(args, kwargs)
        if kind == K_READ:
            return self._read(func, types, args, kwargs)
        if kind == K_RANDOM:
            return self._random(func, types, args, kwargs)
        if kind == K_FACTORY:
            return self._factory(func, types, args, kwargs)
        if kind == K_OVERWRITE:
            return self._overwrite(func, types, args, kwargs)
        if kind == K_INDEX:
            return self._index(func, types, args, kwargs)
        if kind == K_ROUTE:
            return self._topk(func, types, args, kwargs)
        return self._general(func, types, args, kwargs)

    def _lift_real(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """Real CPU tensors handed to the fake run become fake tensors that keep their values."""

        def lift(x: Any) -> Any:
            if isinstance(x, _Tensor) and not isinstance(x, FakeTensor):
                if x.device.type != "cpu" or x.layout != torch.strided or x.numel() > VALUE_LIMIT:
                    return x
                fake = self.mode.from_real_recorded(x)  # Note: [converted tensors]
                if fake.constant is None:
                    with no_dispatch():  # a copy: an in-place op of the fake run must not write the user's tensor
                        self._attach(fake, x.detach().clone())
                return fake
            if type(x) is list:
                return [lift(y) for y in x]
            return x

        return tuple(lift(a) for a in args), {k: lift(v) for k, v in (kwargs or {}).items()}

    def _hidden(self, tensors: list[Any], fn: Callable[[], Any]) -> Any:
        """``fn()`` with the values of ``tensors`` hidden: FakeTensorMode's ordinary rule, output metadata
        as without values; the ops it dispatches are not handled here (``inner``)."""
        saved = [(t, t.constant) for t in tensors if isinstance(t, FakeTensor) and t.constant is not None]
        for t, _ in saved:
            t.constant = None
        loc = self.local.__dict__
        outer = loc.get("inner", False)
        outer_hidden = loc.get("hidden")
        loc["inner"] = True
        loc["hidden"] = saved
        try:
            return fn()
        finally:
            loc["inner"] = outer
            loc["hidden"] = outer_hidden
            for t, c in saved:
                t.constant = c

    def _attach(self, fake: Any, real: Any) -> None:
        if fake.layout != torch.strided or real.layout != torch.strided:
            return  # a sparse value has no storage to map: unknown (Note: [sparse conversions under fake tensors])
        fake.constant = real
        self.mode.fake_tensor_converter.add_constant_storage_mapping(fake)

    def give(self, fake: Any, value: Any) -> None:
        """Give ``fake`` (a new tensor, e.g. a deep copy) a copy of ``value`` when it fits."""
        if fake.constant is None and tuple(fake.shape) == tuple(value.shape) and fake.dtype == value.dtype:
            with no_dispatch():
                self._attach(fake, value.clone())

    def _drop(self, t: Any) -> None:
        """Forget the values of every tensor on ``t``'s storage."""
        c = t.constant if isinstance(t, FakeTensor) else None
        if c is not None:
            self.mode.fake_tensor_converter.invalidate_constant_aliases(c)
            t.constant = None

    def written(self, func: Any, args: Any, kwargs: Any) -> list[Any]:
        """The tensor arguments ``func`` writes (in-place and out= arguments)."""
        out = []
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) and not a.kwarg_only else (kwargs or {}).get(a.name)
                out.extend(_args.flat(v, []))
        return out

    def _settle(self, func: Any, args: Any, kwargs: Any, out: Any, real: Any, known: bool) -> None:
        """Give ``out`` the values in ``real`` (the op run on the inputs' values, or ``_args.FAILED``), keeping aliases
        consistent: Note: [values under fake tensors]."""
        ins = [t for t in _args.arg_tensors(args, kwargs) if isinstance(t, FakeTensor)]
        valued = {}
        for t in ins:
            if t.constant is not None:
                k = _args.storage_key(t)
                if k is not None:
                    valued[k] = t
        if not known or real is _args.FAILED:
            for t in self.written(func, args, kwargs):
                self._drop(t)
        routed = self.any_routed and any(getattr(t, "_fv_routed", False) for t in valued.values())
        outs = _args.flat(out, [])
        reals = _args.flat(real, []) if real is not _args.FAILED else [None] * len(outs)
        if len(reals) != len(outs):
            reals = [None] * len(outs)
        in_ids = {id(t) for t in ins}
        for o, r in zip(outs, reals):
            if not isinstance(o, FakeTensor) or id(o) in in_ids:
                continue  # an in-place op's output is its input: written in place above
            if o._has_symbolic_sizes_strides:
                base = valued.get(_args.storage_key(o))
                if base is not None:
                    self._drop(base)
                continue
            k = _args.storage_key(o)
            base = valued.get(k)
            ok = isinstance(r, _Tensor) and r.shape == o.shape and r.dtype == o.dtype
            if base is not None:  # a view of a valued tensor: its value must be a view of the base's value
                if ok and _args.storage_key(r) == _args.storage_key(base.constant):
                    self._attach(o, r)
                    if routed:
                        o._fv_routed = True
                else:
                    self._drop(base)
            elif ok and r.numel() <= (ROUTING_LIMIT if routed else VALUE_LIMIT):
                if any(_args.storage_key(r) == _args.storage_key(t.constant) for t in valued.values()):
                    r = r.clone()
                self._attach(o, r)
                if routed:
                    o._fv_routed = True

    # -------------------------------------------------------------------------------- op kinds
    def _general(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        ins = [t for t in _args.arg_tensors(args, kwargs)]
        known = all(isinstance(t, FakeTensor) and t.constant is not None for t in ins) and not _args.has_sym(
            args, kwargs
        )
        if known and (torch.Tag.dynamic_output_shape in func.tags or torch.Tag.data_dependent_output in func.tags):
            return self._from_real(func, args, kwargs)  # the real size, also where a ShapeEnv would make a symbol
        try:
            out = self._hidden(ins, lambda: self.cached(self.mode, func, types, args, kwargs))
        except _DD_ERRORS:
            if known:
                return self._from_real(func, args, kwargs)
            out = self.dynamic(func, args, kwargs)
            if out is None:
                raise
            return out
        except Exception:
            # no fake rule for these arguments, where torch's own constant propagation has one (set_ of a
            # storage in Tensor.__deepcopy__): let FakeTensorMode run it on the values, on cpu
            if not known or any(t.fake_device.type != "cpu" for t in ins):
                raise
            return self._hidden([], lambda: self.impl(self.mode, func, types, args, kwargs))
        real: Any = _args.FAILED
        if known:
            if func.namespace in _reads.COLLECTIVES:  # the fake process group moves no data: said, not silent
                self.assume(func, _reads.COLLECTIVE_VALUES)
            try:
                real = _args.real_call(func, args, kwargs)
            except Exception:  # noqa: BLE001 - no value, not a failed op: the fake rule already ran
                real = _args.FAILED
        self._settle(func, args, kwargs, out, real, known)
        if not known and any(
            isinstance(t, _Tensor) and getattr(t, "constant", None) is None and t.numel() > VALUE_LIMIT for t in ins
        ):
            # a value used with a large tensor that has none (a norm's weight times the activations): this op
            # gives no value, and keeping it would take every later op on it past the dispatch cache, once per
            # layer: drop it (Note: [values under fake tensors], the cost). Assumed routing is kept: expert
            # parallelism reads it after the router's ``scores.gather(1, topk_indices)`` (Note: [routing under fake
            # tensors]; Note: [expert parallel plans] in fakeviz._frontends.context_expert)
            for t in ins:
                if not getattr(t, "_fv_routed", False):
                    self._drop(t)
        return out

    def _from_real(self, func: Any, args: Any, kwargs: Any) -> Any:
        """An op whose output depends on values (``nonzero``, ``equal``, ``unique``) on known inputs: run it
        for real; fake outputs take the real outputs' metadata on the op's fake device."""
        real = _args.real_call(func, args, kwargs)
        device = _args.device_of(args, kwargs)
        written = {id(t) for t in self.written(func, args, kwargs)}
        routed = self.any_routed and any(getattr(t, "_fv_routed", False) for t in _args.arg_tensors(args, kwargs))

        def wrap(r: Any) -> Any:
            if not isinstance(r, _Tensor):
                return r
            for t in _args.arg_tensors(args, kwargs):  # an out= or in-place output is its argument
                if id(t) in written and isinstance(t, FakeTensor) and t.constant is r:
                    return t
            meta = torch.empty_strided(tuple(r.shape), tuple(r.stride()), dtype=r.dtype, device="meta")
            fake = FakeTensor(self.mode, meta, device)
            if r.numel() <= (ROUTING_LIMIT if routed else VALUE_LIMIT):
                self._attach(fake, r)
                if routed:
                    fake._fv_routed = True
            return fake

        if isinstance(real, (tuple, list)):
            return type(real)(wrap(r) for r in real)
        return wrap(real)

    def _factory(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        out = self._hidden(_args.arg_tensors(args, kwargs), lambda: self.impl(self.mode, func, types, args, kwargs))
        if isinstance(out, FakeTensor) and out.numel() <= VALUE_LIMIT and not _args.has_sym(args, kwargs):
            try:
                if func in _LIKE and func.name().startswith("aten::new_"):
                    with no_dispatch():
                        args = (torch.empty(0, dtype=args[0].dtype), *args[1:])
                real = _args.real_call(func, args, kwargs, placeholder=True)
            except Exception:  # noqa: BLE001 - no value
                return out
            if isinstance(real, _Tensor) and real.shape == out.shape and real.dtype == out.dtype:
                self._attach(out, real)
        return out

    def _overwrite(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """``fill_``, ``zero_``, ``copy_``: a tensor without a value gets one when nothing else aliases it."""
        t = args[0]
        if not isinstance(t, FakeTensor) or t.constant is not None:
            return self._general(func, types, args, kwargs)
        rest = _args.arg_tensors(args[1:], kwargs)
        out = self._hidden(rest, lambda: self.impl(self.mode, func, types, args, kwargs))
        if (
            all(isinstance(x, FakeTensor) and x.constant is not None for x in rest)
            and t.numel() <= VALUE_LIMIT
            and not _args.has_sym(args, kwargs)
            and _args.sole(t)
        ):
            try:
                real = _args.real_call(func, args, kwargs, placeholder=True)
            except Exception:  # noqa: BLE001 - no value
                return out
            if isinstance(real, _Tensor):
                self._attach(t, real)
        return out

    def _random(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """A random op: run for real with the real run's generator when in step (Note: [values under fake
        tensors], 2.)."""
        ins = _args.arg_tensors(args, kwargs)
        out = self._inplace_seen(func, args, kwargs, ins)
        if out is None:
            out = self._hidden(ins, lambda: self.impl(self.mode, func, types, args, kwargs))
        gen = self._generator(args, kwargs)
        outs = [o for o in _args.flat(out, []) if isinstance(o, FakeTensor)]
        n = sum(o.numel() for o in outs)
        written = self.written(func, args, kwargs)
        if gen is None or _args.has_sym(args, kwargs) or any(o.device.type != "cpu" for o in outs):
            for t in written:
                self._drop(t)
            return out
        if n > DRAW_LIMIT:
            self._lose(gen)
            for t in written:
                self._drop(t)
            return out
        # in-place overwrites (normal_, uniform_, bernoulli_...): the old value of self does not matter
        data = [t for t in ins if not any(t is w for w in written)]
        known = all(isinstance(t, FakeTensor) and t.constant is not None for t in data)
        sole = [w for w in written if isinstance(w, FakeTensor) and w.constant is None and _args.sole(w)]
        try:
            real = _args.real_call(func, args, kwargs, placeholder=True)
        except Exception:  # noqa: BLE001 - the draw could not be run: the generator is no longer in step
            self._lose(gen)
            for t in written:
                self._drop(t)
            return out
        if not known:
            for t in written:
                self._drop(t)
            return out
        for w in written:
            if w.constant is None and w.numel() <= VALUE_LIMIT and any(w is s for s in sole):
                r = _args.flat(real, [])[0] if w is args[0] else None
                if isinstance(r, _Tensor) and r.shape == w.shape:
                    self._attach(w, r)
        if not written:
            self._settle(func, args, kwargs, out, real, True)
        return out

    def _inplace_seen(self, func: Any, args: Any, kwargs: Any, ins: list[Any]) -> Any:
        """``args[0]`` if ``func`` is an in-place random op (``normal_``, ``uniform_``) already run by the fake rule
        on a tensor with this metadata and these arguments, else None (and the key is remembered for next time).

        A random op is never cached (``never_cached``) so that its draw is run, but the fake rule of an in-place
        one returns its input unchanged: running the rule (a Python decomposition, about 1.5 ms) once per
        shape and arguments keeps its argument checks and costs what a cache hit costs after."""
        t = args[0] if args else None
        if len(ins) != 1 or ins[0] is not t or type(t) is not FakeTensor or not _returns_self(func):
            return None
        try:
            key = (func, t.shape, t.stride(), t.dtype, t.fake_device, t.storage_offset(), args[1:],
                   tuple(sorted((kwargs or {}).items())))  # fmt: skip
            hash(key)
        except TypeError:  # symbolic sizes, unhashable arguments
            return None
        if key in self.seen:
            return t
        self.seen.add(key)
        return None

    def _generator(self, args: Any, kwargs: Any) -> Any:
        """The CPU generator the real run would draw from, or None when not in step or not on cpu."""
        if _args.device_of(args, kwargs).type != "cpu":
            return None
        g = (kwargs or {}).get("generator")
        if g is None:
            g = torch.default_generator
        elif g.device.type != "cpu":
            return None
        lost = self.lost.get(id(g))
        if lost is not None:
            if torch.equal(g.get_state(), lost[1]):
                return None
            del self.lost[id(g)]  # reseeded or set: in step with the real run again
        return g

    def _lose(self, g: Any) -> None:
        self.lost[id(g)] = (g, g.get_state())

    def _read(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """``_local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``): a known value, a bound, an assumption."""
        t = args[0]
        if isinstance(t, FakeTensor) and t.constant is not None:
            with no_dispatch():
                return t.constant.item()
        try:
            return self.impl(self.mode, func, types, args, kwargs)
        except DataDependentOutputException as exc:
            lo_hi = _reads.bounds(self.recorder, t) if self.recorder is not None else None
            if lo_hi is not None and lo_hi[0] == lo_hi[1]:
                v = lo_hi[0]
                return bool(v) if t.dtype == torch.bool else (int(v) if not t.dtype.is_floating_point else float(v))
            rule = _reads.rule_for_read()
            if rule is not None:
                self.assume(func, rule[1])
                return rule[0]
            exc.fakeviz_unknown = _reads.describe(self.recorder, t)  # type: ignore[attr-defined]
            _routing.hint(self, exc)
            raise

    def _index(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """Indexing with boolean masks: a mask's value gives the index tensors (``mask.nonzero()``); reading with
        an unknown mask assumes it all True (every element selected), writing with one needs no assumption."""
        idx_pos = 1
        indices = args[idx_pos] if len(args) > idx_pos else None
        masks = [i for i in (indices or ()) if isinstance(i, FakeTensor) and i.dtype in (torch.bool, torch.uint8)]
        if not masks or _args.has_sym(args, kwargs):
            return self._general(func, types, args, kwargs)
        ins = _args.arg_tensors(args, kwargs)
        known = all(isinstance(t, FakeTensor) and t.constant is not None for t in ins)
        if known or (self.mode.shape_env is not None and any(m.constant is None for m in masks)):
            return self._general(func, types, args, kwargs)  # (with a ShapeEnv: an unbacked size, as torch makes)
        if (
            func is not aten.index.Tensor
            and func is not aten._unsafe_index.Tensor
            and any(m.constant is None for m in masks)
        ):
            # x[mask] = v: the output is x (or a copy of it) whatever the mask selects; only the check that v
            # fits the selected elements needs the mask's values, and it is not made (no assumption changes the
            # record; FakeTensorMode caches these by metadata too)
            self._settle(func, args, kwargs, None, _args.FAILED, False)
            if _returns_self(func):
                return args[0]
            return self._hidden(ins, lambda: self.cached(self.mode, aten.clone.default, types, (args[0],), {}))
        new = []
        for i in indices:
            if isinstance(i, FakeTensor) and i.dtype in (torch.bool, torch.uint8):
                if i.constant is not None:
                    with no_dispatch():
                        cols = i.constant.nonzero().unbind(1)
                else:
                    self.assume(func, _reads.ALL_SELECTED.format(what=f"the boolean index of shape {list(i.shape)}"))
                    cols = [torch.empty(i.numel(), dtype=torch.long) for _ in range(i.dim())]
                for c in cols:
                    meta = torch.empty(tuple(c.shape), dtype=torch.long, device="meta")
                    new.append(FakeTensor(self.mode, meta, i.fake_device))
            else:
                new.append(i)
        args2 = (*args[:idx_pos], new, *args[idx_pos + 1 :])
        out = self._hidden(ins, lambda: self.cached(self.mode, func, types, args2, kwargs))
        self._settle(func, args, kwargs, out, _args.FAILED, False)
        return out

    def _topk(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """``topk``: with a known input, its value; in a router, the assumed routing (4. in the Note)."""
        out = self._general(func, types, args, kwargs)
        return _routing.assume(self, func, args, kwargs, out)

    def dynamic(self, func: Any, args: Any, kwargs: Any) -> Any:
        """An op whose output size depends on unknown values: the assumption that every element is selected
        (``nonzero``, ``masked_select``), or None when there is no such assumption for ``func``."""
        if func is aten.nonzero.default:
            t = args[0]
            n = t.numel()
            meta = torch.empty_strided((n, t.dim()), (1, max(n, 1)), dtype=torch.long, device="meta")
            self.assume(func, _reads.ALL_SELECTED.format(what=f"the {list(t.shape)} tensor"))
            return FakeTensor(self.mode, meta, t.fake_device)
        if func is aten.masked_select.default:
            t, mask = args[0], args[1]
            n = math.prod(torch.broadcast_shapes(t.shape, mask.shape))
            self.assume(func, _reads.ALL_SELECTED.format(what=f"the mask of shape {list(mask.shape)}"))
            return FakeTensor(self.mode, torch.empty(n, dtype=t.dtype, device="meta"), t.fake_device)
        if func is aten._ctc_loss.Tensor:
            return ctc_loss_outputs(self.mode, args, kwargs, lambda text: self.assume(func, text))
        # LLM.int8's outlier columns (Note: [LLM.int8 outliers under fake tensors] in fakeviz/_engine/quant/bnb.py)
        return outlier_outputs(self.mode, func, args, kwargs, lambda text: self.assume(func, text))

    def assume(self, func: Any, text: str) -> None:
        """List ``text`` as an assumption of op ``func`` (a row of ``fidelity()["assumptions"]``)."""
        if self.recorder is not None:
            self.recorder.note_assumption(func, text)


def advice(exc: BaseException) -> str:
    """What to do about a read of an unknown value ``exc`` (the body of the recorder's DataDependentError)."""
    return _reads.read_advice(exc, VALUE_LIMIT)
