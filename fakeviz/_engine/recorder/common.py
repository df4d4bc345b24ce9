"""What every part of the recorder shares: phase codes, row-layout positions, torch handles, op handles.

The positions come from :mod:`fakeviz._core.schema` (the Python recorder appends whole rows; the C core
gets the same positions from the header ``fakeviz._engine.native`` generates, Note: [recorder core in C]).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..._core.schema import OP_COLS, OUT_COLS, P_COLS, PHASES, ST_COLS, field
from ..quant.bnb import weight_parts

P_INIT, P_FORWARD, P_BACKWARD, P_OPTIMIZER, P_OTHER = range(len(PHASES))

_Tensor = torch.Tensor
_graph_task_id = torch._C._current_graph_task_id
_get_sequence_nr = torch._C._autograd._get_sequence_nr
_get_ident = threading.get_ident
_current_node = torch._C._current_autograd_node

# row widths and the positions the Python recorder reads or writes one field at a time
_N_OP = len(OP_COLS)
_PROGRESS_EVERY = 1024 * _N_OP  # builder.op_rows grows by _N_OP per op: report every 1024 ops
_N_ST = len(ST_COLS)
_N_OUT = len(OUT_COLS)
_ST_FREE = field(ST_COLS, "st_free")
_ST_ROLES = field(ST_COLS, "st_roles")
_ST_NAME = field(ST_COLS, "st_name")
_ST_OWNER = field(ST_COLS, "st_owner")
_ST_ALLOC = field(ST_COLS, "st_alloc")
_ST_CARRIED = field(ST_COLS, "st_carried")
_ST_DEVICE = field(ST_COLS, "st_device")
_ST_NBYTES = field(ST_COLS, "st_nbytes")
_OP_PHASE = field(OP_COLS, "phase")
_OP_IN_END = field(OP_COLS, "in_end")
_OP_OUT_END = field(OP_COLS, "out_end")
_P_GRAD = field(P_COLS, "p_grad")
_P_TENSOR = field(P_COLS, "p_tensor")
_P_NAME = field(P_COLS, "p_name")
_OUT_TENSOR = field(OUT_COLS, "out_tensor")
_OUT_STORAGE = field(OUT_COLS, "out_storage")
_P_STORAGE = field(P_COLS, "p_storage")
# an output's metadata, as the recorded op cache keeps it (Note: [recorded op cache]): interned
# shape, stride, dtype and device ids, storage offset, nbytes (the C core reads the same tuple)
_OUT_META = tuple(
    field(OUT_COLS, name) for name in ("out_shape", "out_stride", "out_dtype", "out_device", "out_offset", "out_nbytes")
)

_DETACH = torch.ops.aten.detach.default
_LIFT_FRESH = torch.ops.aten.lift_fresh.default
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default
_PARAM_NEW = torch.nn.Parameter.__new__.__code__
_DisableTorchFunction = torch._C.DisableTorchFunction


def _no_torch_function(fn: Any) -> Any:
    """Run a recorder hook with torch function handling off (Note: [torch function off while
    recording] in ``csrc/fvcore/record.c``): inside ``torch.device(...)`` every tensor method the hook
    calls would otherwise go through the mode's Python ``__torch_function__``."""

    @functools.wraps(fn)
    def hook(*args: Any, **kwargs: Any) -> Any:
        with _DisableTorchFunction():
            return fn(*args, **kwargs)

    return hook


_PLAIN = (torch.Tensor, torch.nn.Parameter, torch._subclasses.fake_tensor.FakeTensor)


def is_wrapper(t: Any) -> bool:
    """A wrapper tensor subclass (DTensor: an FSDP2 / tensor-parallel parameter): it holds no memory of its own
    and its ops run on its inner tensors, which the recorder sees too (the plain types answer at once)."""
    return type(t) not in _PLAIN and is_traceable_wrapper_subclass(t)


def inner_tensors(t: Any) -> list[Any]:
    """The tensors that hold a wrapper's memory, in ``__tensor_flatten__``'s order, wrappers within unwrapped (a
    DTensor: its local tensor; a torchao ``Int8Tensor``: ``qdata`` and ``scale``; Note: [wrapper tensors hold no
    memory] in ``storages.py``); ``[t]`` for any other tensor."""
    if not is_wrapper(t):
        return [t]
    out: list[Any] = []
    for name in t.__tensor_flatten__()[0]:
        x = getattr(t, name, None)
        if isinstance(x, torch.Tensor):
            out.extend(inner_tensors(x))
    return out


def tensor_nbytes(t: Any) -> int:
    """The bytes a tensor's elements take: a wrapper's are its inner tensors' (an int8 weight and its scales),
    not its outer shape times its outer dtype."""
    if is_wrapper(t):
        return sum(tensor_nbytes(x) for x in inner_tensors(t))
    # a bitsandbytes weight: its packed data and its quant state (Note: [quantized weights in the record])
    return sum(int(x.numel()) * x.element_size() for x in (t, *weight_parts(t)))


def is_real_plain(t: Any) -> bool:
    """A plain real tensor or Parameter (no fake tensor, no subclass): Note: [real leaves in a fake record]."""
    return type(t) is torch.Tensor or type(t) is torch.nn.Parameter


# Note: [float-blind in-place keys]
# AdamW's bias corrections change at every step, so the float lists of its in-place foreach ops
# (``_foreach_div_.ScalarList``, ``_foreach_addcdiv_.ScalarList``) made a new dispatch-cache key at every step,
# and each miss ran the op tensor by tensor through Python meta kernels (an 8B model: 291 tensors per op). An
# in-place op's outputs are its inputs: a float argument's value cannot change their metadata (its *type* can
# decide an error, and stays in the key). The fast key (``fastpath._fast_key``) keys such an op on the floats'
# types only; the recorded op cache (Note: [recorded op cache]) then must not reuse an argument text cached
# for other floats, so these ops with float arguments are never cached there (``OpsMixin._record_full``).
_BLIND: dict[Any, bool] = {}


def float_blind(func: Any) -> bool:
    """Whether ``func`` is an aten op that writes its first argument and returns only aliases of its arguments."""
    blind = _BLIND.get(func)
    if blind is None:
        try:
            schema = func._schema
            first = schema.arguments[0].alias_info if schema.arguments else None
            blind = (
                func.namespace == "aten"
                and first is not None
                and first.is_write
                and all(r.alias_info is not None for r in schema.returns)
            )
        except Exception:  # noqa: BLE001 - not an OpOverload: keyed in full
            blind = False
        _BLIND[func] = blind
    return blind


def has_float(args: Any, kwargs: Any) -> bool:
    """Whether a float is among ``args`` / ``kwargs`` (in lists too)."""
    for a in (*args, *(kwargs or {}).values()):
        if type(a) is float or (type(a) in (list, tuple) and any(type(x) is float for x in a)):
            return True
    return False
