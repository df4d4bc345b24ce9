"""``Recording`` and ``record()``: a recorded block, from entering the hooks and the mode to the finished record."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ..._core.errors import ArgumentError, FakeVizError, RecordError
from ..._core.record import Record
from .. import arguments as _arguments
from .. import cuda_api as _cuda_api
from .. import cuda_shim as _cuda_shim
from .. import distributed as _distributed
from .. import patches as _patches
from .. import values as _values
from ..session import check_device, gpu_error_from, new_fake_mode, session_patches
from ..tracing_checks import tracing_checks
from .modes import (
    _FakeRecordingMode,
    _install_core_hooks,
    _RealRecordingMode,
    _remove_core_hooks,
    deepcopy_patch,
    lift_patch,
)
from .state import _State

if TYPE_CHECKING:
    from .fake_session import FakeSession

__all__ = ["Recording", "record"]


class Recording:
    """Context manager returned by :func:`record`; ``with fv.record() as trace``.

    ``memory_stats(record, device, since) -> dict`` gives the ``torch.cuda.memory_stats()`` figures of the
    record so far in a fake cuda session (the facade passes :func:`fakeviz._analysis.cuda_stats.memory_stats`,
    the allocator model); without it ``torch.cuda``'s memory functions raise there.
    """

    def __init__(
        self,
        *,
        device: str | torch.device | None,
        dtype: torch.dtype | str | None,
        fake: bool,
        symbolic: bool,
        exclude: str | tuple[str, ...] | list[str],
        modules: torch.nn.Module | tuple[torch.nn.Module, ...] | list[torch.nn.Module],
        session: FakeSession | None = None,
        progress: Any = None,
        attention: str = "auto",
        gpu: str | None = None,
        record_cls: type[Record] = Record,
        gpus: int | str | None = None,
        memory_stats: Callable[[Record, str, int], dict[str, int]] | None = None,
        routing: str | None = "balanced",
    ) -> None:
        from ..._core.gpus import Capacity, read_gpus

        # arguments read as everywhere else (fakeviz._engine.arguments, read_gpus): refused, never changed
        dtype = _arguments.default_dtype(dtype)  # "bf16" as models.build reads it
        device = _arguments.fake_device(device, fake=fake)  # mps, xla, ...: not faked
        exclude = _arguments.one_or_many(exclude, str)  # exclude="transformers" is one package
        modules = _arguments.one_or_many(modules, torch.nn.Module)
        if gpus is not None and not isinstance(gpus, int):  # "8", "8xH100", 1.5: read as plan's gpus= reads them
            asked, (gpus, caps) = gpus, read_gpus(gpus)  # (an int is a count: device_count_for checks its range)
            kinds = {(c.gpu, c.bytes) for c in caps or ()}
            named = Capacity.parse(gpu) if gpu is not None else None
            if len(kinds) > 1 or (kinds and named is not None and (named.gpu, named.bytes) not in kinds):
                other = f", and gpu={gpu!r} names another" if len(kinds) == 1 else ""
                raise ArgumentError("gpus", asked, "a record's GPUs are one kind" + other,
                                    "Give gpus='8xH100', or gpu='H100' with gpus=8.")  # fmt: skip
            if caps and gpu is None:
                gpu = str(caps[0].spec)
        if routing not in _values.ROUTINGS:
            raise ValueError(
                f"routing={routing!r}: use 'balanced' (the default: every expert gets as many tokens), 'skewed' "
                "(every token takes the same experts: the most one expert can get) or None (assume nothing)"
            )
        self.routing = routing
        from ..attention import SETTINGS

        if attention not in (*SETTINGS, "native"):
            raise ValueError(f"attention={attention!r}: use one of {', '.join((*SETTINGS, 'native'))}")
        self.attention = attention
        self.capability = (9, 0)
        if gpu is not None:
            cap = Capacity.parse(gpu).capability  # a clear error for an unknown name
            if cap is not None:
                self.capability = cap
        self.gpu = gpu
        self.gpus = gpus
        self.device_count = _cuda_api.device_count_for(device, gpus)  # a clear error for a bad gpus=
        self.memory_stats = memory_stats
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
                "routing": routing,
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
        stack = self._stack = contextlib.ExitStack()
        stack.callback(_patches.leave, _own_thread())  # one record at a time per process (Note: [threads])
        try:
            state = self._state = _State(self.trace, exclude=prefixes)
            self.trace.meta["recorder_core"] = "c" if state.core is not None else "python"  # Note: [recorder core in C]
            stack.enter_context(session_patches(on_backward=state.backward_event))
            stack.enter_context(self._gpu_session(state))
            mm = torch.nn.modules.module
            for register, hook, kwargs in (
                (mm.register_module_forward_pre_hook, state.fw_pre, {}),
                (mm.register_module_forward_hook, state.fw_post, {"always_call": True}),
                (mm.register_module_parameter_registration_hook, state.param_registered, {}),
                (mm.register_module_buffer_registration_hook, state.buffer_registered, {}),
                (mm.register_module_module_registration_hook, state.module_registered, {}),
                (register_optimizer_step_pre_hook, state.opt_pre, {}),
                (register_optimizer_step_post_hook, state.opt_post, {}),
            ):  # torch's global hooks, through the registry (Note: [patch registry]); each returns at once in
                # another thread (Note: [threads])
                handle: list[Any] = []
                token = _patches.push_call(lambda r=register, h=hook, k=kwargs, out=handle: out.append(r(h, **k)),
                                           lambda out=handle: out.pop().remove(), entry="global-hooks")  # fmt: skip
                stack.callback(_patches.pop, token)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(state.pack_saved, state.unpack_saved))
            stack.enter_context(deepcopy_patch(state))
            stack.callback(self._deactivate)
            stack.callback(self._finish_state)
            for m in self.modules:
                state.module_id(m)
            if self.session is not None:
                self.session.start(state)  # Note: [carried storages]
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
                state.fake_run = True
                _install_core_hooks(mode, state)
                stack.callback(_remove_core_hooks, mode)
                mode._fv_values.recorder = state  # Note: [values under fake tensors]: assumptions, provenance
                stack.callback(setattr, mode._fv_values, "recorder", None)
                stack.callback(setattr, mode._fv_values, "routing", mode._fv_values.routing)
                mode._fv_values.routing = self.routing
                stack.enter_context(tracing_checks(mode, state))  # Note: [tracing checks under fake tensors]
                if shim.mode == "shim":
                    stack.enter_context(lift_patch(mode))  # Note: [torch.tensor on fake cuda without a GPU]
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
                from ..attention import attention_patch

                stack.enter_context(
                    attention_patch(
                        self.attention,
                        self.capability,
                        on_choice=state.attention_choice,
                        on_error=state.attention_error,
                    )
                )
            self.mode = mode
            stack.callback(_patches.leave, _patches.watch(mode))  # finds the workers running its backward
            stack.enter_context(mode)
            if self.device is not None:
                stack.enter_context(torch.device(self.device))
        except BaseException:
            stack.close()
            raise
        return self.trace

    def _gpu_session(self, state: _State) -> Any:
        """torch.cuda answering as the session's GPUs (Note: [torch.cuda on fake GPUs]), memory from the record."""
        on = _cuda_api.answers_as_gpu(fake=self.fake, device=self.device, gpu=self.gpu, gpus=self.gpus)
        trace, stats, b, live = self.trace, self.memory_stats, state.builder, state.live
        return _cuda_api.gpu_session(
            on=on, gpu=self.gpu, count=self.device_count,
            memory=(lambda device, since: stats(trace, device, since)) if stats is not None else None,
            version=lambda: (b.num_ops(), b.num_storages(), len(live)), clock=b.num_ops, meta=trace.meta,
            missing="this recording has no memory model (fakeviz.record gives it one)",
        )  # fmt: skip

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
        with contextlib.suppress(Exception):  # Note: [collectives in the record]: the groups by name
            groups = _distributed.snapshot()
            if groups is not None:
                self.trace.meta["distributed"] = groups
        new = None
        symbolic = self.symbolic or (self.session is not None and self.session.symbolic)
        if exc is not None and symbolic and self._state is not None and not isinstance(exc, RecordError):
            # a branch on a symbolic size: name line, module and op (not in torch.export: guard_error)
            with contextlib.suppress(Exception):
                new = _values.guard_error(self._state, exc)
        try:
            self._stack.close()  # exits the device context, the mode, the hooks: never leaves a mode active
        finally:
            if self._state is not None and self._state.fake_run:
                with contextlib.suppress(Exception):  # Note: [real leaves in a fake record]
                    restored = self._state.restore_real_state()
                    if restored:
                        self.trace.meta["real_state_restored"] = restored
            self.trace.finish()
            if self.session is not None and self._state is not None:
                try:
                    self.session.end(self._state, self.trace)  # Note: [carried storages]
                except Exception as err:  # noqa: BLE001 - the record stays usable; the next block carries less
                    self._state.internal_note("session", err)
            if new is not None:
                new.trace = self.trace
                self.trace.error = {"op": new.op, "module": new.module, "user_line": new.user_line,
                                    "type": type(exc).__name__, "message": str(exc)[:2000]}  # fmt: skip
                raise new from exc
            gpu = gpu_error_from(exc) if exc is not None and not isinstance(exc, RecordError) else None
            if gpu is not None:  # Note: [cuda indices past the GPUs]: torch.tensor(..., device=) moved before dispatch
                gpu.trace = self.trace
                self.trace.error = {"op": gpu.op, "module": None, "user_line": gpu.user_line,
                                    "type": "GPUIndexError", "message": str(gpu)[:2000]}  # fmt: skip
                raise gpu from exc
            if exc is not None:
                if isinstance(exc, RecordError):
                    exc.trace = self.trace
                with contextlib.suppress(Exception):
                    exc.fakeviz_trace = self.trace  # type: ignore[attr-defined]
                if self.trace.error is None:
                    self.trace.error = {"type": type(exc).__name__, "message": str(exc)[:2000], "op": None}
        return False


