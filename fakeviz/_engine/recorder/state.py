"""``_State``: the recording state shared by the fused fake mode and the real-run mode, and the C core over it.

``_State`` is composed of one mixin per concern (ops, storages, autograd, modules). The C core
(Note: [recorder core in C]) calls its methods and reads its attributes by name, so every name stays
on the composed class whichever mixin defines it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorConfig as _FakeTensorConfig

from ..._core.record import Record
from ..._core.schema import ROLE_SAVED
from .. import native as _native
from .. import patches as _patches
from ..kv_cache import KVCacheMixin
from . import fastpath as _fastpath
from .autograd import AutogradMixin
from .common import (
    _DETACH,
    _LIFT_FRESH,
    _PARAM_NEW,
    _PROGRESS_EVERY,
    _UNSAFE_VIEW,
    _current_node,
    _DisableTorchFunction,
    _get_sequence_nr,
    _graph_task_id,
    _no_torch_function,
    _Tensor,
)
from .fastpath import (
    _DETACH_OP,
    _DisableTorchDispatch,
    _fake_dispatch,
    _fast_output_from_entry,
    _meta_in_tls,
    _PreserveDispatchKeyGuard,
    _set_meta_in_tls,
    _throw_mutable_data_ptr,
    _warn_mutable_data_ptr,
    _wrap_fake,
)
from .modules import ModulesMixin
from .ops import OpsMixin, _DeviceRangeError
from .storages import StoragesMixin, _StorageRef


class _State(OpsMixin, StoragesMixin, AutogradMixin, ModulesMixin, KVCacheMixin):
    """Recording state shared by the fused fake mode and the real-run mode."""

    def __init__(self, trace: Record, *, exclude: tuple[str, ...] = ()) -> None:
        self.trace = trace
        b = trace.builder
        assert b is not None
        self.builder = b
        self.active = True
        self.owner = _patches.home()  # the record's thread (Note: [threads] in patches.py)
        self.local = threading.local()
        # the string tables every concern interns into
        self.t_shapes = b.tables["shapes"]
        self.t_strides = b.tables["strides"]
        self.t_dtypes = b.tables["dtypes"]
        self.t_devices = b.tables["devices"]
        self.t_args = b.tables["args"]
        self._init_storages()
        self._init_ops()
        self._init_modules(exclude)
        self._init_autograd()
        self._init_kv()
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
        b = self.builder
        return mod.Core(
            # the state and the containers it shares with the core (mutated in place, never rebound)
            state=self, live=self.live, op_cache=self.op_cache, fw_stack=self.fw_stack, fw_lines=self.fw_lines,
            unpacked=self.unpacked, internal_code=self.internal_code, line_ids=self.line_ids,
            module_by_seq_nr=self.module_by_seq_nr, meta_ids=self.meta_ids, local=self.local,
            op_rows=b.op_rows, out_rows=b.out_rows, in_tensor=b.in_tensor, storage_rows=b.storage_rows,
            # trace layout: the core refuses one other than the layout its header was generated from
            tid_base=self.tid_base, tid_limit=self.tid_limit, layout=_native.layout_signature(), progress_every=_PROGRESS_EVERY,
            role_saved=ROLE_SAVED, owner=self.owner,
            # Python types, ops and functions it compares with or calls
            tensor_type=_Tensor, fake_type=_FakeTensor, storage_ref=_StorageRef, range_error=_DeviceRangeError,
            detach=_DETACH, lift_fresh=_LIFT_FRESH, unsafe_view=_UNSAFE_VIEW, param_new_code=_PARAM_NEW,
            graph_task_id=_graph_task_id, current_node=_current_node, get_sequence_nr=_get_sequence_nr,
            fake_dispatch=_fake_dispatch, output_from_cache_entry=_fast_output_from_entry,
            make_cache_entry=_fastpath._fake_make_entry, wrap_fake=_wrap_fake,
            meta_in_tls=_meta_in_tls, set_meta_in_tls=_set_meta_in_tls, disable_torch_dispatch=_DisableTorchDispatch,
            preserve_dispatch_keys=_PreserveDispatchKeyGuard, detach_op=_DETACH_OP,
            make_subclass=_Tensor._make_subclass, fake_config=_FakeTensorConfig,
            warn_mutable_data_ptr=_warn_mutable_data_ptr, throw_mutable_data_ptr=_throw_mutable_data_ptr,
            disable_tf=_DisableTorchFunction, torch_function_mode_enabled=torch._C._is_torch_function_mode_enabled,
        )  # fmt: skip

    @_no_torch_function
    def finish(self) -> None:
        """At the end of the block: name modules built but never run, fill the parameter table."""
        for ref in list(self.optimizers.values()):
            opt = ref()
            if opt is not None:
                self._mark_optimizer_state(opt)
        self.name_built_roots()
        self.param_table()
