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
import functools
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorMode, _BypassDispatchCache
from torch.overrides import _get_current_function_mode_stack as _function_modes
from torch.utils._device import DeviceContext as _DeviceContext
from torch.utils._device import _device_constructors
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import native as _native
from .. import patches as _patches
from .. import torchao_patches as _torchao_patches
from .. import value_args as _value_args
from .. import values as _values
from . import fastpath as _fastpath
from . import signatures as _signatures
from .common import _DETACH, _get_ident, _Tensor
from .fastpath import _fake_detach, _fake_dispatch, _fast_key, _fast_output_from_entry
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
    if (_native.torch_parameters("run_fallback_kernel") or ())[:2] != ("fake_mode", "func"):
        _STEPPED_ASIDE.append(
            (
                _native.contract_problems({"run_fallback_kernel": _native.TORCH_CONTRACT["run_fallback_kernel"]})[0],
                "the fidelity report does not list the ops that ran a fallback kernel",
            )
        )
        return

    def run_fallback_kernel(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        st = getattr(fake_mode, "_fv_state", None)
        if st is not None and st.active:
            st.trace.meta.setdefault("fallback_kernels", []).append([st.builder.num_ops(), str(func)])
        return original(fake_mode, func, *args, **kwargs)

    run_fallback_kernel._fakeviz_probe = True  # type: ignore[attr-defined]
    run_fallback_kernel.__wrapped__ = original  # type: ignore[attr-defined]  # torch's signature (native.torch_parameters)
    _patches.push(ft, "run_fallback_kernel", run_fallback_kernel, entry="fallback-probe")  # for the process


#: (what moved, what stepping aside costs) for each override that stepped aside to torch's own path (Note: [private
#: torch signatures]); said in one warning
_STEPPED_ASIDE: list[tuple[str, str]] = []
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
        if _REFUSED:
            from ..torch_compat import TorchVersionError

            raise TorchVersionError(_REFUSED)
        super().__init__(*args, **kwargs)
        if not _CACHE:  # Note: [private torch signatures]: the cache's validation stepped aside, so no cache
            self.cache_enabled = False
        # Note: [values under fake tensors]: the values of small tensors, random draws in step, assumptions
        self._fv_values = _values.Values(self, _fake_dispatch_impl, _fake_cached_impl if _CACHE else None)
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
        validated, fakes = _fake_validate_convert(self, func, converter, flat_args, args_spec)
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
        entry = _fastpath._fake_make_entry(self, state, key, func, args, kwargs, output)
        self._fv_entry(func, entry)
        return entry

    def _fv_entry(self, func: Any, entry: Any) -> None:
        st = self._fv_state
        if st is not None and self.shape_env is None:
            loc = st.local.__dict__
            if loc.get("depth") == 1 and loc.get("entry") is None:
                loc["entry"] = (func, entry)


_torchao_patches.install_hop_rules(_FakeRecordingMode)  # Note: [out_dtype under the recording mode]

_HOOKS = ("__torch_dispatch__", "_output_from_cache_entry", "_make_cache_entry")
_OWN_HOOKS = {name: _FakeRecordingMode.__dict__[name] for name in _HOOKS}


def _install_core_hooks(mode: _FakeRecordingMode, state: _State) -> None:
    """Note: [recorder core in C]: while ``state`` records, the mode's per-dispatch hooks are
    the core's C methods, bound to the mode instance (a hook replaced on the class, by a
    subclass, a test or an adapter to torch's signature: Note: [private torch signatures], is left to the
    class)."""
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


# Note: [private torch signatures]: the overrides of _FakeRecordingMode as written, by name: (the parameters each
# reads, what stepping aside to torch's own method costs; None: fakeviz cannot record without it), and torch's own
# methods fakeviz calls, bound by adapt() to the signature torch has
_OVERRIDES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "_dispatch_impl": (("func", "args", "kwargs"), None),
    "_validate_cache_key": (("func", "kwargs"), "FakeTensorMode's dispatch cache is off in fakeviz's sessions"),
    "_cache_key": (("func", "args", "kwargs"), "torch's own dispatch-cache keys (Note: [fast dispatch-cache key])"),
    "_output_from_cache_entry": (("entry", "func", "args"),
                                 "no recorded op cache on dispatch-cache hits, torch's own cache-hit outputs"),
    "_make_cache_entry": (("func",), "no recorded op cache on dispatch-cache misses"),
    "validate_and_convert_non_fake_tensors": (("flat_args",),
                                              "less exact: a view of a real tensor used in a record counts as a new "
                                              "storage, Note: [converted tensors]"),
    "may_turn_const": (("t",), "less exact: torch.tensor(data) keeps the values of one element, not VALUE_LIMIT; "
                               "Note: [values under fake tensors]"),
}  # fmt: skip
_WRITTEN = {name: _FakeRecordingMode.__dict__[name] for name in _OVERRIDES}
_CALLED = ("_dispatch_impl", "_validate_cache_key", "_cache_key", "_output_from_cache_entry", "_make_cache_entry",
           "validate_and_convert_non_fake_tensors", "_cached_dispatch_impl")  # fmt: skip