def _own_thread() -> int:
    """The calling thread opens a record; refused while another thread records (Note: [threads] in patches.py)."""
    try:
        return _patches.enter("record", alone=True)
    except _patches.Busy as busy:
        raise FakeVizError(
            f"fakeviz: another thread is recording (thread {busy.thread!r}); fakeviz records one block at a time per "
            "process: wait for that record to end, or record in another process"
        ) from None


def _package_dir(name: str) -> str:
    """Path prefix of an importable package name, or the string itself if it is a path."""
    if os.sep in name:
        return name
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ArgumentError("exclude", name, f"no package named {name!r}",
                            "Give importable package names (exclude=('transformers',)) or folder paths.")  # fmt: skip
    return os.path.dirname(os.path.realpath(list(spec.submodule_search_locations)[0])) + os.sep + name + os.sep


def record(
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    fake: bool = True,
    symbolic: bool = False,
    exclude: str | tuple[str, ...] | list[str] = (),
    modules: torch.nn.Module | tuple[torch.nn.Module, ...] | list[torch.nn.Module] = (),
    session: FakeSession | None = None,
    progress: Any = None,
    attention: str = "auto",
    gpu: str | None = None,
    record_cls: type[Record] = Record,
    gpus: int | str | None = None,
    memory_stats: Callable[[Record, str, int], dict[str, int]] | None = None,
    routing: str | None = "balanced",
) -> Recording:
    """Record every dispatched aten op of the code in the ``with`` block.

    ``with fv.record(device="cuda:0") as trace:`` runs the block under fake
    tensors (``fake=True``, the default) or real ones (``fake=False``) and fills
    ``trace`` (a ``record_cls``, :class:`~fakeviz._core.record.Record` by default; ``fakeviz.record`` makes a
    :class:`~fakeviz.Trace`).

    Args:
        device: default device inside the block (``"cuda:3"`` works on CPU-only torch). A fake run is on
            ``cuda``, ``cpu`` or ``meta``; ``mps``, ``xla`` and other devices are not faked and are refused.
        dtype: default floating dtype inside the block (``torch.bfloat16`` or a name: ``"bf16"``, as
            ``fakeviz.models.build`` reads it): bf16, fp16, fp32 or fp64, what ``torch.set_default_dtype`` takes.
        fake: record fake tensors (no data, no memory) or a real run.
        symbolic: attach a ShapeEnv so data-dependent output sizes become symbols.
        exclude: packages whose frames are skipped when finding the user's line
            (e.g. ``("transformers",)``, or one name: ``"transformers"``); torch and fakeviz are always skipped.
        modules: modules created before the block whose parameters and buffers
            should be registered (with names) before the first op (a module, or a list of them).
        session: a :class:`FakeSession` to reuse, so fake objects made in an
            earlier block (same session) can be used in this one.
        progress: ``callable(n_ops, phase, module)`` called every 1024 ops.
        attention: which kernel ``scaled_dot_product_attention`` on a fake cuda device
            records: ``"auto"`` (PyTorch's own choice for that GPU, dtype, shape and
            mask: cuDNN or flash or memory-efficient or math), ``"flash"``,
            ``"efficient"``, ``"cudnn"``, ``"math"`` (forced, like ``sdpa_kernel``), or
            ``"native"`` (what this torch build does on a fake device: the math path on
            a CPU-only build). See :mod:`fakeviz._engine.attention`.
        gpu: a GPU name from the catalog (``"H100"``, ``"A100 40GB"``): its compute
            capability drives the attention rules (default H100) and its memory is
            the capacity for the verdict and the allocator model. In a fake cuda session
            (``device="cuda..."``, or ``gpu``/``gpus`` given) ``torch.cuda`` answers as this GPU:
            capability, properties, streams, seeding, and the memory figures (see
            :mod:`fakeviz._engine.cuda_api`).
        gpus: how many GPUs ``torch.cuda.device_count()`` reports in the block (default: the
            device's index + 1): a count, read as ``fv.plan(gpus=...)`` reads it (``8``, ``"8"``; ``"8xH100"``
            is also ``gpu="H100"``).
        routing: what a mixture-of-experts router whose scores are unknown is assumed to pick:
            ``"balanced"`` (every expert gets as many tokens), ``"skewed"`` (every token takes the
            same top-k experts: the most tokens one expert can get) or ``None`` (no assumption).
            It changes the record where code reads the routing (transformers' eager experts); each
            router call is listed in ``fidelity()["assumptions"]``. See Note: [values under fake tensors].

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
        exclude=exclude,
        modules=modules,
        session=session,
        progress=progress,
        attention=attention,
        gpu=gpu,
        record_cls=record_cls,
        gpus=gpus,
        memory_stats=memory_stats,
        routing=routing,
    )
