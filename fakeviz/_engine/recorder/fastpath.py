"""The recorder's fake-tensor fast path: what the fused fake mode (``modes.py``), the saved-tensor hook
(``autograd.py``) and the C core (``state.py`` hands these to it) use to skip FakeTensorMode's Python
bookkeeping on the common paths, and the torch internals they bind.

* the fast fake detach (Note: [fast fake detach]) and the inlined kernel invocation it shares (``_in_kernel``);
* the light FakeTensor wrap (Note: [light FakeTensor wrap]);
* the light cache-hit outputs (Note: [light cache-hit outputs]; switch: ``_LIGHT_OUTPUTS``);
* the fast dispatch-cache key (Note: [fast dispatch-cache key]; switch: ``_FAST_KEYS``).

Both switches are read at call time (tests turn them off to compare with torch's own key and outputs).
Nothing here imports the rest of the recorder but ``common.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorConfig as _FakeTensorConfig
from torch._subclasses.fake_tensor import FakeTensorMode, _DispatchCacheKey

from .. import values as _values
from .common import _DETACH, _Tensor, float_blind

# FakeTensorMode's own methods, called where the fast path does not apply (and handed to the C core). The two
# private ones are called with the parameters of native.TORCH_CONTRACT: ``modes.adapt`` rebinds them to callers
# for the signature torch has (Note: [private torch signatures])
_fake_dispatch = FakeTensorMode.__torch_dispatch__
_fake_output_from_entry: Any = getattr(FakeTensorMode, "_output_from_cache_entry", None)
_fake_make_entry: Any = getattr(FakeTensorMode, "_make_cache_entry", None)
_is_exporting = torch.compiler.is_exporting


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
    time of a recorded backward. :func:`light_outputs` does the same steps with the context manager inlined and
    the output wrapped by :func:`_wrap_fake` (Note: [light FakeTensor wrap]): an in-place op returns its
    argument, a constant entry its value, a view (an entry with a ``view_idx``: torch >= 2.15 also caches
    ``_unsafe_view`` so) is set onto its input's storage. An entry with symbolic sizes, another layout or an
    unexpected dispatch state, a run inside ``torch.export`` (whose fake-tensor leak tracker hooks the
    constructor), or a torch whose cache entries have other fields than ``native.TORCH_CONTRACT`` says
    (``_ENTRY_FIELDS``) takes torch's own method.
    """
    out = light_outputs(mode, entry, args)
    return _fake_output_from_entry(mode, state, entry, key, func, args) if out is _NOT_LIGHT else out


_NOT_LIGHT = object()
_ENTRY_FIELDS = True  # whether torch's cache entries have the fields light_outputs reads (modes.adapt sets it)


def light_outputs(mode: Any, entry: Any, args: Any) -> Any:
    """The outputs of cache ``entry`` for op arguments ``args`` (Note: [light cache-hit outputs]), or
    ``_NOT_LIGHT`` where torch's own ``_output_from_cache_entry`` must make them."""
    if (
        not _LIGHT_OUTPUTS
        or not _ENTRY_FIELDS
        or mode.shape_env is not None
        or _is_exporting()
        or _meta_in_tls() != mode.in_kernel_invocation
    ):
        return _NOT_LIGHT
    outs = []
    for info in entry.output_infos:
        md = info.metadata
        if info.inplace_idx is not None:
            outs.append(args[info.inplace_idx])
            continue
        if md is None:
            if info.view_idx is not None:
                return _NOT_LIGHT
            outs.append(info.constant_value)  # None, or a non-tensor output
            continue
        if (
            md.layout is not _STRIDED
            or type(md.storage_offset) is not int
            or not all(type(v) is int for v in (*md.shape, *md.stride))
        ):
            return _NOT_LIGHT
        # torch sets view_idx exactly for the ops whose output it makes a view of its input (every torch.is_view
        # op; since 2.15 _unsafe_view too), and makes the output so on a hit
        base = args[info.view_idx] if info.view_idx is not None else None
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
_FAST = _values.FAST_KEY
_SCALARS = frozenset({int, float, bool, str, type(None), complex, torch.dtype, torch.device, torch.layout,
                      torch.memory_format})  # fmt: skip
_STRIDED = torch.strided
_ANY_FLOAT = ("fakeviz-any-float",)  # Note: [float-blind in-place keys]
_FAST_KEYS = True  # Note: [fast dispatch-cache key]; tests switch it off to compare


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
    """Note: [fast dispatch-cache key]: the key, or None where torch's own key must decide (and always None
    with the fast keys switched off, ``_FAST_KEYS``)."""
    if not _FAST_KEYS or mode.shape_env is not None or mode.in_kernel_invocation:
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
