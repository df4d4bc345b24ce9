"""The recorder: one event per dispatched aten op, on fake or real tensors.

Note: [recorder fused into the fake mode]
A TorchDispatchMode stacked on top of FakeTensorMode is re-entered for every
dispatch, including the ``prim.device`` queries that fake tensors answer in
Python (about 2/3 of all dispatches in a Llama fwd+bwd). A pass-through mode
alone cost about 10 % of the bare fake run (measured: 4.35 s vs 3.93 s). For
fake runs the recorder is therefore fused into a FakeTensorMode subclass: one
``__torch_dispatch__`` that returns at once for ``prim.*`` ops and otherwise
records after the fake kernel ran. For real runs (``fake=False``) the same
recording core sits in a plain private TorchDispatchMode.

Note: [outermost dispatch only]
FakeTensorMode runs some ops through Python decompositions that re-enter the
mode. Only the outermost dispatch of each thread is recorded, so a fake run
logs exactly the ops a real run logs.

Known limitations
-----------------
* ``prim.*`` ops are never recorded (they are bookkeeping, not user ops).
* Storages are identified on first sight; a storage that no recorded op ever
  produced or consumed (e.g. a kernel's internal workspace) is invisible.
* A storage resized in place (``resize_``, ``set_``) keeps the largest size seen.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import math
import os
import sys
import sysconfig
import threading
import types
import weakref
from types import CodeType
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorConfig as _FakeTensorConfig
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from .._core import schema as _schema
from .._core.errors import DataDependentError, FakeVizError, RecordError
from .._core.record import Record
from . import cuda_shim as _cuda_shim
from . import native as _native
from .flops import op_flops as _op_flops
from .session import check_device, new_fake_mode, session_patches
from .._core.schema import (
    FLAG_DATA_DEPENDENT,
    FLAG_INPLACE,
    FLAG_VIEW,
    PHASES,
    ROLE_BUFFER,
    ROLE_GRAD,
    ROLE_INPUT,
    ROLE_OPT,
    ROLE_PARAM,
    ROLE_SAVED,
    TID_BITS,
)

__all__ = ["FakeSession", "Recording", "record"]

P_INIT, P_FORWARD, P_BACKWARD, P_OPTIMIZER, P_OTHER = range(len(PHASES))

_Tensor = torch.Tensor
_graph_task_id = torch._C._current_graph_task_id
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FAKEVIZ_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # the fakeviz package, every layer
_STDLIB_DIRS = tuple(
    {os.path.realpath(p) + os.sep for p in (sysconfig.get_paths()["stdlib"], os.path.dirname(os.__file__))}
)

try:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
except ImportError:  # pragma: no cover - older torch
    GuardOnDataDependentSymNode = ()  # type: ignore[assignment,misc]

_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)


# Note: [code objects by id]
# A code object's hash is not cached: it rehashes its name, bytecode and constants
# on every lookup (about 1 us for a transformers forward), and finding the user's
# line looks up several per op. The caches are keyed by id(code) instead, and every
# code object entered is kept alive in _CODES so its id is never reused.
_INTERNAL_CODE: dict[tuple[str, ...], dict[int, bool]] = {}
_CODES: list[CodeType] = []
_SIMPLE = (int, bool, str, type(None))


def _fmt_arg(a: Any) -> str:
    """Compact text of a non-tensor op argument (braces escaped for str.format)."""
    ta = type(a)
    if ta in _SIMPLE:
        return repr(a).replace("{", "{{").replace("}", "}}") if ta is str else repr(a)
    if ta is list or ta is tuple:
        if not a:
            return "[]"
        if type(a[0]) is int and all(type(x) is int for x in a):
            return "[" + ", ".join(map(str, a)) + "]"
        return "[" + ", ".join(_fmt_arg(x) for x in a) + "]"
    if ta is float:
        return repr(a)
    if ta is torch.device or ta is torch.dtype or ta is torch.memory_format or ta is torch.layout:
        return str(a)
    return str(a).replace("{", "{{").replace("}", "}}")


def _key_safe(a: Any) -> bool:
    """Whether ``_fmt_arg(a)`` is a function of FakeTensorMode's cache key entry for ``a``
    (``type(a), a``): not for 0.0 (equal to -0.0) or NaN (never equal). See Note: [recorded op cache]."""
    ta = type(a)
    if ta is float:
        return a != 0.0 and a == a
    if ta is list or ta is tuple:
        return all(_key_safe(x) for x in a)
    return True


def _template(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> tuple[str, bool, tuple[tuple[int, bool], ...] | None]:
    """The argument text of an op, ``{}`` for each tensor (in the order the recorder takes
    their ids), whether it is a function of FakeTensorMode's cache key (``_key_safe``) once
    the signs of the zeros in ``zeros`` are known, and ``zeros``: (position, negative) of
    every positional argument that is a float zero, or None. ``normal_(w, 0.0, std)`` in
    every layer's init shares one cache entry with ``normal_(w, -0.0, std)``: a cached
    template is reused only for the same signs (Note: [recorded op cache])."""
    parts = []
    safe = True
    zeros = None
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            parts.append("{}")
        elif type(a) is list and a and isinstance(a[0], _Tensor):
            parts.append("[" + ", ".join("{}" if isinstance(x, _Tensor) else _fmt_arg(x) for x in a) + "]")
        elif type(a) is float and a == 0.0:
            parts.append(repr(a))
            zeros = (*(zeros or ()), (i, math.copysign(1.0, a) < 0))
        else:
            parts.append(_fmt_arg(a))
            safe = safe and _key_safe(a)
    if kwargs:
        for k, v in kwargs.items():
            if isinstance(v, _Tensor):
                parts.append(k + "={}")
            else:
                parts.append(k + "=" + _fmt_arg(v))
                safe = safe and _key_safe(v)
    return ", ".join(parts), safe, zeros


_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default


def _own_key(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """A recorded-op-cache key for ``aten._unsafe_view(t, size)``, which FakeTensorMode never
    caches ("unsafe view") although its output metadata is a function of ``size`` and the
    metadata of ``t`` (Note: [recorded op cache]); about 10 per transformer layer."""
    if kwargs or len(args) != 2 or type(args[0]) is not _FakeTensor or type(args[1]) is not list:
        return None
    t, size = args
    if not all(type(x) is int for x in size):
        return None
    try:
        key = (tuple(size), t.shape, t.stride(), t.dtype, t.device, t.storage_offset())
        hash(key)
    except TypeError:  # symbolic sizes
        return None
    return key


def _same_zeros(args: tuple[Any, ...], zeros: tuple[tuple[int, bool], ...] | None) -> bool:
    """Whether the float zeros of ``args`` have the signs a cached template was made for."""
    if zeros is None:
        return True
    for i, neg in zeros:
        a = args[i] if i < len(args) else None
        if type(a) is not float or a != 0.0 or (math.copysign(1.0, a) < 0) != neg:
            return False
    return True


_get_sequence_nr = torch._C._autograd._get_sequence_nr
_get_ident = threading.get_ident
_current_node = torch._C._current_autograd_node
_N_OP = len(_schema.OP_COLS)
_PROGRESS_EVERY = 1024 * _N_OP  # opd grows by _N_OP per op: report every 1024 ops
_N_ST = len(_schema.ST_COLS)
_N_OUT = len(_schema.OUT_COLS)
_ST_FREE = tuple(_schema.ST_COLS).index("st_free")
_ST_ROLES = tuple(_schema.ST_COLS).index("st_roles")
_ST_NAME = tuple(_schema.ST_COLS).index("st_name")
_ST_OWNER = tuple(_schema.ST_COLS).index("st_owner")
_OP_IN_END = tuple(_schema.OP_COLS).index("in_end")
_OP_OUT_END = tuple(_schema.OP_COLS).index("out_end")
_P_GRAD = tuple(_schema.P_COLS).index("p_grad")
_P_TENSOR = tuple(_schema.P_COLS).index("p_tensor")


class _StorageRef(weakref.ref):
    """Weak reference to a live storage that knows its StorageImpl address and storage id
    (cheaper than a closure per storage, and one GC-tracked object instead of a closure,
    its cells and a tuple)."""

    __slots__ = ("key", "sid")


_SERIAL = itertools.count(1)  # Note: [tensor tags]


class _DeviceRangeError(FakeVizError, ValueError):
    """A fake cuda device index beyond what the shim provides (cuda:0 .. cuda:63)."""


_DETACH = torch.ops.aten.detach.default
_LIFT_FRESH = torch.ops.aten.lift_fresh.default
_PARAM_NEW = torch.nn.Parameter.__new__.__code__


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
        # in_kernel_invocation_manager(fmode), inlined: the generator-based context
        # manager alone cost about 3 us, more than the meta kernel it wraps
        prev = fmode.in_kernel_invocation
        if _meta_in_tls() != prev:
            return None  # an unexpected dispatch state: the mode's own path says what it makes of it
        with _DisableTorchDispatch():
            fmode.in_kernel_invocation = True
            with _PreserveDispatchKeyGuard():
                _set_meta_in_tls(True)
                try:
                    meta = _DETACH_OP(t)
                finally:
                    fmode.in_kernel_invocation = prev
        return _wrap_fake(fmode, meta, device)
    except Exception:  # noqa: BLE001 - fall back to the ordinary path
        return None


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


def _called_from_parameter_new() -> bool:
    # Note: [Parameter detach]
    # nn.Parameter(t) on a tensor *subclass* (a FakeTensor) runs t.detach() in
    # Python, while on a plain tensor it aliases in C++ without dispatching.
    # That detach is bookkeeping of the fake path: it is not recorded, so fake
    # and real runs log the same ops (the Parameter gets its id when first used).
    f = sys._getframe(3)
    for _ in range(8):
        if f is None:
            return False
        if f.f_code is _PARAM_NEW:
            return True
        f = f.f_back
    return False


def _no_torch_function(fn: Any) -> Any:
    """Run a recorder hook with torch function handling off (Note: [torch function off while
    recording] in ``csrc/fvcore.c``): inside ``torch.device(...)`` every tensor method the hook
    calls would otherwise go through the mode's Python ``__torch_function__``."""

    @functools.wraps(fn)
    def hook(*args: Any, **kwargs: Any) -> Any:
        with _DisableTorchFunction():
            return fn(*args, **kwargs)

    return hook


