"""Module and phase tracking: the forward module stack, user lines, parameter tables, optimizer hooks."""

from __future__ import annotations

import bisect
import contextlib
import inspect
import os
import sys
import sysconfig
import weakref
from types import CodeType
from typing import Any

import torch

from ..._core.schema import ROLE_BUFFER, ROLE_GRAD, ROLE_INPUT, ROLE_OPT, ROLE_PARAM
from .. import patches as _patches
from ..precision import module_precision
from .common import (
    _N_ST,
    _P_GRAD,
    _P_NAME,
    _P_STORAGE,
    _P_TENSOR,
    _ST_NAME,
    _current_node,
    _get_sequence_nr,
    _graph_task_id,
    _no_torch_function,
    _Tensor,
    is_real_plain,
    tensor_nbytes,
)

_home = _patches.home  # the thread a hook runs for: the record's own is state.owner (Note: [threads] in patches.py)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# the whole fakeviz package, every layer (this file is fakeviz/_engine/recorder/modules.py)
_FAKEVIZ_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep
_STDLIB_DIRS = tuple(
    {os.path.realpath(p) + os.sep for p in (sysconfig.get_paths()["stdlib"], os.path.dirname(os.__file__))}
)


# Note: [code objects by id]
# A code object's hash is not cached: it rehashes its name, bytecode and constants
# on every lookup (about 1 us for a transformers forward), and finding the user's
# line looks up several per op. The caches are keyed by id(code) instead, and every
# code object entered is kept alive in _CODES so its id is never reused.
_INTERNAL_CODE: dict[tuple[str, ...], dict[int, bool]] = {}
_CODES: list[CodeType] = []

# Note: [errors inside library code]
# An op that fails inside library code (``model.generate()``, a transformers init, accelerate) has, as its
# user line, the innermost frame outside torch and fakeviz: a line of the library, and no module is
# running, so "phase init, module <top level>" alone would not say what the user did. ``call_site`` walks
# the stack from the failing op outwards: torch, fakeviz and the standard library are skipped; frames of
# installed packages (site-packages, dist-packages) and of packages passed to ``exclude`` are library
# frames; the first other frame is the user's. The error then names the user's line first, the library
# function that line called (the outermost library frame below it: ``GenerationMixin.generate``) and the
# innermost library line (``_prepare_special_tokens``), each with its source text (``OpsMixin.on_error``).
_INTERNAL, _LIBRARY, _USER = range(3)
_SITE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _in_site_packages(filename: str) -> bool:
    return any(d in filename for d in _SITE_DIRS)


def _package_of(filename: str) -> str:
    """The top-level package of an installed file (``transformers``), else the file's name."""
    for d in _SITE_DIRS:
        if d in filename:
            rest = filename.rsplit(d, 1)[1]
            return rest.split(os.sep, 1)[0].removesuffix(".py")
    return os.path.basename(filename)


def _is_wrapper(code: CodeType) -> bool:
    """A decorator's wrapper (``def wrapper(*args, **kwargs)`` inside the decorator): not what the user called."""
    flags = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS
    return "<locals>" in _qualname(code) and code.co_flags & flags == flags


