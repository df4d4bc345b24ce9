"""The record's vocabulary, declared once: phases, roles, memory categories, op flags and the column layout.

The recorder (Python and the C core, through the header ``fakeviz._engine.native`` generates from
:data:`LAYOUT`), the ``.fvz`` format, every analysis and the explorer read these declarations; nothing
else spells a column position, a phase code or a role bit.
"""

from __future__ import annotations

__all__ = [
    "CATEGORIES", "FLAG_DATA_DEPENDENT", "FLAG_INPLACE", "FLAG_VIEW", "LAYOUT", "PHASES", "ROLES",
    "STRING_TABLES", "TID_BITS", "TID_MASK", "dtype_abbr",
]  # fmt: skip

PHASES = ("init", "forward", "backward", "optimizer", "other")
# What the recorder saw a storage used as (a bitmask per storage, bit i = ROLES[i]):
# a parameter or buffer of a module, an input of a top-level module call, the .grad
# of a leaf, optimizer state, saved for backward (autograd's saved-tensor hooks), or held
# by a KV cache (a transformers Cache seen at a top-level call: fakeviz._engine.kv_cache).
# st_roles is an int8: at most 7 roles.
ROLES = ("parameter", "buffer", "input", "gradient", "optimizer", "saved", "kv_cache")
ROLE_PARAM, ROLE_BUFFER, ROLE_INPUT, ROLE_GRAD, ROLE_OPT, ROLE_SAVED, ROLE_KV = (1 << i for i in range(len(ROLES)))
# Memory categories (see fakeviz._analysis.categories for how roles and phases map onto them).
CATEGORIES = (
    "Parameter", "Buffer", "Gradient", "Optimizer state", "Activation", "KV cache", "Temporary", "Input", "Other",
)  # fmt: skip

FLAG_VIEW = 1  # the op's output aliases an input (schema alias info, no write)
FLAG_INPLACE = 2  # the op writes one of its inputs (in-place or out= variant)
FLAG_DATA_DEPENDENT = 4  # an output shape contains unbacked symbols

# name -> typecode for array.array; NumPy dtypes follow from the item size.
OP_COLS = {
    "op": "i",  # string id in "ops"
    "phase": "b",
    "module": "i",  # string id in "modules", -1 none
    "line": "i",  # string id in "lines", -1 unknown
    "args": "i",  # string id in "args" (template with {} per tensor input)
    "in_end": "q",  # end offset into the inputs column
    "out_end": "q",  # end offset into the output columns
    "flags": "b",
    "flops": "q",  # FLOPs of the op (fakeviz._engine.flops), -1 no formula
}
IN_COLS = {"in_tensor": "q"}
# a recorded tensor's __dict__["_fakeviz_tid"] is base + id, ids in the low TID_BITS bits
# (see Note: [tensor tags] in fakeviz._engine.recorder)
TID_BITS = 40
TID_MASK = (1 << TID_BITS) - 1

OUT_COLS = {
    "out_tensor": "q",
    "out_shape": "i",  # string id in "shapes"
    "out_stride": "i",  # string id in "strides"
    "out_dtype": "h",  # string id in "dtypes"
    "out_device": "h",  # string id in "devices"
    "out_storage": "q",
    "out_offset": "q",
    "out_nbytes": "q",  # -1 when symbolic
}
ST_COLS = {
    "st_device": "h",
    "st_nbytes": "q",  # -1 when symbolic
    "st_alloc": "q",  # op seq that first produced it; -1 existed before recording
    "st_free": "q",  # number of ops recorded when it was freed; -1 alive at the end
    "st_roles": "b",  # bitmask of ROLES
    "st_name": "i",  # string id in "names" (parameter/buffer FQNs joined by "|"), -1
    "st_owner": "q",  # tensor id of the parameter whose gradient/optimizer state this is, -1
    # carried in: alive when this record started, left by an earlier record of the same fake session
    # (a %%fake cell before): the phase code of the op that made it there (init when it existed before
    # any), so it keeps its category; -1 not carried (made here, or an input first seen here)
    "st_carried": "b",
}
# one row per parameter/buffer name of every module seen (tied names get one row each)
P_COLS = {
    "p_name": "i",  # string id in "names": the full name "Root.layers.0.mlp.weight"
    "p_module": "i",  # string id in "modules" of the owning module
    "p_tensor": "q",  # tensor id ($N); tied names share it
    "p_storage": "q",
    "p_offset": "q",
    "p_numel": "q",
    "p_nbytes": "q",  # bytes of this tensor (numel * itemsize), -1 symbolic
    "p_shape": "i",  # string id in "shapes"
    "p_dtype": "h",
    "p_device": "h",
    "p_kind": "b",  # 0 parameter, 1 buffer
    "p_grad": "q",  # storage id of its .grad at the end (-1 none)
}
# tensors first seen as op inputs (never produced by a recorded op): their storage
T_COLS = {"t_tensor": "q", "t_storage": "q"}
# aligned with the "modules" string table
MOD_COLS = {"mod_class": "i"}  # string id in "classes"
ALL_COLS = {**OP_COLS, **IN_COLS, **OUT_COLS, **ST_COLS, **P_COLS, **T_COLS, **MOD_COLS}
STRING_TABLES = ("ops", "modules", "lines", "args", "shapes", "strides", "dtypes", "devices", "names", "classes")

# The row tables the recorder appends to as flat int64 arrays, one fixed-width row per entry:
# (table prefix in the C header, builder attribute, columns). The C core gets its row widths and
# field positions from a header generated from this (fakeviz._engine.native.schema_header).
LAYOUT = (
    ("OP", "op_rows", OP_COLS),
    ("OUT", "out_rows", OUT_COLS),
    ("ST", "storage_rows", ST_COLS),
    ("P", "param_rows", P_COLS),
)


def field(cols: dict[str, str], name: str) -> int:
    """Position of column ``name`` in a row of its table (``field(ST_COLS, "st_free")`` is 3)."""
    return tuple(cols).index(name)


DTYPE_ABBR = {
    "torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16", "torch.bfloat16": "bf16",
    "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8",
    "torch.uint8": "u8", "torch.bool": "b8", "torch.complex64": "c64", "torch.complex128": "c128",
    "torch.float8_e4m3fn": "f8e4m3fn", "torch.float8_e5m2": "f8e5m2",
}  # fmt: skip


def dtype_abbr(dtype: str, *, strip: bool = False) -> str:
    """``"torch.bfloat16"`` -> ``"bf16"``; one without an abbreviation keeps its name (``strip``: less ``torch.``)."""
    short = DTYPE_ABBR.get(dtype)
    if short is not None:
        return short
    return dtype.replace("torch.", "") if strip else dtype
