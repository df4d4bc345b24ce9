"""The one registry of what fakeviz changes in torch and in other libraries.

Note: [patch registry]
Every attribute, table slot or list that fakeviz replaces or extends outside its own package is declared
here (:data:`ENTRIES`: owner, names, scope, the fakeviz module that does it, why, the torch versions it
applies to) and changed only through :func:`push` / :func:`push_item` / :func:`push_member`, undone with
:func:`pop`. Scopes:

* ``import``: done once when fakeviz is imported and kept for the process (fake rules in FakeTensorMode's
  op table, the fallback-kernel probe, the fake-cuda shim in C++): each is transparent for code that is
  not fakeviz's (it answers as torch did unless fakeviz's own mode or state is involved);
* ``session``: while any fake session is active (``fake_mode()``, ``record()``; Note: [session patches]);
* ``gpu-session``: while a fake cuda session answers ``torch.cuda`` as a GPU (Note: [torch.cuda on fake GPUs]);
* ``record``: while one recording is active (attention kernel choice, ``deepcopy``, transformers' tracing
  checks).

Replacements stack per attribute: each :func:`push` returns a token, and :func:`pop` of any token (not
only the last: two fake sessions in two threads end in either order) leaves the attribute holding the value of
the newest push still in force, or the original once none is. So nothing is left patched whatever order
scopes end in. :func:`active` lists what is replaced now; ``tests/engine/test_patches.py`` checks, in a
fresh process, that every attribute of the owners below equals its value from before ``import fakeviz``
after a record, after an error inside one and after records in other threads (``import`` scope aside), and
that every replacement fakeviz makes is declared here.

Note: [threads]
A change answers only in the threads of its scope; in every other thread the attribute answers as torch's own
(``tests/engine/test_threads.py``). A scope is the thread's that opened it (:func:`enter`): a ``session``
change (pushed once for every fake session of the process) answers in each thread that has a fake session
open, a ``record`` change in the thread that made it (made from a thread outside any scope, as by an import
hook, in the recording thread's), an ``import`` change everywhere (each is transparent for code that is not
fakeviz's). A function is replaced by a dispatcher that picks, per call, the newest change of the calling
thread's scopes, else torch's own; a dispatcher a newer change kept as "the previous function" picks among the
changes older than it only, so changes nest. Values that are not functions (a list member, a class, a tuple)
cannot answer per thread: the ``gpu-session`` changes answer per thread through ``cuda_api``'s own dispatchers
(``cuda_api.stack.active``), and the rest are listed in docs/limitations.md.
Autograd's worker threads (the device threads a backward on fake cuda runs on) are the thread's that started the
backward: :func:`home` maps the worker to that thread by the graph task it runs, which the recorder claims when its
mode dispatches there (:func:`claim`) and which is also found from the thread's dispatch modes (:func:`watch`).
Torch's global hooks the recorder registers return at once in another thread (``recorder/modules.py``). One record at a time per process: a record opened while
another thread records is refused (``enter(..., alone=True)`` raises :class:`Busy`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ENTRIES", "Busy", "Entry", "OnImport", "active", "claim", "declare", "enter", "home", "leave",
           "install_fake_rule", "original", "pop", "push", "push_call", "push_item", "push_member", "watch", "where"]  # fmt: skip

SCOPES = ("import", "session", "gpu-session", "record")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One kind of change: ``names`` of ``owner`` (a dotted module or class path; ``kind`` says what)."""

    key: str
    owner: str
    names: tuple[str, ...]
    scope: str
    by: str  # the fakeviz module that makes the change
    why: str  # the Note that explains it
    torch: str = "all supported"  # the torch versions it applies to
    kind: str = "attribute"  # "attribute" | "table item" | "list member" | "global hook" | "C++"


ENTRIES: dict[str, Entry] = {}


def declare(key: str, owner: str, names: tuple[str, ...] | str, *, scope: str, by: str, why: str,
            torch: str = "all supported", kind: str = "attribute") -> Entry:  # fmt: skip
    """Declare one kind of change (at most once per key)."""
    if scope not in SCOPES:
        raise ValueError(f"patch {key}: scope {scope!r} is not one of {SCOPES}")
    if key in ENTRIES:
        raise ValueError(f"patch {key} is declared twice")
    entry = Entry(key, owner, (names,) if isinstance(names, str) else tuple(names), scope, by, why, torch, kind)
    ENTRIES[key] = entry
    return entry