_DisableTorchFunction = torch._C.DisableTorchFunction


class _State:
    """Recording state shared by the fused fake mode and the real-run mode."""

    def __init__(self, trace: Record, *, exclude: tuple[str, ...] = ()) -> None:
        self.trace = trace
        b = trace.builder
        assert b is not None
        self.b = b
        # Note: [tensor tags]
        # A tensor's id is kept in its __dict__ as one int, base + id, where base is
        # unique to this recording (ids of another recording fall outside [base, top)).
        # An int is not tracked by the cyclic GC, where a (token, id) tuple was: one
        # GC-tracked object less per tensor.
        self.tbase = next(_SERIAL) << TID_BITS
        self.ttop = self.tbase + (1 << TID_BITS)
        self.active = True
        self.local = threading.local()
        # interning caches
        self.op_info: dict[Any, tuple[int, int]] = {}
        # code object -> "is torch/fakeviz/stdlib/excluded", shared by every recording with the same prefixes
        self.internal_code: dict[int, bool] = _INTERNAL_CODE.setdefault(exclude, {})  # Note: [code objects by id]
        self.line_ids: dict[tuple[int, int], int] = {}
        self.prefixes = (_TORCH_DIR, _FAKEVIZ_DIR, "<frozen ", *exclude)
        self.t_shapes = b.tables["shapes"]
        self.t_strides = b.tables["strides"]
        self.t_dtypes = b.tables["dtypes"]
        self.t_devices = b.tables["devices"]
        self.t_args = b.tables["args"]
        self.meta_ids: dict[tuple[Any, ...], tuple[int, int, int, int]] = {}
        self.fast: dict[Any, tuple[Any, ...]] = {}  # Note: [recorded op cache]
        self.live: dict[int, _StorageRef] = {}  # StorageImpl address -> its weakref (which has the id)
        self.on_free = self._on_free  # one bound method for every storage's weakref callback
        self.next_tensor = 0
        # phase and module state
        self.fw_stack: list[int] = []
        # Note: [user line inside built-in modules]
        # For a module whose forward is torch's own code (nn.Linear, nn.LayerNorm, ...)
        # every op it issues has, as first frame outside torch, the line that
        # called the module: it is found once in the pre-hook and kept here
        # (-2 marks a module with user-code forward, whose ops walk the frames).
        self.fw_lines: list[int] = []
        self.internal_cls: dict[type, bool] = {}
        self.in_optimizer = 0
        self.seen_forward = False
        self.mod_names: dict[int, int] = {}  # id(module) -> module string id
        self.mod_refs: dict[int, Any] = {}  # id(module) -> weakref (ids can be reused)
        # Note: [backward module attribution]
        # Every autograd node takes the next autograd sequence number when its
        # forward op runs. Module hooks append (sequence number, module) marks
        # as the forward module stack changes; a backward op looks up the
        # sequence number of the node being executed and finds the forward
        # module that was current when that node was made. No grad hooks needed.
        self.sn_marks: list[int] = []
        self.sn_mods: list[int] = []
        self.sn_cache: dict[int, int] = {}
        self.bw_line = -1
        self.error_seen: set[int] = set()
        self.progress: Any = None  # callable(n_ops, phase, module) every 1024 ops
        self.roots: dict[int, Any] = {}  # id -> weakref of named root modules
        self.built: dict[int, Any] = {}  # id -> weakref of modules built in the block
        self.optimizers: dict[int, Any] = {}  # id -> weakref of optimizers that stepped
        self.bw_leaves: list[Any] = []
        self.p_rows: dict[int, tuple[int, ...]] = {}  # name id -> parameter table row
        self.grad_of: dict[int, int] = {}  # parameter tensor id -> storage id of its last .grad
        self.unpacked: dict[int, Any] = {}  # thread ident -> tensor; Note: [unpack detach]
        self.core = None
        mod = _native.core()
        if mod is not None:  # Note: [recorder core in C]
            try:
                self.core = self._make_core(mod)
            except Exception as exc:  # noqa: BLE001 - a core that does not fit this build: record in Python
                trace.meta["recorder_core_error"] = f"{type(exc).__name__}: {exc}"[:500]
        if self.core is not None:
            self.record = self.core.record  # type: ignore[method-assign]
            self.pack_saved = self.core.pack_saved  # type: ignore[method-assign]
            self.on_free = self.core.on_free
            self.run_op = self.core.run_op  # type: ignore[method-assign]

    def _make_core(self, mod: Any) -> Any:
        """The C core (Note: [recorder core in C]) over this state's containers and trace arrays."""
        b = self.b
        return mod.Core(
            # the state and the containers it shares with the core (mutated in place, never rebound)
            state=self, live=self.live, fast=self.fast, fw_stack=self.fw_stack, fw_lines=self.fw_lines,
            unpacked=self.unpacked, internal_code=self.internal_code, line_ids=self.line_ids,
            sn_cache=self.sn_cache, meta_ids=self.meta_ids, local=self.local,
            opd=b.opd, outd=b.outd, in_tensor=b.in_tensor, std=b.std,
            # trace layout
            tbase=self.tbase, ttop=self.ttop, n_op=_N_OP, n_out=_N_OUT, n_st=_N_ST, st_roles=_ST_ROLES,
            st_free=_ST_FREE, progress_every=_PROGRESS_EVERY, role_saved=ROLE_SAVED,
            # Python types, ops and functions it compares with or calls
            tensor_type=_Tensor, fake_type=_FakeTensor, storage_ref=_StorageRef, range_error=_DeviceRangeError,
            detach=_DETACH, lift_fresh=_LIFT_FRESH, unsafe_view=_UNSAFE_VIEW, param_new_code=_PARAM_NEW,
            graph_task_id=_graph_task_id, current_node=_current_node, get_sequence_nr=_get_sequence_nr,
            fake_dispatch=_fake_dispatch, output_from_cache_entry=_fake_output_from_entry,
            make_cache_entry=_fake_make_entry, wrap_fake=_wrap_fake,
            meta_in_tls=_meta_in_tls, set_meta_in_tls=_set_meta_in_tls, disable_torch_dispatch=_DisableTorchDispatch,
            preserve_dispatch_keys=_PreserveDispatchKeyGuard, detach_op=_DETACH_OP,
            make_subclass=_Tensor._make_subclass, fake_config=_FakeTensorConfig,
            warn_mutable_data_ptr=_warn_mutable_data_ptr, throw_mutable_data_ptr=_throw_mutable_data_ptr,
            disable_tf=_DisableTorchFunction, torch_function_mode_enabled=torch._C._is_torch_function_mode_enabled,
        )  # fmt: skip

    # ------------------------------------------------------------- interning
    def _op(self, func: Any) -> tuple[int, int]:
        info = self.op_info.get(func)
        if info is None:
            name = str(func)  # "aten.mm.default"
            flags = 0
            schema = func._schema
            if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
                flags |= FLAG_VIEW
            if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
                flags |= FLAG_INPLACE
            info = (self.b.tables["ops"].add(name, name), flags)
            self.op_info[func] = info
        return info

    def _is_internal(self, code: CodeType) -> bool:
        v = self.internal_code.get(id(code))
        if v is None:
            fn = code.co_filename
            real = os.path.realpath(fn) if not fn.startswith("<") else fn
            v = fn.startswith(self.prefixes) or real.startswith(self.prefixes)
            if not v and real.startswith(_STDLIB_DIRS):
                # the standard library (contextlib, functools, ...) is not user code,
                # but third-party packages installed below it are
                v = "site-packages" not in real and "dist-packages" not in real
            _CODES.append(code)  # Note: [code objects by id]
            self.internal_code[id(code)] = v
        return v

    def user_line(self, depth: int = 2) -> int:
        try:
            f = sys._getframe(depth)
        except ValueError:
            return -1
        internal = self.internal_code
        while f is not None:
            c = f.f_code
            v = internal.get(id(c))
            if v is None:
                v = self._is_internal(c)
            if not v:
                i = self.line_ids.get((id(c), f.f_lineno))
                return i if i is not None else self._line_id(c, f.f_lineno)
            f = f.f_back
        return -1

    def _line_id(self, code: CodeType, lineno: int) -> int:
        key = (id(code), lineno)
        i = self.line_ids.get(key)
        if i is None:
            text = f"{code.co_filename}:{lineno} in {code.co_name}"
            i = self.line_ids[key] = self.b.tables["lines"].add(text, text)
        return i

    # ---------------------------------------------------------------- tensors
    def tensor_id(self, t: Any) -> int:
        """The ``$N`` id of a tensor; unseen tensors are registered as inputs."""
        d = t.__dict__
        tag = d.get("_fakeviz_tid")
        base = self.tbase
        if tag is not None and base <= tag < self.ttop:
            return tag - base
        tid = self.next_tensor
        self.next_tensor = tid + 1
        d["_fakeviz_tid"] = base + tid
        roles = ROLE_PARAM if isinstance(t, torch.nn.Parameter) or d.get("_is_param") else 0
        self.b.td.extend((tid, self.storage_id(t, -1, roles)))
        return tid

    def storage_id(self, t: Any, seq: int, roles: int = 0) -> int:
        try:
            st = t.untyped_storage()
        except (NotImplementedError, RuntimeError):  # sparse, nested, functional wrappers
            return -1
        key = st._cdata
        hit = self.live.get(key)
        if hit is not None:
            if roles:
                self.b.std[hit.sid * _N_ST + _ST_ROLES] |= roles
            return hit.sid
        dev = t.device
        devid = self.t_devices.ids.get(dev)
        if devid is None:
            devid = self.t_devices.add(dev, str(dev))
        return self._new_storage(st, key, devid, seq, roles)

    def add_roles(self, t: Any, roles: int, owner: int = -1) -> int:
        """Mark the storage of ``t`` with ROLE_* bits (registering it if unseen)."""
        sid = self.storage_id(t, -1, roles)
        if sid >= 0 and owner >= 0:
            self.b.std[sid * _N_ST + _ST_OWNER] = owner
        return sid

    def _new_storage(self, st: Any, key: int, devid: int, seq: int, roles: int) -> int:
        b = self.b
        std = b.std
        sid = len(std) // _N_ST
        try:
            nb = st.nbytes()
            nb = nb if type(nb) is int else -1
        except Exception:  # noqa: BLE001 - unbacked symbolic size
            nb = -1
        std.extend((devid, nb, seq, -1, roles, -1, -1))
        self._watch(st, key, sid)
        return sid

    def _watch(self, st: Any, key: int, sid: int) -> None:
        """Make storage ``st`` (StorageImpl address ``key``) live as ``sid``; record its free."""
        ref = _StorageRef(st, self.on_free)
        ref.key = key
        ref.sid = sid
        self.live[key] = ref

    def _on_free(self, ref: _StorageRef) -> None:
        sid = ref.sid
        b = self.b
        b.std[sid * _N_ST + _ST_FREE] = len(b.opd) // _N_OP
        live = self.live
        if live.get(ref.key) is ref:
            del live[ref.key]

    # ------------------------------------------------------------------ ops
    def record(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any, entry: Any = None
    ) -> None:
        """Append one op (and its outputs) to the trace.

        Note: [recorded op cache]
        ``entry`` is FakeTensorMode's own dispatch-cache entry for this op, when the mode
        found or made one (see ``_FakeRecordingMode._fv_entry``). Its key is the op, every
        non-tensor argument with its type, and the metadata of every input tensor.
        Everything the recorder derives from the arguments and the output *metadata* (op
        id and flags, argument template, FLOPs, interned shape/stride/dtype/device ids,
        storage offset and nbytes of each output) is a function of that key, so it is
        computed once per entry and reused (``self.fast``, keyed by the entry's identity:
        the key's own ``__eq__`` compares long tuples in Python). What depends on tensor
        *identity* (input and output tensor ids, output storages) and on where the op runs
        (phase, module, line) is taken for every op.
        """
        if func is _DETACH:
            # Note: [unpack detach]
            # When autograd unpacks a saved tensor that has a grad_fn (or requires grad), it
            # wraps what the unpack hook returned in a new tensor: for a tensor with a Python
            # dispatch key that is a detach dispatched from C++ (make_variable ->
            # shallow_copy_and_detach), right after the hook returned, in the same thread.
            # It is autograd's bookkeeping, made for every saved tensor only because the
            # recorder's hooks exist (without hooks, saved inputs are handed back as they
            # are), so it is not recorded in fake or real runs: the result takes the saved
            # tensor's id, and backward ops name the forward tensor they read.
            # ``self.unpacked`` holds, per thread, the tensor the hook returned until that
            # thread's next recorded op (or the end of backward): frees are counted in ops, so
            # holding it that long never moves a storage's free; compared by identity, so
            # never a wrong match.
            u = self.unpacked.pop(_get_ident(), None) if self.unpacked else None
            if u is not None and args and args[0] is u:
                tag = u.__dict__.get("_fakeviz_tid")
                if tag is not None and isinstance(out, _Tensor):
                    out.__dict__["_fakeviz_tid"] = tag
                return
            if _called_from_parameter_new():
                return  # Note: [Parameter detach]
        elif self.unpacked:
            self.unpacked.pop(_get_ident(), None)
        if func is _LIFT_FRESH and args and isinstance(args[0], _Tensor):
            # torch.tensor(data) made its tensor just now, without a dispatch: it is born here
            self.storage_id(args[0], len(self.b.opd) // _N_OP)
            if out is not args[0] and isinstance(out, _Tensor):
                self._alias_lifted(args[0], out)
        b = self.b
        # phase, module, user line
        if self.in_optimizer:
            phase = P_OPTIMIZER
            module = -1
            line = self.user_line(2)
        elif _graph_task_id() >= 0:
            phase = P_BACKWARD
            line = self.bw_line
            if self.fw_stack:  # recomputation (activation checkpointing) inside backward
                module = self.fw_stack[-1]
            else:
                module = self._bw_module()
        elif self.fw_stack:
            phase = P_FORWARD
            module = self.fw_stack[-1]
            line = self.fw_lines[-1]
            if line == -2:  # the module's own forward is user code: walk the frames
                line = self.user_line(2)
        else:
            phase = P_OTHER if self.seen_forward else P_INIT
            module = -1
            line = self.user_line(2)
        # inputs -> tensor ids
        in_ids = b.in_tensor
        base, top = self.tbase, self.ttop
        for a in args:
            if isinstance(a, _Tensor):
                tag = a.__dict__.get("_fakeviz_tid")
                in_ids.append(tag - base if tag is not None and base <= tag < top else self.tensor_id(a))
            elif type(a) is list and a and isinstance(a[0], _Tensor):
                for x in a:
                    if isinstance(x, _Tensor):
                        in_ids.append(self.tensor_id(x))
        if kwargs:
            for v in kwargs.values():
                if isinstance(v, _Tensor):
                    in_ids.append(self.tensor_id(v))
        if entry is None and func is _DETACH and type(out) is _FakeTensor and len(args) == 1 and not kwargs:
            # no cache entry (Note: [fast fake detach]), but everything but the output's metadata is
            # the same for every plain detach: cache that much under the op itself
            entry = _DETACH
        elif entry is None and func is _UNSAFE_VIEW:
            entry = _own_key(args, kwargs)
        if type(entry) is tuple:  # a key of our own (value equality), see _own_key
            hit = self.fast.get(entry)
        else:
            hit = self.fast.get(id(entry)) if entry is not None else None
        if hit is not None and (hit[0] is entry or type(entry) is tuple) and _same_zeros(args, hit[6]):
            _, op_id, flags, aid, flops, metas, _ = hit
            if metas is None:  # a detach: its output's metadata is looked up as usual
                flags |= self._output(out)
            else:
                for o, m in zip((out,) if isinstance(out, _Tensor) else out, metas):  # noqa: B905 - same key, same outputs
                    self._output(o, m)
        else:
            op_id, flags, aid, flops = self._record_full(func, args, kwargs, out, entry)
        b.opd.extend((op_id, phase, module, line, aid, len(in_ids), len(b.outd) // _N_OUT, flags, flops))
        if self.progress is not None and not len(b.opd) % _PROGRESS_EVERY:
            self._report_progress(phase, module)

    _py_record = record  # the C core calls it for the paths it leaves to Python

    def _record_full(self, func: Any, args: Any, kwargs: Any, out: Any, entry: Any) -> tuple[int, int, int, int]:
        """Op id, flags, argument template id and FLOPs of an op the recorded op cache has not
        seen (its outputs are appended on the way); cache them under ``entry`` if it may."""
        info = self.op_info.get(func)
        if info is None:
            info = self._op(func)
        op_id, flags = info
        tmpl, cacheable, zeros = _template(args, kwargs)
        cacheable = cacheable and entry is not None
        t_args = self.t_args
        aid = t_args.ids.get(tmpl)
        if aid is None:
            aid = t_args.add(tmpl, tmpl)
        # outputs
        b = self.b
        out_start = len(b.outd)
        if isinstance(out, _Tensor):
            flags |= self._output(out)
        elif isinstance(out, (tuple, list)):  # also namedtuples (return_types.*)
            cacheable = cacheable and (type(out) is tuple or type(out) is list)
            for o in out:
                if isinstance(o, _Tensor):
                    flags |= self._output(o)
                else:
                    cacheable = False
                    if isinstance(o, (tuple, list)):
                        for p in o:
                            if isinstance(p, _Tensor):
                                flags |= self._output(p)
        else:
            cacheable = False
        try:
            flops = _op_flops(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - a formula failing on odd arguments: no figure, not a lost op
            flops = -1
        if cacheable and entry is _DETACH:
            self.fast[id(entry)] = (entry, op_id, flags & ~FLAG_DATA_DEPENDENT, aid, flops, None, zeros)
        elif cacheable and not flags & FLAG_DATA_DEPENDENT:
            rows = b.outd[out_start:]
            metas = tuple(
                (rows[i + 1], rows[i + 2], rows[i + 3], rows[i + 4], rows[i + 6], rows[i + 7])
                for i in range(0, len(rows), _N_OUT)
            )
            self.fast[entry if type(entry) is tuple else id(entry)] = (entry, op_id, flags, aid, flops, metas, zeros)
        return op_id, flags, aid, flops

    def _report_progress(self, phase: int, module: int) -> None:
        try:
            mods = self.b.tables["modules"].strings
            self.progress(self.b.num_ops(), PHASES[phase], mods[module] if module >= 0 else None)
        except Exception:  # noqa: BLE001 - a progress display must never break the run
            self.progress = None

    def _alias_lifted(self, src: Any, out: Any) -> None:
        """Note: [lift_fresh]
        A real ``aten.lift_fresh`` (``torch.tensor(...)``) returns its input; the fake
        one returns a new FakeTensor over a new storage. Give the fake output the
        input's tensor id and move the input's storage entry onto the output's
        storage, so fake and real runs see one tensor and one storage."""
        tid = self.tensor_id(src)
        out.__dict__["_fakeviz_tid"] = self.tbase + tid
        try:
            st_in = src.untyped_storage()
            st_out = out.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return
        hit = self.live.pop(st_in._cdata, None)
        if hit is not None:
            self._watch(st_out, st_out._cdata, hit.sid)

    def _bw_module(self) -> int:
        node = _current_node()
        if node is None:
            return -1
        sn = node._sequence_nr()
        mod = self.sn_cache.get(sn)
        if mod is None:
            i = bisect.bisect_right(self.sn_marks, sn) - 1
            mod = self.sn_mods[i] if i >= 0 else -1
            self.sn_cache[sn] = mod
        return mod

    def _meta_ids(self, shape: Any, stride: Any, dt: Any, dev: Any) -> tuple[int, int, int, int]:
        if dev.type == "cuda" and dev.index is not None and dev not in self.t_devices.ids:
            try:
                check_device(dev)  # cuda index past the fake device count: say so at creation
            except ValueError as exc:
                raise _DeviceRangeError(str(exc)) from None
        try:
            key = (shape, stride, dt, dev)
            hash(key)
        except TypeError:
            key = None
        shape_s = ", ".join(str(x) for x in shape)
        stride_s = ", ".join(str(x) for x in stride)
        ids = (
            self.t_shapes.add(shape_s, shape_s),
            self.t_strides.add(stride_s, stride_s),
            self.t_dtypes.add(dt, str(dt)),
            self.t_devices.add(dev, str(dev)),
        )
        if key is not None:
            self.meta_ids[key] = ids
        return ids

    def _output(self, t: Any, m: tuple[int, ...] | None = None) -> int:
        """Append output ``t``'s row; ``m`` is its cached metadata (Note: [recorded op cache]):
        interned shape, stride, dtype and device ids, storage offset and nbytes."""
        d = t.__dict__
        tag = d.get("_fakeviz_tid")
        base = self.tbase
        if tag is not None and base <= tag < self.ttop:
            tid = tag - base  # in-place op returning its input
        else:
            tid = self.next_tensor
            self.next_tensor = tid + 1
            d["_fakeviz_tid"] = base + tid
        flag = 0
        if m is not None:
            sid, stid, dtid, devid, off, nb = m
        else:
            shape = t.shape
            stride = t.stride()
            dt = t.dtype
            dev = t.device
            try:
                ids = self.meta_ids.get((shape, stride, dt, dev))
                symbolic = False
            except TypeError:  # symbolic sizes are unhashable
                ids = None
                symbolic = True
            if ids is None:
                ids = self._meta_ids(shape, stride, dt, dev)
            sid, stid, dtid, devid = ids
            if symbolic:
                nb = -1
                flag = FLAG_DATA_DEPENDENT
                off = t.storage_offset()
                off = off if type(off) is int else -1
            else:
                nb = t.nbytes
                off = t.storage_offset()
        try:
            st = t.untyped_storage()
            key = st._cdata
            hit = self.live.get(key)
            stor = hit.sid if hit is not None else self._new_storage(st, key, devid, len(self.b.opd) // _N_OP, 0)
        except (NotImplementedError, RuntimeError):
            stor = -1
        self.b.outd.extend((tid, sid, stid, dtid, devid, stor, off, nb))
        return flag

    # ------------------------------------------------------------- dispatch
    def run_op(self, impl: Any, mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """Run one op through ``impl`` and record it if it is an outermost dispatch.

        See Note: [outermost dispatch only]. Errors become clear errors (``on_error``);
        a failure of the recorder itself never breaks the user's run (``internal_error``).
        """
        loc = self.local
        depth = loc.__dict__.get("depth", 0)
        loc.depth = depth + 1
        if not depth:
            loc.entry = None  # set by _FakeRecordingMode._fv_entry
        try:
            out = impl(mode, func, types, args, kwargs)
        except Exception as exc:
            if depth == 0:
                new = self.on_error(func, exc)
                if new is not exc:
                    raise new from exc
            raise
        finally:
            loc.depth = depth
        if depth == 0:
            try:
                entry = loc.entry
                self.record(func, args, kwargs, out, entry[1] if entry is not None and entry[0] is func else None)
            except _DeviceRangeError as exc:
                raise self.on_error(func, exc) from None  # bad input: name the op, module, line
            except Exception as exc:  # noqa: BLE001 - a recorder bug must never break the user's run
                self.internal_error(func, exc)
        return out

    def _op_failed(self, func: Any, exc: BaseException) -> None:
        """The C core's run_op: the outermost op ``func`` raised ``exc``."""
        new = self.on_error(func, exc)
        if new is not exc:
            raise new from exc
        raise exc

    def _range_failed(self, func: Any, exc: BaseException) -> None:
        """The C core's run_op: recording ``func`` found a cuda index past the fake devices."""
        raise self.on_error(func, exc) from None

    # --------------------------------------------------------------- errors
    def internal_error(self, func: Any, exc: BaseException) -> None:
        """The recorder itself failed on an op: keep a bare row so seq numbers stay aligned."""
        b = self.b
        # drop partial input/output rows of the failed op
        last_in, last_out = (b.opd[_OP_IN_END - _N_OP], b.opd[_OP_OUT_END - _N_OP]) if len(b.opd) else (0, 0)
        del b.in_tensor[last_in:]
        del b.outd[last_out * _N_OUT :]
        op_id = self._op(func)[0]
        not_rec = self.t_args.add("<not recorded>", "<not recorded>")
        b.opd.extend((op_id, P_OTHER, -1, -1, not_rec, last_in, last_out, 0, -1))
        meta = self.trace.meta
        meta["recorder_errors"] = meta.get("recorder_errors", 0) + 1
        meta.setdefault("first_recorder_error", f"{func}: {type(exc).__name__}: {exc}"[:1000])

    def on_error(self, func: Any, exc: BaseException) -> BaseException:
        """Turn an op failure into a clear error; record where it happened."""
        if id(exc) in self.error_seen:
            return exc
        self.error_seen.add(id(exc))
        op = str(func)
        phase = self._phase_name()
        if phase == "backward" and not self.fw_stack:
            mod_id = self._bw_module()
        else:
            mod_id = self.fw_stack[-1] if self.fw_stack else -1
        modules = self.b.tables["modules"].strings
        module = modules[mod_id] if mod_id >= 0 else None
        line_id = self.bw_line if phase == "backward" else self.user_line(2)
        line = self.b.tables["lines"].strings[line_id] if line_id >= 0 else None
        where = f"op {op} (phase {phase}, module {module or '<top level>'}, at {line or '<unknown line>'})"
        self.trace.error = {
            "op": op, "module": module, "user_line": line, "phase": phase, "seq": self.b.num_ops(),
            "type": type(exc).__name__, "message": str(exc)[:2000],
        }  # fmt: skip
        if isinstance(exc, _DATA_DEPENDENT):
            src = _source_text(line)
            first = str(exc).splitlines()[0] if str(exc) else ""
            msg = (
                f"{where} needs the value of a tensor, but fake tensors carry no data.\n"
                + (f"    {src}\n" if src else "")
                + "This comes from `.item()`, `int(t)`, `bool(t)`, `if t:` / `if t.sum() > 0:` on a tensor, "
                "or an op whose output size depends on the values (nonzero, masked_select, unique).\n"
                "What to do: pass the value in as a Python number or compute it outside the model; for ops "
                "whose output *size* depends on data, record with `symbolic=True` so the size becomes a "
                "symbol; move data-dependent checks out of the recorded region.\n"
                "The partial trace up to this op is on this exception as `.trace`. "
                f"(torch said: {type(exc).__name__}: {first})"
            )
            err = DataDependentError(msg, op=op, module=module, user_line=line)
            self.error_seen.add(id(err))
            return err
        try:
            exc.add_note(f"fakeviz: raised by {where}")
        except Exception:  # noqa: BLE001 - add_note unsupported on exotic exceptions
            pass
        return exc

    def _phase_name(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        if _graph_task_id() >= 0:
            return "backward"
        if self.fw_stack:
            return "forward"
        return "other" if self.seen_forward else "init"

    # -------------------------------------------------------------- modules
    @_no_torch_function
    def module_id(self, mod: torch.nn.Module) -> int:
        key = id(mod)
        mid = self.mod_names.get(key)
        if mid is not None and self.mod_refs[key]() is mod:
            return mid
        # a new root: name it and every submodule, register its parameters and buffers
        root = type(mod).__name__
        table = self.b.tables["modules"]
        classes = self.b.tables["classes"]
        mod_class = self.b.mod_class
        for name, sub in mod.named_modules(remove_duplicate=False):
            k = id(sub)
            if k in self.mod_names and self.mod_refs[k]() is sub:
                continue
            path = f"{root}.{name}" if name else root
            mid = self.mod_names[k] = table.add(path, path)
            if mid == len(mod_class):
                cls = type(sub)
                mod_class.append(classes.add(cls, cls.__qualname__))
            self.mod_refs[k] = weakref.ref(sub)
        self.roots[key] = weakref.ref(mod)
        self.register_module(mod, root)
        self.param_rows(key, mod)
        return self.mod_names[key]

    def register_module(self, mod: torch.nn.Module, root: str) -> None:
        """Register parameters and buffers (with their FQNs) of the root module ``mod``."""
        b = self.b
        names: dict[int, list[str]] = {}
        for role, items in (
            (ROLE_PARAM, mod.named_parameters(remove_duplicate=False)),
            (ROLE_BUFFER, mod.named_buffers(remove_duplicate=False)),
        ):
            for name, t in items:
                if t is None:
                    continue
                self.tensor_id(t)
                sid = self.storage_id(t, -1, role)
                if sid < 0:
                    continue
                names.setdefault(sid, []).append(f"{root}.{name}")
        for sid, ns in names.items():
            text = "|".join(dict.fromkeys(ns))
            b.std[sid * _N_ST + _ST_NAME] = b.tables["names"].add(text, text)

    def module_registered(self, parent: torch.nn.Module, name: str, sub: Any) -> None:
        """Global submodule-registration hook: remember modules built inside the block."""
        if self.active:
            self.built[id(parent)] = weakref.ref(parent)
            if sub is not None:
                self.built[id(sub)] = weakref.ref(sub)

    def name_built_roots(self) -> None:
        """Name the top-level modules built in the block that never ran forward (init-only runs)."""
        alive = {k: m for k, r in self.built.items() if (m := r()) is not None}
        children = {id(c) for m in alive.values() for c in m._modules.values() if c is not None}
        for k, m in alive.items():
            if k not in children and not (k in self.mod_names and self.mod_refs[k]() is m):
                self.module_id(m)

    def param_rows(self, key: int, root: torch.nn.Module) -> None:
        """(Re)take the parameter table rows of a root module: when first seen and at the end."""
        names = self.b.tables["names"]
        modules = self.b.tables["modules"]
        root_name = modules.strings[self.mod_names[key]]
        for mname, sub in root.named_modules(remove_duplicate=False):
            mid = self.mod_names.get(id(sub))
            if mid is None:
                continue
            for kind, items in ((0, sub._parameters.items()), (1, sub._buffers.items())):
                for pname, t in items:
                    if t is None or not isinstance(t, _Tensor):
                        continue
                    full = f"{root_name}.{mname}.{pname}" if mname else f"{root_name}.{pname}"
                    nid = names.add(full, full)
                    self.p_rows[nid] = self._param_row(t, nid, mid, kind)

    def param_table(self) -> None:
        """Fill the trace's parameter table (at the end of recording).

        Live roots are walked again (their parameters may have moved or been
        replaced); roots that died keep the rows taken when they were first seen,
        with the last gradient their parameters had.
        """
        for key, ref in list(self.roots.items()):
            root = ref()
            if root is not None and self.mod_names.get(key) is not None:
                self.param_rows(key, root)
        pd = self.b.pd
        g = _P_GRAD
        for row in self.p_rows.values():
            if row[g] < 0:
                row = (*row[:g], self.grad_of.get(row[_P_TENSOR], -1), *row[g + 1 :])
            pd.extend(row)

    def _param_row(self, t: Any, name_id: int, mid: int, kind: int) -> tuple[int, ...]:
        tid = self.tensor_id(t)
        sid = self.storage_id(t, -1, ROLE_PARAM if kind == 0 else ROLE_BUFFER)
        shape, dt, dev = t.shape, t.dtype, t.device
        try:
            numel = int(t.numel())
            nb = numel * t.element_size()
            off = int(t.storage_offset())
        except Exception:  # noqa: BLE001 - unbacked symbolic sizes
            numel, nb, off = -1, -1, -1
        shape_s = ", ".join(str(x) for x in shape)
        grad = -1
        g = t.grad if kind == 0 else None
        if g is not None:
            grad = self.add_roles(g, ROLE_GRAD, tid)
        return (
            name_id, mid, tid, sid, off, numel, nb,
            self.t_shapes.add(shape_s, shape_s), self.t_dtypes.add(dt, str(dt)),
            self.t_devices.add(dev, str(dev)), kind, grad,
        )  # fmt: skip

    # ------------------------------------------------- roles of storages
    def pack_saved(self, t: Any) -> Any:
        """saved_tensors_hooks pack: the storage of ``t`` is saved for backward (an activation).

        Note: [saved tensors]
        A pack hook that returns the tensor it was given makes a reference cycle when
        autograd saves an op's *output* on the output's own grad_fn (exp, relu, softmax
        save their result): tensor -> grad_fn -> saved tensor. Without hooks autograd
        avoids this by saving a grad_fn-less alias. We do the same for outputs of the
        node being built (their grad_fn has the newest autograd sequence number): they
        are saved as ``t.detach()`` (same storage and version counter, so in-place
        checks still work), made as an inner dispatch so it is not recorded, and tagged
        with the same tensor id so backward ops name the forward tensor. Inputs and
        leaves are saved as themselves, as autograd does.
        """
        if not self.active:
            return t
        try:
            self.add_roles(t, ROLE_SAVED)
        except Exception:  # noqa: BLE001 - never break autograd
            return t
        fn = t.grad_fn
        if fn is None or fn._sequence_nr() != _get_sequence_nr() - 1:
            # a leaf, or an input of the node being built (whose sequence number is the
            # newest one handed out): no cycle is possible, save the tensor itself
            return t
        return self._saved_alias(t)

    def _saved_alias(self, t: Any) -> Any:
        """The grad_fn-less alias of ``t`` saved in its place (Note: [saved tensors])."""
        alias = _fake_detach(t)  # Note: [fast fake detach]
        if alias is None:
            loc = self.local
            depth = loc.__dict__.get("depth", 0)
            loc.depth = depth + 1  # an inner dispatch: not recorded
            try:
                alias = t.detach()
            finally:
                loc.depth = depth
        tag = t.__dict__.get("_fakeviz_tid")
        if tag is not None:
            alias.__dict__["_fakeviz_tid"] = tag
        return alias

    def unpack_saved(self, t: Any) -> Any:
        """saved_tensors_hooks unpack: hand ``t`` back; the detach autograd may make of it next is
        bookkeeping (Note: [unpack detach])."""
        if self.active:
            self.unpacked[_get_ident()] = t
        return t

    def _mark_inputs(self, mod: torch.nn.Module, args: Any) -> None:
        """A top-level module call: its tensor arguments (and keyword arguments) are inputs."""
        kwargs = None
        f = sys._getframe(2)
        if f is not None and f.f_code.co_name == "inner":
            kwargs = f.f_locals.get("kwargs")
        for leaf in torch.utils._pytree.tree_leaves((args, kwargs or {})):
            if isinstance(leaf, _Tensor) and not isinstance(leaf, torch.nn.Parameter):
                self.add_roles(leaf, ROLE_INPUT)

    def _leaves(self, roots: Any) -> list[Any]:
        """Leaf tensors (AccumulateGrad nodes) reachable from the graph of ``roots``."""
        seen: set[int] = set()
        stack = [t.grad_fn for t in roots if isinstance(t, _Tensor) and t.grad_fn is not None]
        leaves = []
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            var = getattr(node, "variable", None)
            if var is not None:
                leaves.append(weakref.ref(var))
                continue
            stack.extend(n for n, _ in node.next_functions)
        return leaves

    @_no_torch_function
    def backward_event(self, when: str, args: tuple[Any, ...], kwargs: dict[str, Any], is_grad: bool) -> None:
        """Called by the patched torch.autograd.backward/grad (see Note: [session patches])."""
        if not self.active:
            return
        if when == "before":
            self.bw_line = self.user_line(3)
            self.bw_leaves = []
            if not is_grad:
                tensors = kwargs.get("tensors", args[0] if args else ())
                tensors = (tensors,) if isinstance(tensors, _Tensor) else tuple(tensors)
                self.bw_leaves = self._leaves(tensors)
        else:
            self.unpacked.clear()  # Note: [unpack detach]
            for ref in self.bw_leaves:
                self._mark_grad(ref())
            self.bw_leaves = []

    def _mark_grad(self, p: Any) -> None:
        g = getattr(p, "grad", None) if p is not None else None
        if g is not None:
            tid = self.tensor_id(p)
            self.grad_of[tid] = self.add_roles(g, ROLE_GRAD, tid)

    @_no_torch_function
    def opt_pre(self, opt: Any, *_: Any) -> None:
        self.in_optimizer += 1
        if self.active:
            with contextlib.suppress(Exception):
                for group in opt.param_groups:
                    for p in group["params"]:
                        self._mark_grad(p)

    @_no_torch_function
    def opt_post(self, opt: Any, *_: Any) -> None:
        self.in_optimizer = max(0, self.in_optimizer - 1)
        if self.active:
            self.optimizers[id(opt)] = weakref.ref(opt)
            self._mark_optimizer_state(opt)

    def _mark_optimizer_state(self, opt: Any) -> None:
        for p, st in list(opt.state.items()):
            owner = self.tensor_id(p) if isinstance(p, _Tensor) else -1
            for v in torch.utils._pytree.tree_leaves(st):
                if isinstance(v, _Tensor):
                    self.add_roles(v, ROLE_OPT, owner)

    @_no_torch_function
    def finish(self) -> None:
        """At the end of the block: name modules built but never run, fill the parameter table."""
        for ref in list(self.optimizers.values()):
            opt = ref()
            if opt is not None:
                self._mark_optimizer_state(opt)
        self.name_built_roots()
        self.param_table()

    def _mark(self) -> None:
        self.sn_marks.append(_get_sequence_nr())
        self.sn_mods.append(self.fw_stack[-1] if self.fw_stack else -1)

    def fw_pre(self, mod: torch.nn.Module, args: Any) -> None:
        if not self.active:
            return
        key = id(mod)
        mid = self.mod_names.get(key)
        if mid is None or self.mod_refs[key]() is not mod:
            mid = self.module_id(mod)
        if not self.fw_stack and _graph_task_id() < 0:
            try:
                self._mark_inputs(mod, args)
            except Exception as exc:  # noqa: BLE001 - never break the user's forward
                self.internal_note("inputs", exc)
        self.fw_stack.append(mid)
        cls = type(mod)
        internal = self.internal_cls.get(cls)
        if internal is None:
            fwd = getattr(cls.forward, "__code__", None)
            internal = self.internal_cls[cls] = fwd is not None and self._is_internal(fwd)
        self.fw_lines.append(self.user_line(2) if internal else -2)
        self.seen_forward = True
        self._mark()

    def fw_post(self, mod: torch.nn.Module, args: Any, output: Any) -> None:
        if not self.active:
            return
        mid = self.mod_names.get(id(mod), -1)
        stack = self.fw_stack
        if stack and stack[-1] == mid:
            stack.pop()
            self.fw_lines.pop()
        elif mid in stack:
            i = len(stack) - 1 - stack[::-1].index(mid)
            del stack[i]
            del self.fw_lines[i]
        self._mark()

    @_no_torch_function
    def param_registered(self, mod: torch.nn.Module, name: str, t: Any) -> None:
        if self.active and t is not None and isinstance(t, _Tensor):
            self.built[id(mod)] = weakref.ref(mod)
            self.storage_id(t, self.b.num_ops(), ROLE_PARAM)

    @_no_torch_function
    def buffer_registered(self, mod: torch.nn.Module, name: str, t: Any) -> None:
        if self.active and t is not None and isinstance(t, _Tensor):
            self.built[id(mod)] = weakref.ref(mod)
            self.storage_id(t, self.b.num_ops(), ROLE_BUFFER)

    def attention_choice(self, backend: str, setting: str, why: dict[str, str]) -> None:
        """Called by the attention patch for every simulated SDPA call (for the fidelity report)."""
        if self.active:
            reason = "; ".join(f"not {k}: {v}" for k, v in why.items())
            calls = self.trace.meta.setdefault("attention_calls", [])
            calls.append([self.b.num_ops(), backend, setting, reason[:500]])

    def attention_error(self, exc: BaseException) -> BaseException:
        """An attention call failed above the dispatcher (no kernel for these inputs): name where."""
        return self.on_error("aten.scaled_dot_product_attention", exc) if self.active else exc

    def internal_note(self, what: str, exc: BaseException) -> None:
        meta = self.trace.meta
        meta["recorder_errors"] = meta.get("recorder_errors", 0) + 1
        meta.setdefault("first_recorder_error", f"{what}: {type(exc).__name__}: {exc}"[:1000])


def _source_text(line: str | None) -> str:
    if not line:
        return ""
    try:
        import linecache

        fn, rest = line.rsplit(":", 1)
        return linecache.getline(fn, int(rest.split()[0])).strip()
    except (ValueError, IndexError):
        return ""


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


class _FakeRecordingMode(FakeTensorMode):
    """FakeTensorMode with the recorder fused in. See Note: [recorder fused into the fake mode]."""

    _fv_state: _State | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        st = self._fv_state
        if func._namespace == "prim" or st is None or not st.active:
            return _fake_dispatch(self, func, types, args, kwargs)
        return st.run_op(_fake_dispatch_fast if func is _DETACH else _fake_dispatch, self, func, types, args, kwargs)

    # Note: [recorded op cache]: hand the outermost op's dispatch-cache entry to the recorder
    def _output_from_cache_entry(self, state: Any, entry: Any, key: Any, func: Any, args: Any) -> Any:
        self._fv_entry(func, entry)
        return _fake_output_from_entry(self, state, entry, key, func, args)

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
_fake_output_from_entry = getattr(FakeTensorMode, "_output_from_cache_entry", None)  # private: may be renamed
_fake_make_entry = getattr(FakeTensorMode, "_make_cache_entry", None)


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


class FakeSession:
    """One fake mode that lasts across several :func:`record` blocks.

    Fake tensors from two different fake modes cannot be mixed; objects made in
    one ``record(session=s)`` block can be used in the next one with the same
    ``s`` (this is what ``%%fake`` does across notebook cells).
    """

    def __init__(self, *, symbolic: bool = False) -> None:
        self.symbolic = symbolic
        self._mode: _FakeRecordingMode | None = None

    @property
    def mode(self) -> _FakeRecordingMode:
        if self._mode is None:
            self._mode = new_fake_mode(symbolic=self.symbolic, cls=_FakeRecordingMode)
        return self._mode

    def __repr__(self) -> str:
        return f"<fakeviz.FakeSession symbolic={self.symbolic} started={self._mode is not None}>"


class Recording:
    """Context manager returned by :func:`record`; ``with fv.record() as trace``."""

    def __init__(
        self,
        *,
        device: str | torch.device | None,
        dtype: torch.dtype | None,
        fake: bool,
        symbolic: bool,
        exclude: tuple[str, ...],
        modules: tuple[torch.nn.Module, ...],
        session: FakeSession | None = None,
        progress: Any = None,
        attention: str = "auto",
        gpu: str | None = None,
        record_cls: type[Record] = Record,
    ) -> None:
        from .._core.gpus import Capacity
        from .attention import SETTINGS

        if attention not in (*SETTINGS, "native"):
            raise ValueError(f"attention={attention!r}: use one of {', '.join((*SETTINGS, 'native'))}")
        self.attention = attention
        self.capability = (9, 0)
        if gpu is not None:
            cap = Capacity.parse(gpu).capability  # a clear error for an unknown name
            if cap is not None:
                self.capability = cap
        self.gpu = gpu
        if session is not None and not fake:
            raise ValueError("record(session=...) needs fake=True: a session is a lasting fake mode")
        self.session = session
        self.progress = progress
        self.device = torch.device(device) if device is not None else None
        self.dtype = dtype
        self.fake = fake
        self.symbolic = symbolic
        self.exclude = exclude
        self.modules = modules
        self.trace = record_cls(
            meta={
                "fake": fake,
                "device": str(self.device) if self.device else None,
                "dtype": str(dtype) if dtype else None,
                "symbolic": symbolic,
                "torch": torch.__version__,
                "fake_cuda": None,
                "attention": attention,
                **({"gpu": gpu, "capacity": gpu, "capability": list(self.capability)} if gpu else {}),
            }
        )
        self.mode: Any = None
        self._stack: contextlib.ExitStack | None = None
        self._state: _State | None = None
        self._saved_dtype: torch.dtype | None = None

    def __enter__(self) -> Record:
        shim = _cuda_shim.ensure_fake_cuda()
        self.trace.meta["fake_cuda"] = shim.mode
        check_device(self.device)
        if self.device is not None and self.fake:
            _cuda_shim.warn_if_unavailable(self.device)
        prefixes = tuple(_package_dir(x) for x in self.exclude)
        state = self._state = _State(self.trace, exclude=prefixes)
        self.trace.meta["recorder_core"] = "c" if state.core is not None else "python"  # Note: [recorder core in C]
        stack = self._stack = contextlib.ExitStack()
        try:
            stack.enter_context(session_patches(on_backward=state.backward_event))
            mm = torch.nn.modules.module
            hooks = [
                mm.register_module_forward_pre_hook(state.fw_pre),
                mm.register_module_forward_hook(state.fw_post, always_call=True),
                mm.register_module_parameter_registration_hook(state.param_registered),
                mm.register_module_buffer_registration_hook(state.buffer_registered),
                mm.register_module_module_registration_hook(state.module_registered),
                register_optimizer_step_pre_hook(state.opt_pre),
                register_optimizer_step_post_hook(state.opt_post),
            ]
            for h in hooks:
                stack.callback(h.remove)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(state.pack_saved, state.unpack_saved))
            stack.callback(self._deactivate)
            stack.callback(self._finish_state)
            for m in self.modules:
                state.module_id(m)
            if self.dtype is not None:
                self._saved_dtype = torch.get_default_dtype()
                torch.set_default_dtype(self.dtype)
                stack.callback(torch.set_default_dtype, self._saved_dtype)
            state.progress = self.progress
            if self.fake:
                if self.session is not None:
                    mode = self.session.mode
                    if mode._fv_state is not None and mode._fv_state.active:
                        raise RuntimeError("this fake session is already recording (nested record on one session)")
                else:
                    mode = new_fake_mode(symbolic=self.symbolic, cls=_FakeRecordingMode)
                mode._fv_state = state
                _install_core_hooks(mode, state)
                stack.callback(_remove_core_hooks, mode)
            else:
                # Note: [view replay in real runs]
                # Autograd rebuilds the grad_fn of a view after an in-place op by replaying
                # the view function for Python-dispatch tensors (FakeTensor) and by
                # as_strided for plain tensors, so the two would log different view ops.
                # Forcing view replay in real runs makes both log the same ops; only
                # views differ, so memory figures are unchanged.
                stack.enter_context(torch.autograd._force_original_view_tracking(True))
                mode = _RealRecordingMode(state)
            if self.attention not in ("auto", "native"):
                # a forced kernel also restricts what real and non-cuda runs may use, like sdpa_kernel
                from torch.nn.attention import SDPBackend, sdpa_kernel

                backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                           "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[self.attention]  # fmt: skip
                stack.enter_context(sdpa_kernel([backend]))
            if self.fake and self.attention != "native":
                from .attention import attention_patch

                stack.enter_context(
                    attention_patch(
                        self.attention,
                        self.capability,
                        on_choice=state.attention_choice,
                        on_error=state.attention_error,
                    )
                )
            self.mode = mode
            stack.enter_context(mode)
            if self.device is not None:
                stack.enter_context(torch.device(self.device))
        except BaseException:
            stack.close()
            raise
        return self.trace

    def _deactivate(self) -> None:
        if self._state is not None:
            self._state.active = False

    def _finish_state(self) -> None:
        # runs before the mode and hooks are undone (ExitStack order), while tensors are live
        if self._state is not None and self._state.active:
            try:
                self._state.finish()
            except Exception as exc:  # noqa: BLE001 - the trace stays usable without the table
                self._state.internal_note("finish", exc)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        assert self._stack is not None
        try:
            self._stack.close()  # exits the device context, the mode, the hooks: never leaves a mode active
        finally:
            self.trace.finish()
            if exc is not None:
                if isinstance(exc, RecordError):
                    exc.trace = self.trace
                with contextlib.suppress(Exception):
                    exc.fakeviz_trace = self.trace  # type: ignore[attr-defined]
                if self.trace.error is None:
                    self.trace.error = {"type": type(exc).__name__, "message": str(exc)[:2000], "op": None}
        return False


def _package_dir(name: str) -> str:
    """Path prefix of an importable package name, or the string itself if it is a path."""
    if os.sep in name:
        return name
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"exclude: no package named {name!r}")
    return os.path.dirname(os.path.realpath(list(spec.submodule_search_locations)[0])) + os.sep + name + os.sep


def record(
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    fake: bool = True,
    symbolic: bool = False,
    exclude: tuple[str, ...] | list[str] = (),
    modules: tuple[torch.nn.Module, ...] | list[torch.nn.Module] = (),
    session: FakeSession | None = None,
    progress: Any = None,
    attention: str = "auto",
    gpu: str | None = None,
    record_cls: type[Record] = Record,
) -> Recording:
    """Record every dispatched aten op of the code in the ``with`` block.

    ``with fv.record(device="cuda:0") as trace:`` runs the block under fake
    tensors (``fake=True``, the default) or real ones (``fake=False``) and fills
    ``trace`` (a ``record_cls``, :class:`~fakeviz._core.record.Record` by default; ``fakeviz.record`` makes a
    :class:`~fakeviz.Trace`).

    Args:
        device: default device inside the block (``"cuda:3"`` works on CPU-only torch).
        dtype: default floating dtype inside the block (e.g. ``torch.bfloat16``).
        fake: record fake tensors (no data, no memory) or a real run.
        symbolic: attach a ShapeEnv so data-dependent output sizes become symbols.
        exclude: packages whose frames are skipped when finding the user's line
            (e.g. ``("transformers",)``); torch and fakeviz are always skipped.
        modules: modules created before the block whose parameters and buffers
            should be registered (with names) before the first op.
        session: a :class:`FakeSession` to reuse, so fake objects made in an
            earlier block (same session) can be used in this one.
        progress: ``callable(n_ops, phase, module)`` called every 1024 ops.
        attention: which kernel ``scaled_dot_product_attention`` on a fake cuda device
            records: ``"auto"`` (PyTorch's own choice for that GPU, dtype, shape and
            mask: cuDNN or flash or memory-efficient or math), ``"flash"``,
            ``"efficient"``, ``"cudnn"``, ``"math"`` (forced, like ``sdpa_kernel``), or
            ``"native"`` (what this torch build does on a fake device: the math path on
            a CPU-only build). See :mod:`fakeviz._attention`.
        gpu: a GPU name from the catalog (``"H100"``, ``"A100 40GB"``): its compute
            capability drives the attention rules (default H100) and its memory is
            the capacity for the verdict and the allocator model.

    On an error inside the block the exception propagates unchanged (with a
    note naming the op, module and line) or, for data-dependent ops, as a
    :class:`~fakeviz.DataDependentError`; the partial trace is on the exception
    (``.trace`` / ``.fakeviz_trace``) and in the ``as`` target, and no fake mode
    is left active.
    """
    return Recording(
        device=device,
        dtype=dtype,
        fake=fake,
        symbolic=symbolic,
        exclude=tuple(exclude),
        modules=tuple(modules),
        session=session,
        progress=progress,
        attention=attention,
        gpu=gpu,
        record_cls=record_cls,
    )