_CACHE = True  # whether fakeviz's fake modes use FakeTensorMode's dispatch cache
_REFUSED = ""  # why fakeviz cannot record on this torch (a fake mode raises TorchVersionError), "" where it can
_fake_dispatch_impl: Any = None
_fake_validate_key: Any = None
_fake_cache_key: Any = None
_fake_validate_convert: Any = None
_fake_cached_impl: Any = None


def adapt() -> list[tuple[str, str]]:
    """Bind the recording mode's overrides and the torch methods fakeviz calls to the signatures of the installed
    torch (Note: [private torch signatures]); warn once (:class:`TorchInternalsWarning`) where an override stepped
    aside. Returns (what moved, what it costs) for each that stepped aside. Run at import; tests run it again
    after moving a signature in their own scope."""
    global _CACHE, _REFUSED, _fake_dispatch_impl, _fake_validate_key, _fake_cache_key, _fake_validate_convert
    global _fake_cached_impl
    import torch as _torch

    from ..torch_compat import TorchInternalsWarning

    callers: dict[str, Any] = {}
    stepped = list(_STEPPED_ASIDE)
    for name in _CALLED:
        callers[name], _ = _signatures.outgoing(f"FakeTensorMode.{name}")
    _REFUSED = ""
    for name, (reads, cost) in _OVERRIDES.items():
        path = f"FakeTensorMode.{name}"
        hook, moved = _signatures.incoming(path, _WRITTEN[name], reads)
        if hook is not None and name in callers and callers[name] is None:
            hook = None  # the override calls torch's own, which cannot be called with what fakeviz has
        if hook is None:
            if cost is None:
                _REFUSED = (f"torch {_torch.__version__} changed FakeTensorMode internals fakeviz's fake sessions "
                            f"cannot work without: {moved} (Note: [private torch signatures]); install a torch "
                            "fakeviz supports (docs/torch_versions.md)")  # fmt: skip
            else:
                stepped.append((moved, cost))
            if name in _FakeRecordingMode.__dict__:
                delattr(_FakeRecordingMode, name)
        else:
            setattr(_FakeRecordingMode, name, hook)
    _CACHE = "_validate_cache_key" in _FakeRecordingMode.__dict__
    _fake_dispatch_impl = callers["_dispatch_impl"]
    _fake_validate_key = callers["_validate_cache_key"]
    _fake_cache_key = callers["_cache_key"]
    _fake_validate_convert = callers["validate_and_convert_non_fake_tensors"]
    _fake_cached_impl = callers["_cached_dispatch_impl"]
    _fastpath._fake_output_from_entry = callers["_output_from_cache_entry"]
    _fastpath._fake_make_entry = callers["_make_cache_entry"]
    entries = ("_DispatchCacheValidEntry", "_DispatchCacheEntryOutputInfo")
    _fastpath._ENTRY_FIELDS = all(
        set(_native.TORCH_CONTRACT[p]) <= set(_native.torch_parameters(p) or ()) for p in entries
    )
    if not _fastpath._ENTRY_FIELDS:
        stepped.append(("; ".join(_native.contract_problems({p: _native.TORCH_CONTRACT[p] for p in entries})),
                        "torch's own cache-hit outputs (Note: [light cache-hit outputs])"))  # fmt: skip
    if stepped:
        warnings.warn(
            f"fakeviz: torch {_torch.__version__} changed FakeTensorMode internals fakeviz overrides; fakeviz takes "
            "torch's own path there (slower; less exact only where said): "
            + "; ".join(f"{moved} ({cost})" for moved, cost in stepped),
            TorchInternalsWarning,
            stacklevel=2,
        )
    return stepped


adapt()


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
    if _value_args.has_subclass(args, kwargs):
        # Note: [tensor subclasses under the values layer]: as FakeTensorMode does, so a real run records the
        # subclass's ops on its inner tensors (torchao's optimizer state: its codes and scales), as the fake run does
        return NotImplemented
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


# Note: [torch.tensor on fake cuda without a GPU]
# ``torch.tensor(data, device="cuda")`` (and ``torch.as_tensor``, ``Tensor.new_tensor`` of Python data) builds
# the data on cpu with every mode off, and on a GPU copies it to the device there, before any dispatch: the
# only op a mode sees is ``aten.lift_fresh`` of the new cuda tensor (``$5: f32[] cuda:0 =
# aten.lift_fresh.default($5)``). Where torch cannot make a cuda tensor (a CPU-only build, a CUDA build without
# a GPU: ``FakeTensorMode.avoid_device_init``, which sets ``torch._C._only_lift_cpu_tensors``), it lifts the cpu
# tensor and copies it afterwards through the modes: ``lift_fresh`` on cpu, then ``_to_copy`` to cuda, one op,
# one small cpu tensor and one ``$N`` more per call. So while a fake record runs on fakeviz's shim, these three
# answer as on a GPU (:func:`lift_patch`, patch ``tensor-lift``): the cpu data made with every mode off, a fake
# tensor on the target device for it (the GPU's copy, made outside any op), ``aten.lift_fresh`` of that through
# the modes, and the data kept as its values (Note: [values under fake tensors]). Data that is not plain
# Python numbers, sequences of them or a numpy array (fake tensors, symbolic sizes in a list) is left to torch,
# and so is a call made while this mode is not the current fake mode; ``fidelity()["assumptions"]`` still names
# the lift + copy pairs that are left (``fakeviz._analysis.fidelity``).
_SCALARS = (bool, int, float, complex)
_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE
_PYTHON_KEY = torch._C.DispatchKey.Python