# ------------------------------------------------------------------------------------------------ threads
# Note: [threads]
_LOCK = threading.RLock()
_ids = itertools.count(1)
_get_ident = threading.get_ident
_graph_task = torch._C._current_graph_task_id
_OPEN: dict[int, int] = {}  # thread ident -> scopes it has open now
_SESSIONS: dict[int, int] = {}  # thread ident -> fake sessions it has open: where session changes answer
_ALONE: dict[str, list[Any]] = {}  # scope -> [thread ident, thread name, count] of the one thread it is open in
_MODES: dict[int, list[Any]] = {}  # id(dispatch mode) -> [mode, thread ident, count] (watch)
_TASKS: dict[int, int] = {}  # autograd graph task id -> the thread whose backward it is (claim, home)
_ENTERED: dict[int, tuple[int, str | None, Any, bool]] = {}  # token -> (thread, scope, mode, alone)


class Busy(Exception):
    """:func:`enter` with ``alone=True`` while another thread has the scope open; ``thread`` is its name."""

    def __init__(self, thread: str) -> None:
        super().__init__(thread)
        self.thread = thread


def home() -> int:
    """The thread whose scopes the calling thread is in: itself, or for autograd's worker thread running a backward
    that a thread with open scopes started, that thread (Note: [threads])."""
    i = _get_ident()
    if i in _OPEN or not _OPEN:
        return i
    g = _graph_task()
    if g < 0:
        return i
    owner = _TASKS.get(g)
    if owner is None:
        owner = _mode_owner()
        if owner is None:
            return i
        _TASKS[g] = owner
    return owner


def _mode_owner() -> int | None:
    """The thread of a watched dispatch mode on the calling thread's mode stack (autograd hands a backward's worker
    the modes of the thread that started it); None when there is none."""
    if not _MODES:
        return None
    for k in range(torch._C._len_torch_dispatch_stack()):
        hit = _MODES.get(id(torch._C._get_dispatch_stack_at(k)))
        if hit is not None:
            return hit[1]
    return None


def claim(owner: int) -> bool:
    """The calling thread runs a backward of thread ``owner`` (the recorder's mode dispatched here): until that
    graph task ends it answers as ``owner``. False (nothing claimed) outside a backward."""
    g = _graph_task()
    if g < 0:
        return False
    _TASKS[g] = owner
    return True


def enter(scope: str, *, alone: bool = False) -> int:
    """The calling thread (its :func:`home`) opens ``scope`` until :func:`leave` of the token: ``session`` changes
    answer in it while it has one open. ``alone``: refuse (:class:`Busy`) while another thread has ``scope`` open
    with ``alone`` too."""
    with _LOCK:
        h = home()
        if alone:
            held = _ALONE.get(scope)
            if held is not None and held[0] != h:
                raise Busy(held[1])
            if held is None:
                held = _ALONE[scope] = [h, threading.current_thread().name, 0]
            held[2] += 1
        _OPEN[h] = _OPEN.get(h, 0) + 1
        if scope == "session":
            _SESSIONS[h] = _SESSIONS.get(h, 0) + 1
        token = next(_ids)
        _ENTERED[token] = (h, scope, None, alone)
        return token


def watch(mode: Any) -> int:
    """Find the calling thread's backward workers by ``mode`` (a dispatch mode of one of its scopes) until
    :func:`leave` of the token (Note: [threads])."""
    with _LOCK:
        h = home()
        hit = _MODES.setdefault(id(mode), [mode, h, 0])
        hit[2] += 1
        _OPEN[h] = _OPEN.get(h, 0) + 1
        token = next(_ids)
        _ENTERED[token] = (h, None, mode, False)
        return token


