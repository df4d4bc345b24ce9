"""The dispatch modes that record: the fake mode with the recorder fused in (its dispatch-cache hooks, the C
core's hooks on it), the real-run mode, and the deepcopy patch. The fast paths the fake mode takes (fast
detach, fast dispatch-cache key, light cache-hit outputs) are in ``fastpath.py``.

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
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorMode, _BypassDispatchCache
from torch.utils._python_dispatch import TorchDispatchMode

from .. import patches as _patches
from .. import values as _values
from .common import _DETACH, _get_ident, _Tensor
from .fastpath import _fake_detach, _fake_dispatch, _fake_make_entry, _fast_key, _fast_output_from_entry
from .state import _State


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
    _patches.push(ft, "run_fallback_kernel", run_fallback_kernel, entry="fallback-probe")  # for the process


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
        key = _fast_key(self, func, args, kwargs)  # Note: [fast dispatch-cache key]; None if switched off
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
        if (
            func._namespace == "prim"
            or st is None
            or not st.active
            or (_get_ident() != st.owner and not st.own_thread())
        ):
            return _fake_dispatch(self, func, types, args, kwargs)  # Note: [threads] in patches.py
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


_fake_dispatch_impl = FakeTensorMode._dispatch_impl
_fake_validate_key = FakeTensorMode._validate_cache_key
_fake_cache_key = FakeTensorMode._cache_key


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
        if not st.active or func._namespace == "prim" or (_get_ident() != st.owner and not st.own_thread()):
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

    token = _patches.push(torch.Tensor, "__deepcopy__", __deepcopy__, entry="deepcopy")
    try:
        yield
    finally:
        _patches.pop(token)