def _default_device() -> torch.device:
    """The device ``torch.tensor`` makes a tensor on when none is given: ``torch.get_default_device()`` without its
    index lookup, which makes a tensor (``torch.tensor([])``; a fake tensor's device fills the index in)."""
    for m in reversed(_function_modes()):
        if isinstance(m, _DeviceContext):
            return m.device
    ctx = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return torch.device("cpu") if ctx is None else ctx.device


def _plain(data: Any) -> bool:
    """Whether ``data`` is what ``torch.tensor`` makes a tensor of without reading a tensor: Python numbers,
    lists and tuples of them, numpy arrays and scalars of numbers."""
    if type(data) in _SCALARS:
        return True
    if type(data) in (list, tuple):
        return all(type(x) in _SCALARS or _plain(x) for x in data)
    np = sys.modules.get("numpy")
    return np is not None and isinstance(data, (np.ndarray, np.generic)) and data.dtype.kind in "biufc"


@contextlib.contextmanager
def lift_patch(mode: _FakeRecordingMode) -> Iterator[None]:
    """``torch.tensor``, ``torch.as_tensor`` and ``Tensor.new_tensor`` of data for a cuda device lift on that
    device while ``mode`` records (Note: [torch.tensor on fake cuda without a GPU]); restored on exit."""
    tensor = _patches.original(torch, "tensor")
    as_tensor = _patches.original(torch, "as_tensor")
    new_tensor = _patches.original(torch.Tensor, "new_tensor")

    def lifted(data: Any, dtype: Any, device: Any, requires_grad: bool) -> Any:
        """The tensor a GPU's torch would return, or None where torch's own path is to run."""
        if (
            not torch._C._only_lift_cpu_tensors()
            or torch._C._get_dispatch_mode(_FAKE_KEY) is not mode
            or torch._C._dispatch_tls_is_dispatch_key_excluded(_PYTHON_KEY)
            or not _plain(data)
        ):
            return None
        dev = _default_device() if device is None else torch.device(device)
        if dev.type != "cuda":
            return None
        with torch._C.DisableTorchFunction(), no_dispatch():
            real = tensor(data, dtype=dtype, device="cpu")
            meta = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="meta")
        with torch._C._AutoDispatchBelowADInplaceOrView():  # lift_fresh has no autograd kernel (as torch.tensor)
            out = torch.ops.aten.lift_fresh.default(_FakeTensor(mode, meta, dev))
        if real.numel() <= _values.VALUE_LIMIT and real.layout == torch.strided:
            mode._fv_values.give(out, real)
        if requires_grad:
            out.requires_grad_(True)
        return out

    def tensor_(data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False,
                pin_memory: bool = False) -> Any:  # fmt: skip
        out = None if pin_memory else lifted(data, dtype, device, requires_grad)
        if out is None:
            return tensor(data, dtype=dtype, device=device, requires_grad=requires_grad, pin_memory=pin_memory)
        return out

    def as_tensor_(data: Any, dtype: Any = None, device: Any = None) -> Any:
        out = lifted(data, dtype, device, False)
        return as_tensor(data, dtype=dtype, device=device) if out is None else out

    def new_tensor_(self: torch.Tensor, data: Any, *args: Any, **kwargs: Any) -> Any:
        out = None
        if not args and set(kwargs) <= {"dtype", "device", "requires_grad"}:
            dtype, device = kwargs.get("dtype"), kwargs.get("device")
            out = lifted(data, self.dtype if dtype is None else dtype, self.device if device is None else device,
                         bool(kwargs.get("requires_grad", False)))  # fmt: skip
        return new_tensor(self, data, *args, **kwargs) if out is None else out

    functools.update_wrapper(tensor_, tensor)
    functools.update_wrapper(as_tensor_, as_tensor)
    functools.update_wrapper(new_tensor_, new_tensor)
    _device_constructors()  # torch.device(...)'s set of constructors (cached once): torch's, never these
    tokens = [_patches.push(owner, name, fn, entry="tensor-lift") for owner, name, fn in
              ((torch, "tensor", tensor_), (torch, "as_tensor", as_tensor_), (torch.Tensor, "new_tensor", new_tensor_))]  # fmt: skip
    try:
        yield
    finally:
        for token in tokens:
            _patches.pop(token)