def leave(token: int) -> None:
    """Undo one :func:`enter` or :func:`watch`."""
    with _LOCK:
        got = _ENTERED.pop(token, None)
        if got is None:
            return
        h, scope, mode, alone = got
        if alone and scope is not None:
            held = _ALONE[scope]
            held[2] -= 1
            if not held[2]:
                del _ALONE[scope]
        if scope == "session":
            _drop(_SESSIONS, h)
        if mode is not None:
            hit = _MODES[id(mode)]
            hit[2] -= 1
            if not hit[2]:
                del _MODES[id(mode)]
        if _drop(_OPEN, h):
            for g in [g for g, o in list(_TASKS.items()) if o == h]:
                _TASKS.pop(g, None)


def _drop(counts: dict[int, int], key: int) -> bool:
    """Count one less for ``key``; True when none is left."""
    n = counts[key] - 1
    if n:
        counts[key] = n
        return False
    del counts[key]
    return True


# ------------------------------------------------------------------------------------------------ changes
_MISSING = object()


@dataclasses.dataclass
class _Slot:
    owner: Any
    name: Any
    original: Any  # _MISSING: the owner had no own value (a class attribute inherited, a new table key)
    item: bool  # a mapping item rather than an attribute
    # (token, value, entry key, who, what the attribute holds while it is the newest), oldest first; who: None
    # (every thread), a thread ident, or a dict whose keys are the threads (Note: [threads])
    stack: list[tuple[int, Any, str, Any, Any]]
    unpatched: Any = _MISSING  # what torch's own lookup gives (the original, or a class attribute inherited)


_SLOTS: dict[tuple[int, Any], _Slot] = {}
_TOKENS: dict[int, tuple[int, Any]] = {}
_MEMBERS: dict[int, tuple[list[Any], Any, str]] = {}
_CALLS: dict[int, tuple[str, Any]] = {}  # token -> (entry, undo) of changes made in C++ (push_call)


def _own(owner: Any, name: str) -> Any:
    if isinstance(owner, type):
        return owner.__dict__.get(name, _MISSING)
    return getattr(owner, name, _MISSING)


def _unpatched(owner: Any, name: Any, original: Any) -> Any:
    if original is _MISSING and isinstance(owner, type):
        return next((base.__dict__[name] for base in owner.__mro__[1:] if name in base.__dict__), _MISSING)
    return original


_BINDS = (types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)


def _who(entry: str, value: Any, slot: _Slot) -> Any:
    """The threads a change answers in (None: every thread; Note: [threads]): a function of a ``session`` or
    ``record`` scope whose unpatched value a dispatcher can call in its place."""
    scope = ENTRIES[entry].scope
    if scope not in ("session", "record") or slot.item or not isinstance(value, types.FunctionType):
        return None
    fallback = slot.unpatched
    if isinstance(slot.owner, type) and not isinstance(fallback, _BINDS):
        return None  # a dispatcher in a class binds like a method: only a method can stand in for it
    if not callable(fallback) or isinstance(fallback, (type, staticmethod, classmethod)):
        return None
    if scope == "session":
        return _SESSIONS
    h = home()
    if h not in _OPEN and _ALONE.get("record"):  # made outside any scope (an import hook): the recording thread's
        return _ALONE["record"][0]
    return h


def _pick(slot: _Slot, bound: int) -> Any:
    """The value the calling thread sees among the changes up to token ``bound``, else the unpatched value."""
    h = None
    for token, value, _, who, _ in reversed(slot.stack):
        if token > bound:
            continue
        if who is None:
            return value
        if h is None:
            h = home()
        if (h == who) if type(who) is int else (h in who):
            return value
    return slot.unpatched


def _dispatcher(slot: _Slot, bound: int, value: Any) -> Any:
    def patched(*args: Any, **kwargs: Any) -> Any:
        return _pick(slot, bound)(*args, **kwargs)

    functools.update_wrapper(patched, value)
    return patched


def _write(slot: _Slot, value: Any) -> None:
    if slot.item:
        if value is _MISSING:
            slot.owner.pop(slot.name, None)
        else:
            slot.owner[slot.name] = value
    elif value is _MISSING:
        if slot.name in getattr(slot.owner, "__dict__", {}):
            delattr(slot.owner, slot.name)
    else:
        setattr(slot.owner, slot.name, value)


def _declared(entry: str) -> None:
    if entry not in ENTRIES:
        raise KeyError(f"patch {entry!r} is not declared in fakeviz._engine.patches")


