"""Fake sessions: the torchdistx-style API on top of torch's FakeTensorMode.

``fake_mode()`` makes every tensor created in its scope fake (shape, dtype,
stride, device and storage identity, but no data). It records nothing; see
:func:`fakeviz.record` for that. ``FakeSession`` (one fake mode across several
``record`` blocks) is the recorder's, in :mod:`fakeviz._engine.recorder.fake_session`
(why it is not here: that module's docstring).
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import os
import sys
import sysconfig
import threading
from collections.abc import Iterable, Iterator
from types import CodeType, FrameType
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeCopyMode,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .._core.errors import FakeVizError, RecordError
from . import ctc as _ctc  # the CTC fake rules and the ctc_loss patch (Note: [cuDNN CTC under fake tensors])
from . import cuda_api as _cuda_api
from . import cuda_shim as _cuda_shim
from . import distributed as _distributed
from . import moe as _moe
from . import patches as _patches
from . import pinned as _pinned  # noqa: F401 - the fake rule of aten._pin_memory (Note: [pinned memory under fake tensors])
from . import torchao_patches as _torchao_patches
from .quant import bnb as _bnb

__all__ = [
    "DATA_DEPENDENT_ERRORS", "GPUIndexError", "check_device", "fake_mode", "fakeify", "gpu_error_from",
    "gpu_index_error", "is_fake", "meta_like", "past_the_gpus", "session_patches",
]  # fmt: skip

#: What fake tensors raise when code needs a value they do not carry (``.item()``, ``nonzero``, a branch
#: on data): the recorder, ``prop`` and ``check_export`` all name these "data-dependent".
DATA_DEPENDENT_ERRORS = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)


def is_fake(tensor: Any) -> bool:
    """True if ``tensor`` is a fake tensor (also a fake ``nn.Parameter``)."""
    return isinstance(tensor, FakeTensor)


def meta_like(fake: torch.Tensor) -> torch.Tensor:
    """A meta tensor with the shape, dtype, stride and storage offset of ``fake``; detached.

    Raises ``ValueError`` if ``fake`` is not a fake tensor.
    """
    if not is_fake(fake):
        raise ValueError(f"meta_like expects a fake tensor, got {type(fake).__name__}")
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        return torch.empty_strided(tuple(fake.shape), tuple(fake.stride()), dtype=fake.dtype, device="meta").detach()


# Note: [Module.to on fake parameters]
# nn.Module._apply swaps a fake parameter with its converted twin through
# torch.utils.swap_tensors, which refuses tensors that have weak references. The
# fake tensor converter's MetaConverter memoises fake tensors in
# WeakValueDictionaries, so every fake parameter has one. While a fake session
# is active we route swap_tensors through a wrapper that first drops those memo
# entries for the two tensors (the memo is a cache; losing an entry only costs a
# re-conversion). _apply swaps a fake parameter even where it sets a real one's data
# (``param.data = param_applied``: a dtype change on the same device); after a swap the
# old storage lives on in _apply's local ``param_applied`` until the next parameter's op,
# so it was freed one op later than in the real run. There the wrapper sets the data too.
_patch_lock = threading.Lock()
_patch_depth = 0
_original_swap = torch.utils.swap_tensors


def _drop_memo(t: torch.Tensor) -> None:
    if not isinstance(t, FakeTensor):
        return
    mc = t.fake_mode.fake_tensor_converter.meta_converter
    for key in [k for k, v in list(mc.tensor_memo.items()) if v is t]:
        mc.tensor_memo.pop(key, None)
    if t.__dict__.get("constant") is not None:  # a value (Note: [values under fake tensors]): its alias map
        for refs in t.fake_mode.fake_tensor_converter.constant_storage_mapping.values():
            refs[:] = [r for r in refs if r() is not t]


def _remap_values(*ts: torch.Tensor) -> None:
    """Put tensors with values back in the alias map of their values (after ``_drop_memo``)."""
    for t in ts:
        if isinstance(t, FakeTensor) and t.__dict__.get("constant") is not None:
            t.fake_mode.fake_tensor_converter.add_constant_storage_mapping(t)


def _from_module_apply(t1: torch.Tensor, t2: torch.Tensor) -> bool:
    """Note: [Module.to on fake parameters]: called by ``nn.Module._apply`` where a real parameter would take
    ``param.data = param_applied`` (``compute_should_use_set_data``: a dtype change on its device)."""
    if type(t1) is not FakeTensor or type(t2) is not FakeTensor or t1.fake_device != t2.fake_device:
        return False
    if torch.__future__.get_overwrite_module_params_on_conversion():
        return False
    f = sys._getframe(2)
    for _ in range(4):  # this function's caller, the registry's dispatcher, then Module._apply
        if f is None:
            return False
        if f.f_code.co_name == "_apply" and f.f_code.co_filename.endswith(_MODULE_PY):
            return True
        f = f.f_back
    return False


_MODULE_PY = os.path.join("torch", "nn", "modules", "module.py")


def _swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    _drop_memo(t1)
    _drop_memo(t2)
    # swap_tensors also swaps __dict__; keep the recorder's tensor ids on their Python
    # objects, as `param.data = new` would in a real run (the parameter keeps its id)
    tags = (t1.__dict__.get("_fakeviz_tid"), t2.__dict__.get("_fakeviz_tid"))
    try:
        if _from_module_apply(t1, t2):
            # Module._apply swaps a fake parameter where it sets a real one's data: after a swap the old storage
            # lived on in _apply's local until the next parameter's op, one op longer than in the real run
            raise RuntimeError("fakeviz: set the data, as for a real parameter")
        result = _original_swap(t1, t2)
    except RuntimeError:
        if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)):
            raise
        # A live autograd graph holds t1 (saved for backward), so swap_tensors refuses
        # it; do what Module._apply does for real tensors: move the data into t1.
        with torch.no_grad():
            t1.data = t2
        t1.fake_device = t2.fake_device
        t1.constant = t2.constant  # t1 now holds t2's data, so t2's value (or none)
        _remap_values(t1, t2)
        return None
    for t, tag in zip((t1, t2), tags):
        if tag is None:
            t.__dict__.pop("_fakeviz_tid", None)
        else:
            t.__dict__["_fakeviz_tid"] = tag
    _remap_values(t1, t2)
    return result


# Note: [session patches]
# While any fake session is active (fake_mode() or record(), nestable), a few torch
# functions are routed through fakeviz (each declared in the registry, Note: [patch registry]),
# in the threads that have a session open only (Note: [threads] in patches.py):
#   * torch.utils.swap_tensors: see Note: [Module.to on fake parameters];
#   * torch.autograd.backward / grad: remember the user line that started a backward
#     (for ops run on autograd worker threads), let worker threads drain (Note:
#     [autograd worker exit race]) and turn the engine's INTERNAL ASSERT about device
#     queues into a FakeVizError that says why and what to do;
#   * FakeTensor joins torch.optim's and torch.utils._foreach_utils' lists of types that take the
#     foreach kernels (as DTensor does on import): see Note: [foreach on fake tensors];
#   * torch._utils._rebuild_tensor (torch.load): Note: [torch.load under fake tensors];
#   * on a CUDA build that sees no GPU, scaled_dot_product_attention on fake cuda takes the math path
#     where a record does not choose a kernel (_native_attention);
#   * on the shim, torch.cuda.amp.common.amp_definitely_not_available and
#     torch.cuda.is_bf16_supported, so torch.autocast("cuda") runs under fake cuda as
#     it would on a GPU instead of disabling itself (cuda_api.autocast_support). The rest of
#     torch.cuda answers as a GPU only in a fake cuda session (Note: [torch.cuda on fake GPUs]).
_backward_listeners: list[tuple[int, Any]] = []  # (thread, listener) of the open sessions


def _translate_engine_error(exc: RuntimeError) -> BaseException:
    msg = str(exc)
    if "device_ready_queues_" not in msg:
        return exc
    reason = _cuda_shim.status().reason
    return FakeVizError(
        "fakeviz: torch's autograd engine cannot run backward on this fake cuda device. "
        + (reason + " " if reason else "")
        + "(fake cuda devices are cuda:0 .. cuda:63; import fakeviz before running any backward in the process)"
    )


def _autograd_entry(original: Any, is_grad: bool) -> Any:
    """Wrap torch.autograd.backward / grad: listeners, error translation, worker drain.

    Listeners are called as ``cb(when, args, kwargs, is_grad)`` with ``when`` "before"
    and "after" (also after an error), those of the calling thread's sessions only.
    """

    def entry(*args: Any, **kwargs: Any) -> Any:
        here = _patches.home()  # the listeners of this thread's sessions only (Note: [threads])
        listeners = [cb for thread, cb in _backward_listeners if thread == here]
        for cb in listeners:
            cb("before", args, kwargs, is_grad)
        try:
            return original(*args, **kwargs)
        except RuntimeError as exc:
            new = _translate_engine_error(exc)
            if new is exc:
                raise
            raise new from exc
        finally:
            _cuda_shim.drain_autograd_workers(1)
            for cb in listeners:
                with contextlib.suppress(Exception):
                    cb("after", args, kwargs, is_grad)

    entry.__wrapped__ = original  # type: ignore[attr-defined]
    return entry


_original_backward = torch.autograd.backward
_original_grad = torch.autograd.grad
_backward = _autograd_entry(_original_backward, False)
_grad = _autograd_entry(_original_grad, True)


# Note: [foreach on fake tensors]
# Optimizers (SGD, Adam, AdamW, ...) and clip_grad_norm_ choose their multi-tensor "foreach" kernels by
# ``type(p) in _foreach_supported_types`` and the device type: a real run on cuda takes foreach by
# default, and clip_grad_norm_ takes it on cpu too. A fake parameter's type is FakeTensor, not in those
# lists, so a fake run silently took the per-tensor loop: other ops, and on cuda a lower peak (measured
# on an H200: AdamW on a 4-layer GPT-NeoX, fake peak 15 % below torch.cuda.max_memory_allocated; equal
# with this patch). While a fake session is active FakeTensor is in both lists, so the device type alone
# decides, as it does for the real tensors the fake ones stand for.
_FOREACH_LISTS: tuple[list[Any], ...] = ()


def _foreach_lists() -> tuple[list[Any], ...]:
    global _FOREACH_LISTS
    if not _FOREACH_LISTS:
        import torch.optim.optimizer as optim_mod
        import torch.utils._foreach_utils as foreach_utils

        _FOREACH_LISTS = tuple(
            lst for lst in (getattr(optim_mod, "_foreach_supported_types", None),
                            getattr(foreach_utils, "_foreach_supported_types", None))
            if isinstance(lst, list)
        )  # fmt: skip
    return _FOREACH_LISTS


_session_tokens: list[int] = []


def _apply_patches(on: bool) -> None:
    """Install (``on``) or undo the patches of Note: [session patches], through the registry (Note: [patch
    registry])."""
    if on:
        tokens = [_patches.push_member(lst, FakeTensor, entry="foreach-types") for lst in _foreach_lists()]
        tokens += [
            _patches.push(torch.utils, "swap_tensors", _swap_tensors, entry="swap-tensors"),
            _patches.push(torch.autograd, "backward", _backward, entry="autograd-entry"),
            _patches.push(torch.autograd, "grad", _grad, entry="autograd-entry"),
            _patches.push(torch.UntypedStorage, "resize_", _resize, entry="storage-resize"),
            _patches.push(torch._utils, "_rebuild_tensor", _rebuild_tensor, entry="rebuild-tensor"),
        ]
        _session_tokens.extend(tokens)
    else:
        while _session_tokens:
            _patches.pop(_session_tokens.pop())
    _cuda_api.autocast_support(on)
    _native_attention(on)
    _ctc.patch_ctc_loss(on)  # Note: [cuDNN CTC under fake tensors]
    _distributed.patch_sharding_prop(on)  # Note: [DTensor's shadow propagation]
    _torchao_patches.session_patches(on)  # Note: [torchao on fake GPUs]
    _bnb.patch(on)  # Note: [bitsandbytes under fake tensors]


_native_sdpa = contextlib.ExitStack()


def _native_attention(on: bool) -> None:
    """Note: [fake cuda on a CUDA build without a GPU]: torch's own choice of attention kernel for a cuda
    tensor (``_fused_sdp_choice``'s CUDA kernel) asks the cuDNN version and the device's properties, which a
    build that sees no GPU cannot answer. There, while a fake session is active, scaled_dot_product_attention on
    fake cuda takes the math path, which is what a CPU-only build does with it; a record's ``attention=``
    other than ``"native"`` decides above it (patches nest)."""
    st = _cuda_shim.status()
    if on and st.mode == "shim" and st.build == "cuda":
        from .attention import attention_patch

        _native_sdpa.enter_context(attention_patch("math", entry="sdpa-native"))
    elif not on:
        _native_sdpa.close()


_original_resize = torch.UntypedStorage.resize_
_original_rebuild = torch._utils._rebuild_tensor


def _rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any) -> Any:
    """Note: [torch.load under fake tensors]
    ``torch.load`` in a fake mode makes each storage on meta, with the device it was saved from in
    ``_fake_device`` (the real load would put it there, or where ``map_location`` says), rebuilds each tensor
    as ``torch.empty((0,), device=<the storage's device: meta>).set_(storage, ...)`` and only then gives the
    tensor its fake device. Recorded, that was two ops and two storages on a ``meta`` device. Here the empty
    tensor is made on the restore device, as in a real load, so the op log and the storages are a real load's."""
    untyped = storage._untyped_storage
    loc = getattr(untyped, "_fake_device", None)
    if loc is None or untyped.device.type != "meta" or torch._guards.detect_fake_mode(None) is None:
        return _original_rebuild(storage, storage_offset, size, stride)
    device = torch._utils._get_restore_location(loc)
    t = torch.empty((0,), dtype=storage.dtype, device=device)
    return t.set_(untyped, storage_offset, size, stride)


def _resize(self: Any, size: int) -> Any:
    """``UntypedStorage.resize_`` that tells a recording (Note: [storage resize] in the recorder)."""
    old = self.nbytes()
    out = _original_resize(self, size)
    if old != size:
        mode = torch._guards.detect_fake_mode()
        state = getattr(mode, "_fv_state", None)
        if state is not None and state.active:
            state.storage_resized(self, int(size))
    return out


@contextlib.contextmanager
def session_patches(on_backward: Any = None, mode: Any = None) -> Iterator[None]:
    """Apply the patches of Note: [session patches] while the context is active (nestable). They answer in the
    threads that have a session open (and autograd's workers running their backward: ``mode``, the session's fake
    mode, finds those; Note: [threads] in ``patches.py``); ``on_backward`` hears this thread's backward calls."""
    global _patch_depth
    with _patch_lock:
        scopes = [_patches.enter("session")] + ([_patches.watch(mode)] if mode is not None else [])
        _patch_depth += 1
        if _patch_depth == 1:
            _apply_patches(True)
        listener = (_patches.home(), on_backward)
        if on_backward is not None:
            _backward_listeners.append(listener)
    try:
        yield
    finally:
        with _patch_lock:
            try:
                if on_backward is not None:
                    _backward_listeners.remove(listener)
                _patch_depth -= 1
                if _patch_depth == 0:
                    _apply_patches(False)
            finally:
                for scope in scopes:
                    _patches.leave(scope)


def check_device(device: str | torch.device | None) -> None:
    """Reject devices fakeviz cannot fake (cuda index past the fake device count; with real GPUs, past them:
    :class:`GPUIndexError`, Note: [cuda indices past the GPUs])."""
    if device is None:
        return
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        st = _cuda_shim.status()
        count = st.device_count or 64
        if st.cuda_ok and not 0 <= dev.index < count:
            if st.mode == "native":
                raise GPUIndexError(
                    f"{dev} is past this machine's {_gpus(count)}: fake cuda devices here are cuda:0 .. "
                    f"cuda:{count - 1} (torch's own CUDA guard serves them)\n{_gpu_advice(count)}",
                    device=dev,
                )
            raise ValueError(f"fake cuda devices are cuda:0 .. cuda:{count - 1}; got {dev}")


# Note: [cuda indices past the GPUs]
# On a CUDA build that sees GPUs (mode "native" in cuda_shim) torch's own CUDA guard serves fake cuda tensors, so
# a fake tensor can live on this machine's indices only: FakeTensor's constructor initialises its device
# (``init_gpu_context``: a real ``torch.empty(1, device=...)``), and FakeTensorMode folds a constant onto a device
# by running the op for real. An index past the GPUs made torch raise ``AcceleratorError: CUDA error: invalid
# device ordinal`` from deep inside FakeTensorMode, naming neither the index nor the user's line. fakeviz raises one
# short GPUIndexError instead (the user's line and "cuda:7 is past this machine's 1 GPU", then what to do):
#   * record(device=), fake_mode(device=) and fakeify(device=) refuse such a device up front (check_device);
#   * fake_mode() turns torch's refusal into it where it leaves the block (its mode is torch's own FakeTensorMode:
#     a subclass would lose the FakeTensorMode rules of higher-order ops, ``torch.cond``, ``flex_attention``, which
#     torch looks up by the mode's exact type), naming the user's innermost line and the failing op;
#   * a record's recorder turns torch's refusal, and its own (an op's output on such an index, which it checks
#     when it first sees a device), into it (``OpsMixin.on_error``, with the op, phase and module).
# torch's message does not say which index it refused: it is read from the failing frames' locals (the
# ``device`` argument of ``init_gpu_context``, an op's ``kwargs``), innermost first; "a cuda index" where none is
# found. Any cuda index past the GPUs there is one torch refused, as no tensor can exist on one. In "shim" mode
# nothing changes (cuda:0 .. cuda:63 exist; check_device's ValueError past them).
class GPUIndexError(RecordError, ValueError):
    """A fake cuda tensor asked for on an index past this machine's GPUs where torch's own CUDA guard serves fake
    cuda (Note: [cuda indices past the GPUs]). ``device`` is that device (None where torch did not say which)."""

    def __init__(
        self,
        message: str,
        *,
        device: torch.device | None,
        op: str | None = None,
        module: str | None = None,
        user_line: str | None = None,
    ) -> None:
        super().__init__(message, op=op, module=module, user_line=user_line)
        self.device = device


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _gpu_advice(count: int) -> str:
    return (
        f"Fake cuda tensors here can use cuda:0 .. cuda:{count - 1} only (a CUDA build of torch that sees GPUs serves "
        "them with its own CUDA guard): use one of those. To plan for more GPUs (fv.simulate, fv.plan(parallel=...)) "
        "or any cuda:N, run where fakeviz fakes cuda:0 .. cuda:63: a machine without GPUs, or here a virtual "
        "environment with torch's CPU wheel (hiding the GPUs with CUDA_VISIBLE_DEVICES= is not enough: measured on an "
        "H100, torch still initialises CUDA for fake tensors and fails)."
    )


def gpu_index_error(
    device: torch.device | None,
    count: int,
    *,
    op: str | None,
    user_line: str | None,
    context: str = "",
    phase: str | None = None,
    module: str | None = None,
) -> GPUIndexError:
    """The short error of Note: [cuda indices past the GPUs]: ``user_line`` and the index on its first line (with
    the op, and in a record its ``phase`` and ``module``), then ``context`` (lines ending in a newline: the source
    of that line) and what to do."""
    what = str(device) if device is not None else "a cuda index"
    first = f"{user_line}: " if user_line else ""
    label = f" (op {op}" + (f", phase {phase}, module {module or '<top level>'})" if phase is not None else ")")
    return GPUIndexError(
        f"{first}{what} is past this machine's {_gpus(count)}{label if op else ''}\n{context}{_gpu_advice(count)}",
        device=device, op=op, module=module, user_line=user_line,
    )  # fmt: skip


def past_the_gpus(exc: BaseException) -> tuple[torch.device | None, int] | None:
    """``(device, GPU count)`` when ``exc`` refused a cuda index past this machine's GPUs in mode "native" (Note:
    [cuda indices past the GPUs]): torch's ``invalid device ordinal``, or fakeviz's own check wrapped in another
    fakeviz error (the recorder's); ``device`` is None where it cannot be found. None for any other error."""
    st = _cuda_shim.status()
    if st.mode != "native" or isinstance(exc, GPUIndexError) or not isinstance(exc, RuntimeError | ValueError):
        return None
    if isinstance(exc, FakeVizError):
        inner = exc.__context__  # the recorder's range error is raised "from None" on check_device's
        return (inner.device, st.device_count) if isinstance(inner, GPUIndexError) else None
    if "invalid device ordinal" not in str(exc):
        return None
    for f in reversed(_tb_frames(exc)):  # innermost first
        device = _device_past(f.f_locals.values(), st.device_count)
        if device is not None:
            return device, st.device_count
    return None, st.device_count


def _tb_frames(exc: BaseException) -> list[FrameType]:
    """The frames ``exc`` went through, outermost first."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _device_past(values: Iterable[Any], count: int) -> torch.device | None:
    """The first cuda device with an index >= ``count`` among ``values`` and the items of their dicts, tuples, lists."""
    for v in values:
        items = v.values() if isinstance(v, dict) else v if isinstance(v, tuple | list) else (v,)
        for x in items:
            if isinstance(x, torch.device) and x.type == "cuda" and x.index is not None and x.index >= count:
                return x
    return None


def _real_dir(path: str) -> tuple[str, ...]:
    return tuple({path + os.sep, os.path.realpath(path) + os.sep})


# what is not the user's code, as the recorder's user lines count it (recorder/modules.py): torch, fakeviz, the
# standard library (but not what is installed below it)
_NOT_USER = (*_real_dir(os.path.dirname(torch.__file__)), *_real_dir(os.path.dirname(os.path.dirname(__file__))),
             "<frozen ")  # fmt: skip
_STDLIB = (*_real_dir(sysconfig.get_paths()["stdlib"]), *_real_dir(os.path.dirname(os.__file__)))


def _is_user(code: CodeType) -> bool:
    fn = code.co_filename
    real = os.path.realpath(fn) if not fn.startswith("<") else fn
    if fn.startswith(_NOT_USER) or real.startswith(_NOT_USER):
        return False
    return not real.startswith(_STDLIB) or "site-packages" in real or "dist-packages" in real


def _user_line(frames: Iterable[FrameType]) -> tuple[str | None, str]:
    """``file:line in function`` of the first of ``frames`` that is the user's code, and its source line (as a
    context line: indented, ending in a newline; empty if none)."""
    for f in frames:
        if _is_user(f.f_code):
            src = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
            return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}", f"    {src}\n" if src else ""
    return None, ""


def gpu_error_from(exc: BaseException) -> GPUIndexError | None:
    """Note: [cuda indices past the GPUs]: torch's refusal, out of a fake_mode() block, as the short error (naming the
    innermost user line in its traceback); None for any other error."""
    past = past_the_gpus(exc)
    if past is None:
        return None
    frames = _tb_frames(exc)[::-1]  # innermost first
    line, context = _user_line(frames)  # the innermost line of the user's
    op = next((f.f_locals["func"] for f in frames if isinstance(f.f_locals.get("func"), torch._ops.OpOverload)), None)
    return gpu_index_error(*past, op=str(op) if op is not None else None, user_line=line, context=context)


def new_fake_mode(
    *, symbolic: bool = False, cls: type[FakeTensorMode] = FakeTensorMode, shape_env: Any = None, **kwargs: Any
) -> Any:
    """A FakeTensorMode configured the fakeviz way (non-fake inputs allowed).

    ``symbolic=True`` attaches a new ``ShapeEnv`` (data-dependent sizes become symbols), or ``shape_env``
    if one is given.
    """
    _cuda_shim.ensure_fake_cuda()
    if symbolic and shape_env is None:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        shape_env = ShapeEnv(allow_dynamic_output_shape_ops=True)
    # fakeviz's fake rules apply to the modes it makes (Note: [grouped_mm under fake tensors])
    return _moe.adopt(cls(allow_non_fake_inputs=True, shape_env=shape_env, **kwargs))


@contextlib.contextmanager
def fake_mode(*, device: str | torch.device | None = None, symbolic: bool = False) -> Iterator[FakeTensorMode]:
    """Instantiate every tensor created in this scope as a fake tensor.

    ``device`` optionally sets the default device inside the scope (``"cuda:0"``
    works on a CPU-only torch build too; with a cuda device ``torch.cuda`` answers as an H100
    machine with ``index + 1`` GPUs, see :mod:`fakeviz._engine.cuda_api`). ``symbolic=True`` attaches a ShapeEnv
    so data-dependent output shapes (``nonzero``) become symbolic sizes.
    Yields the underlying :class:`~torch._subclasses.fake_tensor.FakeTensorMode`.
    """
    from . import arguments as _arguments

    device = _arguments.fake_device(device)  # mps, xla, ...: not faked (the same refusal as record(device=))
    if device is not None:
        _cuda_shim.ensure_fake_cuda()
        _cuda_shim.warn_if_unavailable(device)
    check_device(device)
    mode = new_fake_mode(symbolic=symbolic)
    with contextlib.ExitStack() as stack:
        stack.enter_context(session_patches(mode=mode))
        on = _cuda_api.answers_as_gpu(fake=True, device=device, gpu=None, gpus=None)
        stack.enter_context(_cuda_api.gpu_session(on=on, count=_cuda_api.device_count_for(device, None)))
        stack.enter_context(mode)
        if device is not None:
            stack.enter_context(torch.device(device))
        try:
            yield mode
        except RuntimeError as exc:
            new = gpu_error_from(exc)  # Note: [cuda indices past the GPUs]
            if new is None:
                raise
            raise new from exc


def fakeify(
    obj: Any,
    *,
    mode: FakeTensorMode | None = None,
    device: str | torch.device | None = None,
) -> Any:
    """A fake copy of a real or meta tensor, module, or nested container (dict, list, tuple) of them.

    Aliasing survives the copy: tied weights stay tied, views stay views of the same storage. ``mode`` is
    the fake mode to convert into (the active one, or a new one). ``device`` moves the copy there
    afterwards, as ``.to(device)`` would: a module with ``Module.to`` (tied parameters stay one
    parameter), each tensor of a container once (one tensor object in two places stays one object; a
    view moved on its own becomes a tensor of its own, as in PyTorch). ``obj`` is left as it is.

    Meta to fake: a model built on the meta device (``with torch.device("meta"): model = Model(cfg)``,
    no memory) becomes a fake model on any device, tied weights kept::

        model = fakeify(meta_model, device="cuda:0")   # every parameter and buffer a fake tensor on cuda:0

    Without ``device`` the copy stays on device ``meta``. Call it before a :func:`fakeviz.record` block
    rather than inside: inside, the copy's ops (``clone`` on meta, ``_to_copy``) are recorded too.
    The parameters get their names in the trace when the model first runs forward in the block.

    By contrast, ``meta_model.to_empty(device="cuda:0")`` inside ``fakeviz.record`` records one new
    storage per parameter and buffer entry, and unties tied weights exactly as PyTorch does (re-tie them,
    e.g. ``model.tie_weights()`` in transformers). A state dict loaded with
    ``torch.load(path, map_location="meta", weights_only=True)`` becomes fake with ``fakeify(sd,
    mode=model_mode, device="cuda:0")`` and goes into a fake model with ``load_state_dict(sd,
    assign=True)`` (then re-tie: loading assigns each key its own tensor).
    """
    if mode is None:
        mode = torch._guards.detect_fake_mode() or new_fake_mode()
    with torch._subclasses.fake_tensor.unset_fake_temporarily(), FakeCopyMode(mode):
        out = copy.deepcopy(obj)
    if device is not None:
        check_device(device)
        with session_patches(), mode:
            out = _to_device(out, torch.device(device), {})
    return out


def _to_device(obj: Any, device: torch.device, memo: dict[int, Any]) -> Any:
    """``obj`` with every module and tensor in it moved to ``device``, each object once (``memo``: id -> moved)."""
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.nn.Module):
        out = obj.to(device)
    elif isinstance(obj, torch.Tensor):
        out = obj.to(device)
        if isinstance(obj, torch.nn.Parameter) and not isinstance(out, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=obj.requires_grad)
    elif isinstance(obj, dict):
        out = copy.copy(obj)  # keeps the dict's type (OrderedDict) and attributes (a state dict's _metadata)
        for k, v in obj.items():
            out[k] = _to_device(v, device, memo)
    elif isinstance(obj, list):
        out = [_to_device(v, device, memo) for v in obj]
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        out = type(obj)(*(_to_device(v, device, memo) for v in obj))
    elif isinstance(obj, tuple):
        out = tuple(_to_device(v, device, memo) for v in obj)
    else:
        return obj
    memo[id(obj)] = out
    return out
