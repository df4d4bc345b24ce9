"""The dispatch modes that record: the fake mode with the recorder fused in, the real-run mode, and the
fast fake detach they share with the saved-tensor hook.

Note: [recorder fused into the fake mode]
A TorchDispatchMode stacked on top of FakeTensorMode is re-entered for every
dispatch, including the ``prim.device`` queries that fake tensors answer in
Python (about 2/3 of all dispatches in a Llama fwd+bwd). A pass-through mode
alone cost about 10 % of the bare fake run (measured: 4.35 s vs 3.93 s). For
fake runs the recorder is therefore fused into a FakeTensorMode subclass: one
``__torch_dispatch__`` that returns at once for ``prim.*`` ops and otherwise
records after the fake kernel ran. For real runs (``fake=False``) the same
recording core sits in a plain private TorchDispatchMode.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorConfig as _FakeTensorConfig
from torch._subclasses.fake_tensor import FakeTensorMode, _BypassDispatchCache, _DispatchCacheKey
from torch.utils._python_dispatch import TorchDispatchMode

from .. import values as _values
from .common import _DETACH, _Tensor, float_blind

if TYPE_CHECKING:
    from .state import _State


def _fake_detach(t: Any, mode: Any = None) -> Any:
    """``t.detach()`` of a FakeTensor without FakeTensorMode's dispatch machinery.

    Note: [fast fake detach]
    About 100 us of each detach through FakeTensorMode is its dispatch bookkeeping
    (cache key, validation, output reconstruction); recording adds many of them: the
    saved-tensor pack hook makes an alias per saved output (Note: [saved tensors]) and,
    with saved-tensor hooks on, autograd's unpacking in backward detaches every saved
    FakeTensor through Python (``make_variable`` -> ``shallow_copy_and_detach``). This
    does what the mode does on its uncached path: run the meta kernel with fake
    dispatch off (``in_kernel_invocation_manager``) and wrap the meta result as a
    FakeTensor on the same fake device. Only for a plain FakeTensor of ``mode`` (any
    mode if None) with no constant or real tensor attached, which the mode would
    propagate; returns None otherwise or on failure, and the caller takes the
    ordinary path.
    """
    if type(t) is not _FakeTensor:
        return None
    fmode = t.fake_mode
    if (mode is not None and fmode is not mode) or t.constant is not None or t.real_tensor is not None:
        return None
    try:
        device = t.device
        if _meta_in_tls() != fmode.in_kernel_invocation:
            return None  # an unexpected dispatch state: the mode's own path says what it makes of it
        return _wrap_fake(fmode, _in_kernel(fmode, _DETACH_OP, t), device)
    except Exception:  # noqa: BLE001 - fall back to the ordinary path
        return None


def _in_kernel(mode: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` inside ``in_kernel_invocation_manager(mode)``, inlined: the generator-based context manager
    alone cost about 3 us, more than the meta kernels it wraps (a detach, a cache hit's output)."""
    prev = mode.in_kernel_invocation
    with _DisableTorchDispatch():
        mode.in_kernel_invocation = True
        with _PreserveDispatchKeyGuard():
            _set_meta_in_tls(True)
            try:
                return fn(*args)
            finally:
                mode.in_kernel_invocation = prev


_meta_in_tls = torch._C._meta_in_tls_dispatch_include
_set_meta_in_tls = torch._C._set_meta_in_tls_dispatch_include
_DisableTorchDispatch = torch._C._DisableTorchDispatch
_PreserveDispatchKeyGuard = torch._C._PreserveDispatchKeyGuard
_DETACH_OP = getattr(_DETACH, "_op", _DETACH)  # the C++ op behind the OpOverload's __call__


