"""Op recording: one row per outermost aten op, with its inputs, outputs, argument template and FLOPs.

Note: [outermost dispatch only]
FakeTensorMode runs some ops through Python decompositions that re-enter the
mode. Only the outermost dispatch of each thread is recorded, so a fake run
logs exactly the ops a real run logs.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor

from ..._core.errors import DataDependentError, FakeVizError
from ..._core.schema import FLAG_DATA_DEPENDENT, FLAG_INPLACE, FLAG_VIEW, PHASES
from ..flops import op_flops as _op_flops
from ..native_contract import PARAM_NEW_FRAMES_UP
from ..session import DATA_DEPENDENT_ERRORS, check_device, gpu_index_error, past_the_gpus
from ..values import advice as _values_advice
from .common import (
    _DETACH,
    _LIFT_FRESH,
    _N_OP,
    _N_OUT,
    _OP_IN_END,
    _OP_OUT_END,
    _OUT_META,
    _PARAM_NEW,
    _PROGRESS_EVERY,
    _UNSAFE_VIEW,
    P_BACKWARD,
    P_FORWARD,
    P_INIT,
    P_OPTIMIZER,
    P_OTHER,
    _get_ident,
    _graph_task_id,
    _Tensor,
    float_blind,
    has_float,
    is_wrapper,
)

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
    if ta is torch.UntypedStorage or ta is torch.TypedStorage:
        # ``set_(storage, ...)`` (torch.load's rebuild): str() of a storage prints every byte of it (a 16 GB
        # checkpoint's weights as text), and a fake one prints its meta device: its size in bytes only
        return f"Storage({a.nbytes()} bytes)"
    if ta is torch.ScriptObject:  # a collective's process group: Note: [collectives in the record]
        from ..distributed import script_object_text

        return script_object_text(a).replace("{", "{{").replace("}", "}}")
    return str(a).replace("{", "{{").replace("}", "}}")


# Note: [wrapper calls are not ops]
# An op on a wrapper subclass (a DTensor: FSDP2 and tensor-parallel parameters, their gradients and AdamW's
# state) reaches the recording mode first with the wrappers as arguments. FakeTensorMode does not run it: it
# returns NotImplemented, and the subclass's own dispatch then runs the op on its local tensors, which the
# mode records. The NotImplemented call is not recorded (``run_op``, and ``run_op.c`` in the C core): it made
# a row with no outputs and global shapes beside the local op that does the work (38 extra rows in a 2-rank
# AdamW step, ``tests/frontends/test_fsdp_memtracker.py``).


def _wrapper_call(args: tuple[Any, ...], out: Any) -> bool:
    """The call is on a wrapper subclass (DTensor): it runs ops on its inner tensors, which the recorder sees
    too and which carry the work. Counting the outer call as well counted a TP rank's matmul at its global
    shape on top of its local one (and the optimizer's foreach ops twice)."""
    for a in (out, *args):
        items = a if isinstance(a, (list, tuple)) else (a,)
        for x in items:
            if isinstance(x, _Tensor) and is_wrapper(x):
                return True
    return False


def _key_safe(a: Any) -> bool:
    """Whether ``_fmt_arg(a)`` is a function of FakeTensorMode's cache key entry for ``a``
    (``type(a), a``): not for 0.0 (equal to -0.0) or NaN (never equal). See Note: [recorded op cache]."""
    ta = type(a)
    if ta is float:
        return a != 0.0 and a == a
    if ta is list or ta is tuple:
        return all(_key_safe(x) for x in a)
    return True


# Note: [tensor lists in the op log]
# A ``Tensor[]`` argument (cat, stack) and a ``Tensor?[]`` one (index.Tensor, index_put_, _unsafe_index: None
# for a dimension not indexed) are lists whose first item is a tensor or None. Every tensor in such a list
# is an input of the op, named ``$N`` in the log and counted in its inputs (aliasing, lifetimes), like a
# tensor argument: ``aten.index.Tensor($0, [None, $3])``, as torch's LoggingTensorMode prints it. The
# template (``_template``), the Python recorder (``OpsMixin.record``) and the C core (``push_inputs`` in
# ``csrc/fvcore/record.c``) apply the same test, so the ``{}`` of a template and the input ids agree.


def _is_tensor_list(a: Any) -> bool:
    """Whether ``a`` is a (possibly optional-) tensor list: Note: [tensor lists in the op log]."""
    return type(a) is list and bool(a) and (isinstance(a[0], _Tensor) or a[0] is None)


def _template(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> tuple[str, bool, tuple[tuple[int, bool], ...] | None]:
    """The argument text of an op, ``{}`` for each tensor (in the order the recorder takes
    their ids, Note: [tensor lists in the op log]), whether it is a function of FakeTensorMode's
    cache key (``_key_safe``) once the signs of the zeros in ``zeros`` are known, and ``zeros``:
    (position, negative) of every positional argument that is a float zero, or None.
    ``normal_(w, 0.0, std)`` in every layer's init shares one cache entry with
    ``normal_(w, -0.0, std)``: a cached template is reused only for the same signs
    (Note: [recorded op cache])."""
    parts = []
    safe = True
    zeros = None
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            parts.append("{}")
        elif _is_tensor_list(a):
            parts.append(_list_template(a))
            safe = safe and all(_key_safe(x) for x in a if not isinstance(x, _Tensor))
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
            elif _is_tensor_list(v):
                parts.append(k + "=" + _list_template(v))
                safe = safe and all(_key_safe(x) for x in v if not isinstance(x, _Tensor))
            else:
                parts.append(k + "=" + _fmt_arg(v))
                safe = safe and _key_safe(v)
    return ", ".join(parts), safe, zeros


def _list_template(a: list[Any]) -> str:
    return "[" + ", ".join("{}" if isinstance(x, _Tensor) else _fmt_arg(x) for x in a) + "]"


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


def _where(op: str, phase: str, module: str | None, line: str | None, site: dict[str, str] | None) -> tuple[str, str]:
    """How an error names a failing op: a one-line label and the lines under it (each ending in a newline).

    Inside library code (``site``, Note: [errors inside library code]) the label names the library
    function and the user's line that called it, and the lines under it give that line's source, then the
    innermost library line with the phase and module, and its source.
    """
    if site is None:
        src = _source_text(line)
        return f"op {op} (phase {phase}, module {module or '<top level>'}, at {line or '<unknown line>'})", (
            f"    {src}\n" if src else ""
        )
    where = f"op {op} (in {site['call']} of {site['package']}, called at {site['user']})"
    context = (
        (f"    {site['user_src']}\n" if site["user_src"] else "")
        + f"  innermost: {site['inner']} (phase {phase}, module {module or '<top level>'})\n"
        + (f"    {site['inner_src']}\n" if site["inner_src"] else "")
    )
    return where, context


class _DeviceRangeError(FakeVizError, ValueError):
    """A fake cuda device index beyond what the shim provides (cuda:0 .. cuda:63)."""


def _called_from_parameter_new() -> bool:
    # Note: [Parameter detach]
    # nn.Parameter(t) on a tensor *subclass* (a FakeTensor) runs t.detach() in
    # Python, while on a plain tensor it aliases in C++ without dispatching.
    # That detach is bookkeeping of the fake path: it is not recorded, so fake
    # and real runs log the same ops (the Parameter gets its id when first used).
    # A dispatch mode above the recording (FSDPMemTracker) puts its own frames between: look up to
    # PARAM_NEW_FRAMES_UP (24) up, the depth the C core's is generated from (Note: [the C core's contract]).
    f = sys._getframe(3)
    for _ in range(PARAM_NEW_FRAMES_UP):
        if f is None:
            return False
        if f.f_code is _PARAM_NEW:
            return True
        f = f.f_back
    return False


def _source_text(line: str | None) -> str:
    if not line:
        return ""
    try:
        import linecache

        fn, rest = line.rsplit(":", 1)
        return linecache.getline(fn, int(rest.split()[0])).strip()
    except (ValueError, IndexError):
        return ""


class OpsMixin:
    """The part of ``_State`` that records ops: ``record`` (and ``_py_record``, ``_record_full``, ``_output``
    the C core calls for the paths it leaves to Python), ``run_op`` and the errors raised by ops.

    Owns ``op_info``, ``meta_ids``, ``fast`` (Note: [recorded op cache]), ``error_seen`` and ``progress``.
    """

    def _init_ops(self) -> None:
        self.op_info: dict[Any, tuple[int, int]] = {}
        self.meta_ids: dict[tuple[Any, ...], tuple[int, int, int, int]] = {}
        self.op_cache: dict[Any, tuple[Any, ...]] = {}  # Note: [recorded op cache]
        self.error_seen: set[int] = set()
        self.progress: Any = None  # callable(n_ops, phase, module) every 1024 ops

    def _op(self, func: Any) -> tuple[int, int]:
        """The op's string id and its flags (view, in-place), interned once per op."""
        info = self.op_info.get(func)
        if info is None:
            name = str(func)  # "aten.mm.default"
            flags = 0
            schema = func._schema
            if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
                flags |= FLAG_VIEW
            if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
                flags |= FLAG_INPLACE
            info = (self.builder.tables["ops"].add(name, name), flags)
            self.op_info[func] = info
        return info

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
        computed once per entry and reused (``self.op_cache``, keyed by the entry's identity:
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
            self.storage_id(args[0], len(self.builder.op_rows) // _N_OP)
            if out is not args[0] and isinstance(out, _Tensor):
                self._alias_lifted(args[0], out)
        b = self.builder
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
        base, top = self.tid_base, self.tid_limit
        for a in args:
            if isinstance(a, _Tensor):
                tag = a.__dict__.get("_fakeviz_tid")
                in_ids.append(tag - base if tag is not None and base <= tag < top else self.tensor_id(a))
            elif type(a) is list and a and (isinstance(a[0], _Tensor) or a[0] is None):
                # Note: [tensor lists in the op log]
                for x in a:
                    if isinstance(x, _Tensor):
                        in_ids.append(self.tensor_id(x))
        if kwargs:
            for v in kwargs.values():
                if isinstance(v, _Tensor):
                    in_ids.append(self.tensor_id(v))
                elif _is_tensor_list(v):
                    for x in v:
                        if isinstance(x, _Tensor):
                            in_ids.append(self.tensor_id(x))
        if entry is None and func is _DETACH and type(out) is _FakeTensor and len(args) == 1 and not kwargs:
            # no cache entry (Note: [fast fake detach]), but everything but the output's metadata is
            # the same for every plain detach: cache that much under the op itself
            entry = _DETACH
        elif entry is None and func is _UNSAFE_VIEW:
            entry = _own_key(args, kwargs)
        if type(entry) is tuple:  # a key of our own (value equality), see _own_key
            hit = self.op_cache.get(entry)
        else:
            hit = self.op_cache.get(id(entry)) if entry is not None else None
        if hit is not None and (hit[0] is entry or type(entry) is tuple) and _same_zeros(args, hit[6]):
            _, op_id, flags, aid, flops, metas, _ = hit
            if metas is None:  # a detach: its output's metadata is looked up as usual
                flags |= self._output(out)
            else:
                for o, m in zip((out,) if isinstance(out, _Tensor) else out, metas):  # same key, same outputs
                    self._output(o, m)
        else:
            op_id, flags, aid, flops = self._record_full(func, args, kwargs, out, entry)
        b.op_rows.extend((op_id, phase, module, line, aid, len(in_ids), len(b.out_rows) // _N_OUT, flags, flops))
        if self.progress is not None and not len(b.op_rows) % _PROGRESS_EVERY:
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
        if cacheable and float_blind(func) and has_float(args, kwargs):
            cacheable = False  # Note: [float-blind in-place keys]: one cache entry, many floats
        t_args = self.t_args
        aid = t_args.ids.get(tmpl)
        if aid is None:
            aid = t_args.add(tmpl, tmpl)
        # outputs
        b = self.builder
        out_start = len(b.out_rows)
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
            flops = 0 if _wrapper_call(args, out) else _op_flops(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - a formula failing on odd arguments: no figure, not a lost op
            flops = -1
        if cacheable and entry is _DETACH:
            self.op_cache[id(entry)] = (entry, op_id, flags & ~FLAG_DATA_DEPENDENT, aid, flops, None, zeros)
        elif cacheable and not flags & FLAG_DATA_DEPENDENT:
            rows = b.out_rows[out_start:]
            metas = tuple(tuple(rows[i + j] for j in _OUT_META) for i in range(0, len(rows), _N_OUT))
            key = entry if type(entry) is tuple else id(entry)
            self.op_cache[key] = (entry, op_id, flags, aid, flops, metas, zeros)
        return op_id, flags, aid, flops

    def _report_progress(self, phase: int, module: int) -> None:
        try:
            mods = self.builder.tables["modules"].strings
            self.progress(self.builder.num_ops(), PHASES[phase], mods[module] if module >= 0 else None)
        except Exception:  # noqa: BLE001 - a progress display must never break the run
            self.progress = None

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
        interned shape, stride, dtype and device ids, storage offset and nbytes.

        Note: [op log numbering]
        ``$N`` names a tensor *object*, as torch's LoggingTensorMode does (``torch/testing/_internal/
        logging_tensor.py``: one id per tensor in a weak dictionary, arguments numbered before results).
        An input is named by the id it had before the op; a tensor never seen before (a user's input, a
        parameter, the data ``torch.tensor(...)`` built without an op) takes the next id when it is first
        read. An output that is a new tensor takes the next id; an output that *is* an input (an in-place
        op ``add_``, ``uniform_``, ``index_put_``, an ``out=`` op, ``lift_fresh``, which returns its input
        in a real run: Note: [lift_fresh]) keeps that input's id. So ``$2: f32[2, 3] cpu =
        aten.add_.Tensor($2, 1)`` reads "tensor $2, after add_ wrote it", and ``$0 = lift_fresh($0)`` is
        where the constant $0 enters the program. The numbers are those torch's own logging tensor gives
        a real run, line for line (tests/engine/test_oplog.py compares them); the alias and lifetime
        analyses rely on one id per tensor object (``alias.py`` counts an in-place output as a write)."""
        d = t.__dict__
        tag = d.get("_fakeviz_tid")
        base = self.tid_base
        if tag is not None and base <= tag < self.tid_limit:
            tid = tag - base  # the output is an input: Note: [op log numbering]
        else:
            tid = self.next_tensor
            self.next_tensor = tid + 1
            d["_fakeviz_tid"] = base + tid
        flag = 0
        if m is not None:
            sid, stid, dtid, devid, off, nb = m
        elif t.layout is not torch.strided:  # Note: [sparse tensors in the record]
            sid, stid, dtid, devid = self._meta_ids(t.shape, (str(t.layout).removeprefix("torch."),), t.dtype, t.device)
            nb, stor = self.sparse_storage(t, len(self.builder.op_rows) // _N_OP)
            self.builder.out_rows.extend((tid, sid, stid, dtid, devid, stor, 0, nb))
            return 0
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
            stor = (
                hit.sid if hit is not None else self._new_storage(st, key, devid, len(self.builder.op_rows) // _N_OP, 0)
            )
        except (NotImplementedError, RuntimeError):
            stor = -1
        self.builder.out_rows.extend((tid, sid, stid, dtid, devid, stor, off, nb))
        return flag

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
        if depth == 0 and out is not NotImplemented:  # Note: [wrapper calls are not ops]
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
        b = self.builder
        # drop partial input/output rows of the failed op
        last_in, last_out = (
            (b.op_rows[_OP_IN_END - _N_OP], b.op_rows[_OP_OUT_END - _N_OP]) if len(b.op_rows) else (0, 0)
        )
        del b.in_tensor[last_in:]
        del b.out_rows[last_out * _N_OUT :]
        op_id = self._op(func)[0]
        not_rec = self.t_args.add("<not recorded>", "<not recorded>")
        b.op_rows.extend((op_id, P_OTHER, -1, -1, not_rec, last_in, last_out, 0, -1))
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
        modules = self.builder.tables["modules"].strings
        module = modules[mod_id] if mod_id >= 0 else None
        line_id = self.bw_line if phase == "backward" else self.user_line(2)
        line = self.builder.tables["lines"].strings[line_id] if line_id >= 0 else None
        site = self.call_site(1) if phase != "backward" else None  # Note: [errors inside library code]
        where, context = _where(op, phase, module, line, site)
        self.trace.error = {
            "op": op, "module": module, "user_line": line, "phase": phase, "seq": self.builder.num_ops(),
            "type": type(exc).__name__, "message": str(exc)[:2000],
            "call": site["call"] if site else None, "called_at": site["user"] if site else None,
        }  # fmt: skip
        past = past_the_gpus(exc)  # a cuda index past this machine's GPUs: Note: [cuda indices past the GPUs]
        if past is not None:
            err = gpu_index_error(*past, op=op, phase=phase, module=module, user_line=site["user"] if site else line,
                                  context=context)  # fmt: skip
            err.call, err.called_at = (site["call"], site["user"]) if site else (None, None)
            self.trace.error.update(type=type(err).__name__, message=str(err)[:2000])
            self.error_seen.add(id(err))
            return err
        if isinstance(exc, DATA_DEPENDENT_ERRORS):
            first = str(exc).splitlines()[0] if str(exc) else ""
            msg = (
                f"{where} needs the value of a tensor the fake run does not know.\n"
                + context
                + "This comes from `.item()`, `int(t)`, `bool(t)`, `if t:` / `if t.sum() > 0:` on a tensor, "
                "or an op whose output size depends on the values (nonzero, masked_select, unique).\n"
                + _values_advice(exc)  # Note: [values under fake tensors]
                + "\nThe partial trace up to this op is on this exception as `.trace`. "
                f"(torch said: {type(exc).__name__}: {first})"
            )
            err = DataDependentError(msg, op=op, module=module, user_line=line)
            err.call, err.called_at = (site["call"], site["user"]) if site else (None, None)
            self.error_seen.add(id(err))
            return err
        try:
            exc.add_note(f"fakeviz: raised by {where}" + ("\n" + context.rstrip("\n") if site else ""))
        except Exception:  # noqa: BLE001 - add_note unsupported on exotic exceptions
            pass
        return exc

    def note_assumption(self, func: Any, text: str) -> None:
        """List an assumption the op being dispatched rests on (Note: [values under fake tensors]): a row
        ``[seq, op, assumption, module, user_line]`` of ``trace.meta["assumptions"]``."""
        if not self.active:
            return
        phase = self._phase_name()
        mod_id = self._bw_module() if phase == "backward" and not self.fw_stack else (
            self.fw_stack[-1] if self.fw_stack else -1)  # fmt: skip
        line_id = self.bw_line if phase == "backward" else self.user_line(2)
        module = self.builder.tables["modules"].strings[mod_id] if mod_id >= 0 else None
        line = self.builder.tables["lines"].strings[line_id] if line_id >= 0 else None
        self.trace.meta.setdefault("assumptions", []).append([self.builder.num_ops(), str(func), text, module, line])

    def _phase_name(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        if _graph_task_id() >= 0:
            return "backward"
        if self.fw_stack:
            return "forward"
        return "other" if self.seen_forward else "init"

    def internal_note(self, what: str, exc: BaseException) -> None:
        meta = self.trace.meta
        meta["recorder_errors"] = meta.get("recorder_errors", 0) + 1
        meta.setdefault("first_recorder_error", f"{what}: {type(exc).__name__}: {exc}"[:1000])

    def attention_choice(self, backend: str, setting: str, why: dict[str, str]) -> None:
        """Called by the attention patch for every simulated SDPA call (for the fidelity report)."""
        if self.active:
            reason = "; ".join(f"not {k}: {v}" for k, v in why.items())
            calls = self.trace.meta.setdefault("attention_calls", [])
            calls.append([self.builder.num_ops(), backend, setting, reason[:500]])

    def attention_error(self, exc: BaseException) -> BaseException:
        """An attention call failed above the dispatcher (no kernel for these inputs): name where."""
        return self.on_error("aten.scaled_dot_product_attention", exc) if self.active else exc