def _qualname(code: CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+


def _frame_text(f: Any, *, short: bool = False) -> str:
    """``file:line in function``, the op table's form; ``short``: installed files from their package."""
    fn = f.f_code.co_filename
    if short:
        for d in _SITE_DIRS:
            if d in fn:
                fn = fn.rsplit(d, 1)[1]
                break
    return f"{fn}:{f.f_lineno} in {_qualname(f.f_code) if short else f.f_code.co_name}"


def _frame_src(f: Any) -> str:
    import linecache

    return linecache.getline(f.f_code.co_filename, f.f_lineno).strip()


class ModulesMixin:
    """The part of ``_State`` that knows where an op runs: its phase, module and user line.

    Owns the code-object and line caches, the forward module stack and its lines, the module names,
    the autograd sequence-number marks (Note: [backward module attribution]), the roots, modules built
    and optimizers seen, and the parameter table rows. The C core shares ``fw_stack``, ``fw_lines``,
    ``internal_code``, ``line_ids`` and ``module_by_seq_nr`` and calls ``_is_internal``, ``_line_id`` and
    ``_bw_module``.
    """

    def _init_modules(self, exclude: tuple[str, ...]) -> None:
        # code object -> "is torch/fakeviz/stdlib/excluded", shared by every recording with the same prefixes
        self.internal_code: dict[int, bool] = _INTERNAL_CODE.setdefault(exclude, {})  # Note: [code objects by id]
        self.line_ids: dict[tuple[int, int], int] = {}
        self.prefixes = (_TORCH_DIR, _FAKEVIZ_DIR, "<frozen ", *exclude)
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
        self.module_by_seq_nr: dict[int, int] = {}
        self.roots: dict[int, Any] = {}  # id -> weakref of named root modules
        self.built: dict[int, Any] = {}  # id -> weakref of modules built in the block
        self.optimizers: dict[int, Any] = {}  # id -> weakref of optimizers that stepped
        self.p_rows: dict[int, tuple[int, ...]] = {}  # name id -> parameter table row
        self.mod_precision: dict[str, str] = {}  # module path -> its own weights' precision (Note: [weight precision])
        self.p_more: dict[int, list[int]] = {}  # name id -> a quantized weight's other storages (its scales)

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

    def call_site(self, depth: int = 1) -> dict[str, str] | None:
        """Where library code was running when an op failed: Note: [errors inside library code].

        Returns None when the innermost frame outside torch and fakeviz is the user's own code (the op's
        user line says it all) or when no frame is the user's; otherwise ``user`` (the user's line that
        called into the library), ``call`` (the qualified name of the library function that line
        called), ``package``, and ``inner`` (the innermost library line), each line with its ``*_src``.
        """
        try:
            f = sys._getframe(depth + 1)
        except ValueError:
            return None
        lib = []  # library frames, innermost first
        user = None
        while f is not None:
            kind = self._frame_kind(f.f_code)
            if kind == _USER:
                user = f
                break
            if kind == _LIBRARY:
                lib.append(f)
            f = f.f_back
        if not lib or user is None:  # the user's own line is innermost, or no user frame at all
            return None
        # the function the user called: the outermost library frame that is not a decorator's wrapper
        entry = next((e for e in reversed(lib) if not _is_wrapper(e.f_code)), lib[-1])
        inner = lib[0]
        return {
            "user": _frame_text(user),
            "user_src": _frame_src(user),
            "call": _qualname(entry.f_code),
            "package": _package_of(entry.f_code.co_filename),
            "inner": _frame_text(inner, short=True),
            "inner_src": _frame_src(inner),
        }

    def user_frame(self, frames: list[tuple[Any, int]]) -> tuple[Any, int] | None:
        """Of ``frames`` (``(frame, lineno)``, outermost first, as a traceback lists them), the innermost of the
        user's own code; else the innermost library frame (Note: [errors inside library code]); None when all are
        torch's, fakeviz's or the standard library's.

        The same test of a file as the op table's user lines (``_is_internal``: the real paths of torch and
        fakeviz, the standard library, ``exclude=``), never a substring of the path: a user's checkout in a
        folder named ``fakeviz`` or ``torch`` is still the user's.
        """
        library = None
        for f, lineno in reversed(frames):
            kind = self._frame_kind(f.f_code)
            if kind == _USER:
                return f, lineno
            if kind == _LIBRARY and library is None:
                library = (f, lineno)
        return library

    def _frame_kind(self, code: CodeType) -> int:
        """``_INTERNAL`` (torch, fakeviz, the standard library), ``_LIBRARY`` (an installed package or one
        the user excluded) or ``_USER``: Note: [errors inside library code]."""
        fn = code.co_filename
        if not self._is_internal(code):
            return _LIBRARY if _in_site_packages(fn) else _USER
        excluded = self.prefixes[3:]  # after torch, fakeviz and "<frozen "
        if excluded and (fn.startswith(excluded) or os.path.realpath(fn).startswith(excluded)):
            return _LIBRARY
        return _INTERNAL

    def _line_id(self, code: CodeType, lineno: int) -> int:
        key = (id(code), lineno)
        i = self.line_ids.get(key)
        if i is None:
            text = f"{code.co_filename}:{lineno} in {code.co_name}"
            i = self.line_ids[key] = self.builder.tables["lines"].add(text, text)
        return i

    def _bw_module(self) -> int:
        node = _current_node()
        if node is None:
            return -1
        sn = node._sequence_nr()
        mod = self.module_by_seq_nr.get(sn)
        if mod is None:
            i = bisect.bisect_right(self.sn_marks, sn) - 1
            mod = self.sn_mods[i] if i >= 0 else -1
            self.module_by_seq_nr[sn] = mod
        return mod

    @_no_torch_function
    def module_id(self, mod: torch.nn.Module) -> int:
        key = id(mod)
        mid = self.mod_names.get(key)
        if mid is not None and self.mod_refs[key]() is mod:
            return mid
        # a new root: name it and every submodule, register its parameters and buffers
        root = type(mod).__name__
        table = self.builder.tables["modules"]
        classes = self.builder.tables["classes"]
        mod_class = self.builder.mod_class
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
        b = self.builder
        names: dict[int, list[str]] = {}
        for role, items in (
            (ROLE_PARAM, mod.named_parameters(remove_duplicate=False)),
            (ROLE_BUFFER, mod.named_buffers(remove_duplicate=False)),
        ):
            for name, t in items:
                if t is None:
                    continue
                self.tensor_id(t)
                for sid in self.storage_ids(t, -1, role):  # a quantized weight's data and scales: one name
                    names.setdefault(sid, []).append(f"{root}.{name}")
        for sid, ns in names.items():
            text = "|".join(dict.fromkeys(ns))
            b.storage_rows[sid * _N_ST + _ST_NAME] = b.tables["names"].add(text, text)

    def module_registered(self, parent: torch.nn.Module, name: str, sub: Any) -> None:
        """Global submodule-registration hook: remember modules built inside the block."""
        if self.active and _home() == self.owner:
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
        names = self.builder.tables["names"]
        modules = self.builder.tables["modules"]
        root_name = modules.strings[self.mod_names[key]]
        for mname, sub in root.named_modules(remove_duplicate=False):
            mid = self.mod_names.get(id(sub))
            if mid is None:
                continue
            try:
                label = module_precision(sub)  # Note: [weight precision] in fakeviz/_engine/precision.py
            except Exception as exc:  # noqa: BLE001 - a library's attribute that fails to read never stops the record
                self.internal_note("precision", exc)
                label = None
            if label is not None:
                self.mod_precision[modules.strings[mid]] = label
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
        self._name_unnamed_storages()
        pd = self.builder.param_rows
        g = _P_GRAD
        if self.mod_precision:
            self.trace.meta["weight_precision"] = dict(self.mod_precision)
        for row in self.p_rows.values():
            if row[g] < 0:
                row = (*row[:g], self.grad_of.get(row[_P_TENSOR], -1), *row[g + 1 :])
            pd.extend(row)

    def _name_unnamed_storages(self) -> None:
        """Give each parameter/buffer storage still without a name the names of its table rows.

        Parameters replaced in place (``to_empty``, ``.to(device)``: ``Module._apply`` writes
        ``_parameters`` directly, past the registration hook) get new storages that no hook named;
        a storage that already has a name keeps it.
        """
        b = self.builder
        strings = b.tables["names"].strings
        found: dict[int, list[str]] = {}
        for nid, row in self.p_rows.items():
            for sid in (row[_P_STORAGE], *self.p_more.get(nid, ())):
                if 0 <= sid < b.num_storages() and b.storage_rows[sid * _N_ST + _ST_NAME] < 0:
                    found.setdefault(sid, []).append(strings[row[_P_NAME]])
        for sid, names in found.items():
            text = "|".join(dict.fromkeys(names))
            b.storage_rows[sid * _N_ST + _ST_NAME] = b.tables["names"].add(text, text)

    def _param_row(self, t: Any, name_id: int, mid: int, kind: int) -> tuple[int, ...]:
        tid = self.tensor_id(t)
        sids = self.storage_ids(t, -1, ROLE_PARAM if kind == 0 else ROLE_BUFFER)
        sid = sids[0] if sids else -1
        if len(sids) > 1:
            self.p_more[name_id] = sids[1:]
        shape, dt, dev = t.shape, t.dtype, t.device
        try:
            numel = int(t.numel())
            nb = tensor_nbytes(t)  # a quantized weight: its data and scales
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

    def _mark_inputs(self, mod: torch.nn.Module, args: Any) -> None:
        """A top-level module call: its tensor arguments (and keyword arguments) are inputs."""
        kwargs = None
        f = sys._getframe(2)
        if f is not None and f.f_code.co_name == "inner":
            kwargs = f.f_locals.get("kwargs")
        for leaf in torch.utils._pytree.tree_leaves((args, kwargs or {})):
            if isinstance(leaf, _Tensor) and not isinstance(leaf, torch.nn.Parameter):
                self.add_roles(leaf, ROLE_INPUT)

    @_no_torch_function
    def opt_pre(self, opt: Any, *_: Any) -> None:
        if _home() != self.owner:  # torch's global hooks fire in every thread (Note: [threads] in patches.py)
            return
        self.in_optimizer += 1
        if self.active:
            with contextlib.suppress(Exception):
                for group in opt.param_groups:
                    for p in group["params"]:
                        self._mark_grad(p)
                        if self.fake_run and is_real_plain(p):
                            self.keep_real_state(opt, p)  # Note: [real leaves in a fake record]

    @_no_torch_function
    def opt_post(self, opt: Any, *_: Any) -> None:
        if _home() != self.owner:
            return
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

    def _mark(self) -> None:
        self.sn_marks.append(_get_sequence_nr())
        self.sn_mods.append(self.fw_stack[-1] if self.fw_stack else -1)

    def module_class_name(self) -> str | None:
        """The class name of the innermost module in forward now, or None (Note: [values under fake tensors])."""
        if not self.fw_stack:
            return None
        mid = self.fw_stack[-1]
        if not 0 <= mid < len(self.builder.mod_class):
            return None
        return self.builder.tables["classes"].strings[self.builder.mod_class[mid]]

    def fw_pre(self, mod: torch.nn.Module, args: Any) -> None:
        if not self.active or _home() != self.owner:  # another thread's module (Note: [threads] in patches.py)
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
            self.kv_pre(mod, args)  # type: ignore[attr-defined]  # Note: [KV cache storages]
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
        if not self.active or _home() != self.owner:
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
        if not stack and self.kv_open is not None:  # type: ignore[attr-defined]
            self.kv_post(mod, output)  # type: ignore[attr-defined]  # Note: [KV cache storages]
        self._mark()

    @_no_torch_function
    def param_registered(self, mod: torch.nn.Module, name: str, t: Any) -> None:
        if self.active and t is not None and isinstance(t, _Tensor) and _home() == self.owner:
            self.built[id(mod)] = weakref.ref(mod)
            self.storage_id(t, self.builder.num_ops(), ROLE_PARAM)

    @_no_torch_function
    def buffer_registered(self, mod: torch.nn.Module, name: str, t: Any) -> None:
        if self.active and t is not None and isinstance(t, _Tensor) and _home() == self.owner:
            self.built[id(mod)] = weakref.ref(mod)
            self.storage_id(t, self.builder.num_ops(), ROLE_BUFFER)