def _wrap_fake(mode: Any, meta: Any, device: Any) -> Any:
    """``FakeTensor(mode, meta, device)``, without its constructor's argument handling.

    Note: [light FakeTensor wrap]
    FakeTensor.__new__ spends about 25 us in Python (keyword parsing, device
    normalisation, fifteen memo attributes set through descriptors) around one
    ``Tensor._make_subclass`` call. For a given mode and device the Python state it
    leaves in the instance ``__dict__`` is always the same (the mode, the device,
    ``None`` for constant, real tensor, pytype, dispatch keys and every memo), so
    the first wrap per (mode, device) goes through the constructor and keeps a copy
    of that ``__dict__``; later wraps make the subclass instance the same way the
    constructor does (same dispatch-device arguments, same mutable-data-pointer
    guard) and copy the state in. Not used with ``FakeTensorConfig.debug`` (which
    adds a per-tensor traceback).
    """
    protos = mode.__dict__.get("_fv_protos")
    proto = protos.get(device) if protos is not None else None
    if proto is None or _FakeTensorConfig.debug:
        out = _FakeTensor(mode, meta, device)
        if not _FakeTensorConfig.debug:
            if protos is None:
                protos = mode.__dict__["_fv_protos"] = {}
            protos[device] = dict(out.__dict__)
        return out
    out = _Tensor._make_subclass(
        _FakeTensor, meta, meta.requires_grad, dispatch_device=True, device_for_backend_keys=device
    )
    if mode._allow_unsafe_data_ptr_access:
        _warn_mutable_data_ptr(out)
    else:
        _throw_mutable_data_ptr(out)
    out.__dict__.update(proto)
    return out


_warn_mutable_data_ptr = torch._C._set_warn_deprecated_on_mutable_data_ptr
_throw_mutable_data_ptr = torch._C._set_throw_on_mutable_data_ptr


def _fast_output_from_entry(mode: Any, state: Any, entry: Any, key: Any, func: Any, args: Any) -> Any:
    """FakeTensorMode's ``_output_from_cache_entry`` for a mode without a ShapeEnv (a cache hit's outputs).

    Note: [light cache-hit outputs]
    On a dispatch-cache hit FakeTensorMode makes each output through ``in_kernel_invocation_manager`` (a
    generator context manager), ``torch.empty_strided`` on meta and ``FakeTensor.__new__``: about 40 % of the
    time of a recorded backward. This does the same steps with the context manager inlined and the output
    wrapped by :func:`_wrap_fake` (Note: [light FakeTensor wrap]): an in-place op returns its argument, a
    constant entry its value, a view is set onto its input's storage. An entry with symbolic sizes, another
    layout or an unexpected dispatch state, or a run inside ``torch.export`` (whose fake-tensor leak tracker
    hooks the constructor) takes torch's own method.
    """
    if (
        not _LIGHT_OUTPUTS
        or mode.shape_env is not None
        or _is_exporting()
        or _meta_in_tls() != mode.in_kernel_invocation
    ):
        return _fake_output_from_entry(mode, state, entry, key, func, args)
    outs = []
    for info in entry.output_infos:
        md = info.metadata
        if info.inplace_idx is not None:
            outs.append(args[info.inplace_idx])
            continue
        if md is None:
            if info.view_idx is not None:
                return _fake_output_from_entry(mode, state, entry, key, func, args)
            outs.append(info.constant_value)  # None, or a non-tensor output
            continue
        if (
            md.layout is not _STRIDED
            or type(md.storage_offset) is not int
            or not all(type(v) is int for v in (*md.shape, *md.stride))
        ):
            return _fake_output_from_entry(mode, state, entry, key, func, args)
        view = isinstance(func, torch._ops.OpOverload) and func.is_view
        if view and info.view_idx is None:
            return _fake_output_from_entry(mode, state, entry, key, func, args)
        base = args[info.view_idx] if view else None
        outs.append(_wrap_fake(mode, _in_kernel(mode, _meta_output, md, base), md.device))
    return tuple(outs) if entry.is_output_tuple else outs[0]


def _meta_output(md: Any, base: Any) -> Any:
    """The meta tensor of a cache entry's output metadata ``md``; a view is set onto ``base``'s storage."""
    meta = _EMPTY_STRIDED(md.shape, md.stride, dtype=md.dtype, layout=md.layout, device="meta",
                          requires_grad=md.requires_grad)  # fmt: skip
    if md.is_conj:
        torch._C._set_conj(meta, True)
    if md.is_neg:
        torch._C._set_neg(meta, True)
    if base is not None:
        meta.set_(base.untyped_storage(), md.storage_offset, md.shape, md.stride)
    return meta


_EMPTY_STRIDED = torch.empty_strided
_LIGHT_OUTPUTS = True  # Note: [light cache-hit outputs]; tests switch it off to compare