def _push(owner: Any, name: Any, value: Any, entry: str, item: bool) -> int:
    _declared(entry)
    with _LOCK:
        key = (id(owner), name)
        slot = _SLOTS.get(key)
        if slot is None:
            original = owner.get(name, _MISSING) if item else _own(owner, name)
            slot = _SLOTS[key] = _Slot(owner, name, original, item, [], _unpatched(owner, name, original))
        token = next(_ids)
        who = _who(entry, value, slot)
        held = value if who is None else _dispatcher(slot, token, value)
        slot.stack.append((token, value, entry, who, held))
        _TOKENS[token] = key
        _write(slot, held)
        return token


def push(owner: Any, name: str, value: Any, *, entry: str) -> int:
    """Set ``owner.name = value`` for declared ``entry``; the token undoes it (:func:`pop`)."""
    return _push(owner, name, value, entry, item=False)


def push_item(table: dict[Any, Any], key: Any, value: Any, *, entry: str) -> int:
    """Set ``table[key] = value`` for declared ``entry``; the token undoes it."""
    return _push(table, key, value, entry, item=True)


def install_fake_rule(op: Any, rule: Callable[..., Any], previous: dict[Any, Any]) -> None:
    """Put fakeviz's fake ``rule`` for aten ``op`` in FakeTensorMode's op table for the process (entry
    ``fake-rules``), once; the rule it replaces goes to ``previous[op]`` (what the rule answers other modes with)."""
    from torch._subclasses import fake_impls

    table = fake_impls.op_implementations_dict
    current = table.get(op)
    if getattr(current, "_fakeviz_rule", False):
        return
    previous[op] = current
    rule._fakeviz_rule = True  # type: ignore[attr-defined]
    push_item(table, op, rule, entry="fake-rules")


def push_member(lst: list[Any], member: Any, *, entry: str) -> int:
    """Append ``member`` to ``lst`` unless it is there; the token removes what this call added."""
    _declared(entry)
    with _LOCK:
        token = next(_ids)
        added = member not in lst
        if added:
            lst.append(member)
        _MEMBERS[token] = (lst, member if added else _MISSING, entry)
        return token


def push_call(do: Any, undo: Any, *, entry: str) -> int:
    """A change made by a call (the fake-cuda shim's C++, torch's global hook registrations): ``do()`` now,
    ``undo()`` at :func:`pop`."""
    _declared(entry)
    with _LOCK:
        do()
        token = next(_ids)
        _CALLS[token] = (entry, undo)
        return token


def pop(token: int) -> None:
    """Undo one change; what is left in force is the newest change still pushed, else the original."""
    with _LOCK:
        call = _CALLS.pop(token, None)
        if call is not None:
            call[1]()
            return
        member = _MEMBERS.pop(token, None)
        if member is not None:
            lst, value, _ = member
            if value is not _MISSING and value in lst:
                lst.remove(value)
            return
        key = _TOKENS.pop(token, None)
        if key is None:
            return
        slot = _SLOTS[key]
        was_top = slot.stack[-1][0] == token
        slot.stack = [s for s in slot.stack if s[0] != token]
        if slot.stack:
            if was_top:
                _write(slot, slot.stack[-1][4])
        else:
            _write(slot, slot.original)
            del _SLOTS[key]


def original(owner: Any, name: str) -> Any:
    """The value ``owner.name`` had before fakeviz changed it (its current value when unchanged)."""
    with _LOCK:
        slot = _SLOTS.get((id(owner), name))
        if slot is None or slot.original is _MISSING:
            return getattr(owner, name)
        return slot.original