def _install_fallback_probe() -> None:
    """Note: [fallback kernels]
    FakeTensorMode runs an op that has no meta kernel by running the real kernel
    on zero-filled tensors (``fake_tensor.run_fallback_kernel``). Record each such
    run in the trace of the recording mode it happened in (for the fidelity
    report); the wrapper is transparent for every other FakeTensorMode."""
    import torch._subclasses.fake_tensor as ft

    original = ft.run_fallback_kernel
    if getattr(original, "_fakeviz_probe", False):
        return

    def run_fallback_kernel(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        st = getattr(fake_mode, "_fv_state", None)
        if st is not None and st.active:
            st.trace.meta.setdefault("fallback_kernels", []).append([st.b.num_ops(), str(func)])
        return original(fake_mode, func, *args, **kwargs)

    run_fallback_kernel._fakeviz_probe = True  # type: ignore[attr-defined]
    ft.run_fallback_kernel = run_fallback_kernel


_install_fallback_probe()


# Note: [strides of the real kernel]
# For a few ops the fake rule FakeTensorMode runs (torch's Python decomposition, also what it registers as the
# Meta kernel) gives other output strides than the real kernels: ``_log_softmax_backward_data`` is
# ``grad - exp(out) * sum(grad)``, whose strides follow a non-contiguous ``grad`` (CTC heads: the grad of a
# transposed log_softmax), where the real CPU and CUDA kernels (structured, ``TORCH_META_FUNC
# (_log_softmax_backward_data)``: ``set_output_raw_strided(0, grad.sizes(), {}, LEGACY_CONTIGUOUS)``)
# return a contiguous tensor. Autograd then cloned it before a ``view`` in the fake run only: one extra op and
# another memory curve (Wav2Vec2ForCTC). A recording mode gives these ops' outputs the real kernels'
# (contiguous) strides; the dispatch cache then holds the corrected entry. Only without symbolic sizes.
_CONTIGUOUS_OUT = frozenset({torch.ops.aten._log_softmax_backward_data.default})


def _contiguous_out(mode: Any, out: Any) -> Any:
    if not isinstance(out, _FakeTensor) or out.is_contiguous() or out._has_symbolic_sizes_strides:
        return out
    from torch._subclasses.fake_tensor import in_kernel_invocation_manager

    with in_kernel_invocation_manager(mode):
        meta = torch.empty(tuple(out.shape), dtype=out.dtype, device="meta")
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, out.fake_device)


# Note: [fast dispatch-cache key]
# FakeTensorMode's cache key (``_cache_key``) turns every FakeTensor argument into a ``TensorMetadata``
# dataclass (its memory format found by ``suggest_memory_format``) and flattens it field by field through
# ``dataclasses.fields``: about 25 us per tensor, a third of a recorded Llama training step (and a
# ``_foreach_*`` op of AdamW has hundreds of tensor arguments). For the common case, a mode without a
# ShapeEnv and arguments that are plain FakeTensors of this mode (strided, no constant, no symbolic sizes)
# and plain scalars, ``_fast_key`` builds an equivalent key directly: per tensor dtype, sizes, strides,
# device, storage offset, storage bytes, requires_grad, conj/neg bits and inference flag (the memory format
# torch also keys on is a function of sizes and strides). Any other argument (a SymInt, a real tensor, a
# function, a GraphModule, ...) takes torch's own key, which decides to key or to bypass. The fast keys start
# with ``_FAST`` and so never equal a key of torch's (both live in FakeTensorMode's process-wide cache).
# ``tests/engine/test_native_core.py`` checks that a recording with and without it gives the same trace.
_FAST = ("fakeviz-fast-key", 1)
_SCALARS = frozenset({int, float, bool, str, type(None), complex, torch.dtype, torch.device, torch.layout,
                      torch.memory_format})  # fmt: skip
_STRIDED = torch.strided
_ANY_FLOAT = ("fakeviz-any-float",)  # Note: [float-blind in-place keys]


class _NotFast(Exception):
    pass


def _fast_args(mode: Any, out: list[Any], args: Any, blind: bool = False) -> None:
    for a in args:
        t = type(a)
        if t is float and blind:  # Note: [float-blind in-place keys]
            out.append(float)
            out.append(_ANY_FLOAT)
            continue
        if t is _FakeTensor:
            if (
                a.fake_mode is not mode
                or a.constant is not None
                or a.layout is not _STRIDED
                or a._has_symbolic_sizes_strides
            ):
                raise _NotFast
            out.append((_FAST, a.dtype, a.shape, a.stride(), a.fake_device, a.storage_offset(),
                        a.untyped_storage().nbytes(), a.requires_grad, a.is_conj(), a.is_neg(), a.is_inference()))  # fmt: skip
        elif t in _SCALARS:
            out.append(t)
            out.append(a)
        elif t is list or t is tuple:
            out.append(t)
            out.append(len(a))
            _fast_args(mode, out, a, blind)
        else:
            raise _NotFast