def where(owner: Any) -> str:
    """A dotted name of a module or class (``torch.cuda.memory``, ``torch._tensor.Tensor``); else a repr."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return getattr(owner, "__name__", None) or f"<{type(owner).__name__} at {id(owner):#x}>"


def active(scope: str | None = None) -> list[tuple[str, str, str]]:
    """``(entry key, owner, name)`` of every change in force now (of one ``scope`` if given), oldest first
    (a list member's owner is ``"list"`` and its name the member's repr)."""
    with _LOCK:
        out = [(e, where(slot.owner), str(slot.name)) for slot in _SLOTS.values() for _, _, e, _, _ in slot.stack]
        out += [(e, "list", repr(m)) for _, m, e in _MEMBERS.values() if m is not _MISSING]
        out += [(e, ENTRIES[e].kind, ", ".join(ENTRIES[e].names)) for e, _ in _CALLS.values()]
    return [x for x in out if scope is None or ENTRIES[x[0]].scope == scope]


# ------------------------------------------------------------------------------------------ declarations
_S = "fakeviz._engine.session"
# import scope
declare("fake-rules", "torch._subclasses.fake_impls.op_implementations_dict",
        ("aten._grouped_mm.default", "aten._use_cudnn_ctc_loss.*", "aten._cudnn_ctc_loss.*",
         "aten._use_miopen_ctc_loss.*", "aten._ctc_loss_backward.*", "aten._pin_memory.default"),
        scope="import", by="fakeviz._engine.moe, fakeviz._engine.ctc, fakeviz._engine.pinned", kind="table item",
        why="Note: [grouped_mm under fake tensors], Note: [cuDNN CTC under fake tensors], Note: [pinned memory "
            "under fake tensors]; ops a torch lacks "
            "are skipped (fakeviz._engine.torch_compat)")  # fmt: skip
declare("fallback-probe", "torch._subclasses.fake_tensor", "run_fallback_kernel", scope="import",
        by="fakeviz._engine.recorder.modes", why="Note: [fallback kernels]")  # fmt: skip
declare("cuda-shim", "c10::impl::device_guard_impl_registry[CUDA], at::detail::getCUDAHooks() vtable, "
        "the dispatcher's CUDA key", ("DeviceGuardImpl", "CUDAHooks", "aten::silu_backward", "aten::mish_backward"),
        scope="import", by="fakeviz._engine.cuda_shim", kind="C++",
        why="Note: [fake cuda on a CPU-only build] (the guard; the hooks' vtable); Note: [fake cuda on a CUDA "
            "build without a GPU] (the guard; one vtable slot: hasPrimaryContext); Note: [CUDA kernels a CPU-only "
            "build lacks] (a CPU-only build: CUDA kernels for two aten ops); nothing on a CUDA build that sees a GPU")  # fmt: skip
declare("torchao-out-dtype", "torch._higher_order_ops.out_dtype.out_dtype.python_key_table", "fakeviz's mode classes",
        scope="import", by="fakeviz._engine.torchao_patches", kind="table item",
        why="Note: [out_dtype under the recording mode] (torchao's int8 matmul on CUDA)")  # fmt: skip
# session scope (Note: [session patches])
declare(
    "swap-tensors", "torch.utils", "swap_tensors", scope="session", by=_S, why="Note: [Module.to on fake parameters]"
)
declare(
    "autograd-entry",
    "torch.autograd",
    ("backward", "grad"),
    scope="session",
    by=_S,
    why="Note: [session patches]: user line of a backward, worker drain, engine errors explained",
)
declare("foreach-types", "torch.optim.optimizer._foreach_supported_types, "
        "torch.utils._foreach_utils._foreach_supported_types", "FakeTensor", scope="session", by=_S,
        kind="list member", why="Note: [foreach on fake tensors]")  # fmt: skip
declare("storage-resize", "torch.UntypedStorage", "resize_", scope="session", by=_S, why="Note: [storage resize]")
declare(
    "rebuild-tensor",
    "torch._utils",
    "_rebuild_tensor",
    scope="session",
    by=_S,
    why="Note: [torch.load under fake tensors]",
)
declare(
    "ctc-loss",
    "torch",
    "ctc_loss",
    scope="session",
    by="fakeviz._engine.ctc",
    why="Note: [cuDNN CTC under fake tensors]",
)
declare(
    "dtensor-shadow-prop",
    "torch.distributed.tensor._sharding_prop.ShardingPropagator",
    "_propagate_tensor_meta_non_cached",
    scope="session",
    by="fakeviz._engine.distributed",
    why="Note: [DTensor's shadow propagation]; only once torch.distributed.tensor is imported",
)
declare(
    "autocast",
    "torch.cuda.amp.common",
    "amp_definitely_not_available",
    scope="session",
    by="fakeviz._engine.cuda_api",
    why="Note: [session patches]: torch.autocast('cuda') on the shim only",
)
declare("sdpa-native", "torch.nn.functional", "scaled_dot_product_attention", scope="session",
        by=_S, torch="CUDA builds that see no GPU",
        why="Note: [fake cuda on a CUDA build without a GPU]: the build's own SDPA choice reads the GPU's "
            "properties, so 'native' takes the math path there, as on a CPU-only build")  # fmt: skip
declare(
    "bf16-supported",
    "torch.cuda",
    "is_bf16_supported",
    scope="session",
    by="fakeviz._engine.cuda_api",
    why="Note: [session patches]: on the shim only",
)
declare("torchao-sm-checks", "torchao.utils and the torchao modules that import them by name",
        ("is_sm_at_least_89", "is_sm_at_least_90", "is_sm_at_least_100"), scope="session",
        by="fakeviz._engine.torchao_patches", torch="CPU-only builds (the shim)",
        why="Note: [torchao on fake GPUs]: torchao's kernel choice by capability answers as the fake GPU; also a "
            "sys.meta_path finder while torchao is not yet imported")  # fmt: skip
_Q = "fakeviz._engine.quant.bnb"
declare("fake-param-subclass", "torch.Tensor", "_make_subclass", scope="session", by=_Q,
        why="Note: [bitsandbytes under fake tensors]: a Parameter subclass (Params4bit, Int8Params) made from a fake "
            "tensor; everything else goes to torch's own")  # fmt: skip
declare("fake-tolist", "torch._subclasses.fake_tensor.FakeTensor", "tolist", scope="session", by=_Q,
        why="Note: [tolist of known values]: no ops where the real tolist dispatches none")  # fmt: skip
declare("bnb-qmap", "bitsandbytes.functional.name2qmap, bitsandbytes.functional", ("dynamic", "quantize_blockwise"),
        scope="session", by=_Q,
        why="Note: [bitsandbytes under fake tensors]: the 8-bit dynamic map made on the real CPU, never a fake tensor "
            "in the library's cache (a table item), and on a fake device the map on that device; also a "
            "sys.meta_path finder while bitsandbytes is not yet imported")  # fmt: skip
declare("quant-deferred-linears", "torch.nn.modules.module", "module parameter registration", scope="session",
        by="fakeviz.models._quant", kind="global hook",
        why="Note: [quantizing a built model]: while build(quantization=) builds, each nn.Linear weight kept on meta "
            "until it is quantized (the building thread only)")  # fmt: skip
declare("bnb-gemm-workspace", "bitsandbytes", "matmul_4bit", scope="session", by=_Q,
        why="Note: [4-bit matmul workspace on cuda]: the dequantized weight the CUDA kernel allocates inside the op, "
            "on fake cuda")  # fmt: skip
declare("bnb-outliers", "torch._library.fake_impl.FakeImplCtx", "new_dynamic_size", scope="session", by=_Q,
        why="Note: [LLM.int8 outliers under fake tensors]: the dynamic size of a bitsandbytes op whose values are "
            "unknown, while quant.bnb.outlier_outputs runs its fake kernel; torch's own answer otherwise")  # fmt: skip
declare("bnb-paged", "bitsandbytes.functional", ("get_paged", "elementwise_func", "prefetch_tensor"), scope="session",
        by=_Q, why="Note: [paged optimizer state]: unified memory as a fake tensor on the device, marked paged; its "
                   "ctypes fill and prefetch on a fake tensor: a fill_, nothing")  # fmt: skip
declare("torchao-eager-step", "torch", "compile", scope="session", by="fakeviz._engine.torchao_patches",
        why="Note: [torchao optimizers in a record]: torchao's optimizer step functions run uncompiled (dynamo "
            "refuses a dispatch mode); every other function goes to torch.compile")  # fmt: skip
# gpu-session scope (Note: [torch.cuda on fake GPUs]); the leaves are listed in cuda_api.patches._LEAVES
declare("torch-cuda-leaves", "torch.cuda, torch.cuda.memory, torch.cuda.random, torch.cuda.graphs, "
        "torch.cuda.streams, torch.accelerator, torch.accelerator.memory", "cuda_api.patches._LEAVES",
        scope="gpu-session", by="fakeviz._engine.cuda_api.patches",
        why="Note: [torch.cuda on fake GPUs]; a leaf a torch lacks is skipped")  # fmt: skip
declare(
    "torch-cuda-objects",
    "torch.cuda, torch.cuda.streams",
    ("Stream", "Event", "default_generators"),
    scope="gpu-session",
    by="fakeviz._engine.cuda_api.patches",
    why="Note: [torch.cuda on fake GPUs]",
)
declare(
    "avoid-device-init",
    "torch._subclasses.fake_tensor.FakeTensorMode",
    "avoid_device_init",
    scope="gpu-session",
    by="fakeviz._engine.cuda_api.patches",
    why="Note: [torch.cuda on fake GPUs]",
)
# record scope
declare(
    "sdpa",
    "torch.nn.functional",
    "scaled_dot_product_attention",
    scope="record",
    by="fakeviz._engine.attention.patch",
    why="the kernel a GPU would pick (fakeviz._engine.attention)",
)
declare(
    "deepcopy",
    "torch.Tensor",
    "__deepcopy__",
    scope="record",
    by="fakeviz._engine.recorder.modes",
    why="Note: [deepcopy of recorded tensors]",
)
declare(
    "tensor-lift",
    "torch, torch.Tensor",
    ("tensor", "as_tensor", "new_tensor"),
    scope="record",
    by="fakeviz._engine.recorder.modes",
    why="Note: [torch.tensor on fake cuda without a GPU] (a fake record on the shim: the data lifted on the cuda "
    "device, as on a GPU)",
)
declare(
    "global-hooks",
    "torch.nn.modules.module, torch.optim.optimizer",
    ("module forward pre/post", "parameter/buffer/module registration", "optimizer step pre/post"),
    scope="record",
    by="fakeviz._engine.recorder.recording",
    kind="global hook",
    why="torch's public global hooks: module and phase tracking, names, optimizer state (recorder/modules.py)",
)
declare("p2p-values", "torch.distributed, torch.distributed.distributed_c10d",
        ("send", "recv", "batch_isend_irecv", "_tensor_to_object", "_object_to_tensor"), scope="record",
        by="fakeviz._engine.distributed",
        why="Note: [values between simulated ranks]: simulate's ranks exchange the values the fake group "
            "does not move")  # fmt: skip
declare("pipeline-meta-inference", "torch.distributed.pipelining.stage.PipelineStage", "_recv_meta", scope="record",
        by="fakeviz._engine.distributed",
        why="Note: [values between simulated ranks]: a stage's gradient metadata from a rank not recorded yet")  # fmt: skip
declare("thread-default-dtype", "torch, transformers.modeling_utils", ("get_default_dtype", "local_torch_dtype"),
        scope="session", by="fakeviz._engine.default_dtype",
        why="Note: [a thread's default dtype]: a build's dtype for its own thread, never torch's process-wide "
            "default")  # fmt: skip
declare("tracing-checks", "transformers.utils.import_utils", "is_fake_tensor", scope="record",
        by="fakeviz._engine.tracing_checks",
        why="Note: [tracing checks under fake tensors]; also a sys.meta_path finder while transformers is "
            "not yet imported")  # fmt: skip


class OnImport:
    """A ``sys.meta_path`` finder that calls ``then(module)`` once module ``name`` has been executed, for a change
    to a library imported while a session is open (put it first in ``sys.meta_path``, through the registry; it
    finds nothing itself). ``around``: a context manager factory the module's code executes in (bitsandbytes'
    package runs as at the top of a script: Note: [bitsandbytes under fake tensors])."""

    def __init__(self, name: str, then: Callable[[Any], None], around: Callable[[], Any] | None = None) -> None:
        self.name = name
        self.then = then
        self.around = around

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec
        then, around = self.then, self.around

        def run(module: Any) -> None:
            with around() if around is not None else contextlib.nullcontext():
                exec_module(module)
            then(module)

        spec.loader.exec_module = run  # this spec's own loader instance
        return spec