def _fast_key(mode: Any, func: Any, args: Any, kwargs: Any) -> Any:
    """Note: [fast dispatch-cache key]: the key, or None where torch's own key must decide."""
    if mode.shape_env is not None or mode.in_kernel_invocation:
        return None
    out = [_FAST, func, torch.get_default_dtype(), torch._C._get_default_device(), torch.is_inference_mode_enabled(),
           torch.fx.experimental.proxy_tensor.get_proxy_mode() is not None]  # fmt: skip
    blind = float_blind(func)
    try:
        _fast_args(mode, out, args, blind)
        if kwargs:
            out.append(len(kwargs))
            for k, v in kwargs.items():
                out.append(k)
                _fast_args(mode, out, (v,), blind)
    except _NotFast:
        return None
    return _DispatchCacheKey(tuple(out))


class _FakeRecordingMode(FakeTensorMode):
    """FakeTensorMode with the recorder fused in. See Note: [recorder fused into the fake mode]."""

    _fv_state: _State | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Note: [values under fake tensors]: the values of small tensors, random draws in step, assumptions
        self._fv_values = _values.Values(self, _fake_dispatch_impl)
        _values.forget_cached_constructors()

    def _dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # reached on a dispatch-cache miss or bypass only (an op on a tensor with a value always bypasses)
        if func in _CONTIGUOUS_OUT:  # Note: [strides of the real kernel]
            return _contiguous_out(self, self._fv_values.dispatch(func, types, args, kwargs))
        return self._fv_values.dispatch(func, types, args, kwargs)

    def _validate_cache_key(self, func: Any, args: Any, kwargs: Any) -> None:
        # called on a cache miss only: random ops are never cached here (Note: [values under fake tensors])
        if _values.never_cached(func):
            raise _BypassDispatchCache("fakeviz: random op")
        dev = kwargs.get("device") if kwargs else None
        if type(dev) is torch.device and dev.index is None and dev.type != "cpu":
            # "cuda" means the current device, which the cache key does not hold: FakeTensorMode's cache is
            # shared by every mode of the process, and a rank of fakeviz.simulate on cuda:1 would get the
            # cuda:0 tensor an earlier rank cached (torch.empty(n, device="cuda"))
            raise _BypassDispatchCache("fakeviz: device without index")
        return _fake_validate_key(self, func, args, kwargs)

    def _cache_key(self, state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        key = _fast_key(self, func, args, kwargs) if _FAST_KEYS else None
        return key if key is not None else _fake_cache_key(self, state, func, args, kwargs)

    def validate_and_convert_non_fake_tensors(self, func: Any, converter: Any, flat_args: Any, args_spec: Any) -> Any:
        validated, fakes = super().validate_and_convert_non_fake_tensors(func, converter, flat_args, args_spec)
        st = self._fv_state
        if st is not None and st.active:  # Note: [converted tensors]
            for a, v in zip(flat_args, validated):
                if v is not a and type(v) is _FakeTensor and isinstance(a, _Tensor):
                    st.converted(a, v)
        return validated, fakes

    def from_real_recorded(self, x: Any) -> Any:
        """``x`` (a real CPU tensor the values layer keeps the values of) in this mode: Note: [converted tensors]."""
        fake = self.fake_tensor_converter.from_real_tensor(self, x)
        st = self._fv_state
        if st is not None and st.active:
            st.converted(x, fake)
        return fake

    def may_turn_const(self, t: Any) -> bool:
        # torch.tensor(data): keep the values of up to VALUE_LIMIT elements (torch keeps one)
        return (
            t.numel() <= _values.VALUE_LIMIT
            and t.layout == torch.strided
            and not self.is_our_fake(t)
            and t.device.type == "cpu"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> _FakeRecordingMode:
        # Note: [deepcopy of recorded tensors]: a deep-copied fake tensor belongs to the same mode (the
        # mode is the session every fake tensor shares, not a value; copying it would copy the recorder)
        return self

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        st = self._fv_state
        if func._namespace == "prim" or st is None or not st.active:
            return _fake_dispatch(self, func, types, args, kwargs)
        return st.run_op(_fake_dispatch_fast if func is _DETACH else _fake_dispatch, self, func, types, args, kwargs)

    # Note: [recorded op cache]: hand the outermost op's dispatch-cache entry to the recorder
    def _output_from_cache_entry(self, state: Any, entry: Any, key: Any, func: Any, args: Any) -> Any:
        self._fv_entry(func, entry)
        return _fast_output_from_entry(self, state, entry, key, func, args)

    def _make_cache_entry(self, state: Any, key: Any, func: Any, args: Any, kwargs: Any, output: Any) -> Any:
        entry = _fake_make_entry(self, state, key, func, args, kwargs, output)
        self._fv_entry(func, entry)
        return entry

    def _fv_entry(self, func: Any, entry: Any) -> None:
        st = self._fv_state
        if st is not None and self.shape_env is None:
            loc = st.local.__dict__
            if loc.get("depth") == 1 and loc.get("entry") is None:
                loc["entry"] = (func, entry)


_HOOKS = ("__torch_dispatch__", "_output_from_cache_entry", "_make_cache_entry")
_OWN_HOOKS = {name: _FakeRecordingMode.__dict__[name] for name in _HOOKS}


def _install_core_hooks(mode: _FakeRecordingMode, state: _State) -> None:
    """Note: [recorder core in C]: while ``state`` records, the mode's per-dispatch hooks are
    the core's C methods, bound to the mode instance (a hook replaced on the class, by a
    subclass or a test, is left to the class)."""
    _remove_core_hooks(mode)
    core = state.core
    if core is None:
        return
    own = {"__torch_dispatch__": core.dispatch, "_output_from_cache_entry": core.output_from_cache_entry,
           "_make_cache_entry": core.make_cache_entry}  # fmt: skip
    for name in _HOOKS:
        if getattr(type(mode), name) is _OWN_HOOKS[name]:
            mode.__dict__[name] = types.MethodType(own[name], mode)


def _remove_core_hooks(mode: _FakeRecordingMode) -> None:
    for name in _HOOKS:
        mode.__dict__.pop(name, None)


_fake_dispatch = FakeTensorMode.__torch_dispatch__
_fake_dispatch_impl = FakeTensorMode._dispatch_impl
_fake_validate_key = FakeTensorMode._validate_cache_key
_fake_cache_key = FakeTensorMode._cache_key
_FAST_KEYS = True  # Note: [fast dispatch-cache key]; tests switch it off to compare
_fake_output_from_entry = getattr(FakeTensorMode, "_output_from_cache_entry", None)  # private: may be renamed
_fake_make_entry = getattr(FakeTensorMode, "_make_cache_entry", None)
_is_exporting = torch.compiler.is_exporting


def _fake_dispatch_fast(mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """FakeTensorMode's dispatch, with detach short-cut (Note: [fast fake detach])."""
    if func is _DETACH and len(args) == 1 and not kwargs:
        out = _fake_detach(args[0], mode)
        if out is not None:
            return out
    return _fake_dispatch(mode, func, types, args, kwargs)


class _RealRecordingMode(TorchDispatchMode):
    """The recorder over real tensors (``record(fake=False)``)."""

    def __init__(self, state: _State) -> None:
        super().__init__()
        self._fv_state = state

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        st = self._fv_state
        if not st.active or func._namespace == "prim":
            return func(*args, **(kwargs or {}))
        return st.run_op(_real_dispatch, self, func, types, args, kwargs)


def _real_dispatch(mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def deepcopy_patch(state: _State) -> Iterator[None]:
    """While recording, ``copy.deepcopy`` of a tensor keeps the copy's own tensor id (Note: [deepcopy of recorded
    tensors]); restored on exit."""
    original = torch.Tensor.__deepcopy__

    def __deepcopy__(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:
        # a tensor's values (Note: [values under fake tensors]) are not copied with its __dict__ (that would copy
        # the real tensor through the fake mode): the copy is a clone, its value a clone of the value
        value = self.__dict__.get("constant") if type(self) is _FakeTensor else None
        if value is not None:
            self.constant = None
        try:
            with warnings.catch_warnings():
                # torch's own __deepcopy__ asks a FakeTensor for its data_ptr() to choose the clone path
                warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
                out = original(self, memo)
        finally:
            if value is not None:
                self.constant = value
        if value is not None and type(out) is _FakeTensor and out is not self:
            values = getattr(self.fake_mode, "_fv_values", None)
            if values is not None:
                values.give(out, value)
        if out is not self and isinstance(out, torch.Tensor) and state.active:
            state.copied(self, out)
        return out

    torch.Tensor.__deepcopy__ = __deepcopy__  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.__deepcopy__ = original  # type: ignore[method-assign]
