"""A propagated FX graph as a table: one row per node, its value's shape, dtype, device, stride, bytes, storage.

A pure function of :class:`~fakeviz._engine.fx.Propagated` (what :func:`fakeviz._engine.fx.propagate`
returns). Sizes print as PyTorch prints them: ``[s93, 16]`` with symbols (PyTorch names a
symbol after a hash of its source: ``s93`` is ``x.size()[0]``), ``[u0]`` for a size that depends
on data.

Bytes are ``numel * itemsize`` of the node's value (of every tensor in it, for a node with several
outputs). Where that depends on symbols, ``bytes`` is -1 (as in the record's tables), ``bytes_expr`` is the
expression (``64*s93``) and ``bytes_hint`` its value for the example inputs (-1 when a symbol has no value:
an unbacked ``u0``). For concrete sizes the three agree.

Storages: nodes whose values use one untyped storage (a view, a ``getitem`` of a tuple, an in-place op, the
output node and what it returns) get the same ``storage`` id, numbered in graph order from 0, and
``shares_with`` names the other nodes on it. A node with several outputs (``split``, ``var_mean``, the
output node of an exported graph) has ``storage`` -1, its shape, stride, dtype and device are
parenthesised lists, and its ``shares_with`` covers every output.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.fx

from .._engine.fx import Propagated, hint_of, target_text, user_line

__all__ = ["COLUMNS", "INT_COLUMNS", "node_table", "typed"]

COLUMNS = (
    "name",
    "op",
    "target",
    "module",
    "shape",
    "dtype",
    "device",
    "stride",
    "bytes",
    "bytes_expr",
    "bytes_hint",
    "storage",
    "shares_with",
    "value",
    "user_line",
)

#: The integer columns of :func:`node_table` (-1 for none); every other column holds text (or a list).
INT_COLUMNS = ("bytes", "bytes_hint", "storage")


def _module_of(node: torch.fx.Node) -> str:
    """The module path the node ran in (``nn_module_stack`` of export/dynamo graphs, or a call_module target)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    last = list(stack.values())[-1]
    return str(last[0]) if isinstance(last, tuple) else str(last)


def _size_text(x: Any) -> str:
    return str(x)


def _dims_text(dims: Any) -> str:
    return "[" + ", ".join(_size_text(d) for d in dims) + "]"


def _dtype_text(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _as_int(x: Any) -> int | None:
    """``x`` as an int if it is concrete (a plain int, or a SymInt whose expression is a number)."""
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        expr = x.node.expr
        return int(expr) if expr.is_number else None
    return None


def _tensor_bytes(t: torch.Tensor, shape_env: Any) -> tuple[int, str, int]:
    """(bytes or -1, expression text, hint or -1) of ``numel * itemsize``."""
    n = t.numel() * t.element_size()
    concrete = _as_int(n)
    if concrete is not None:
        return concrete, str(concrete), concrete
    hint = hint_of(shape_env, n)
    return -1, str(n), -1 if hint is None else hint


def _flat(val: Any) -> list[Any]:
    if isinstance(val, (list, tuple)):
        out: list[Any] = []
        for v in val:
            out.extend(_flat(v))
        return out
    return [val]


def _storage_key(t: torch.Tensor) -> int:
    # the identity of the untyped storage object (views share it; meta/fake storages have no data_ptr)
    return t.untyped_storage()._cdata


def node_table(prop: Propagated) -> Any:
    """pandas DataFrame, one row per node of the propagated graph, in graph order.

    Columns: name, op (placeholder, get_attr, call_function, call_module, call_method, output), target
    (readable), module (where it ran, if the graph says), shape, dtype, device, stride (text), bytes,
    bytes_expr, bytes_hint (see the module docstring), storage (storage group id, -1 for no tensor or
    several), shares_with (list of the other nodes' names on the same storage), value (the text of a
    non-tensor value: ``s93`` for ``x.size(0)``), user_line (``file:line in function`` when the graph
    recorded stack traces). A node without a value (``None``) has empty texts and -1s.
    """
    import pandas as pd

    env = prop.shape_env
    group: dict[int, int] = {}
    users: dict[int, list[str]] = defaultdict(list)
    keys_of: dict[str, list[int]] = {}
    for node in prop.nodes:
        keys = []
        for t in _flat(prop.values.get(node.name)):
            if isinstance(t, torch.Tensor):
                k = _storage_key(t)
                group.setdefault(k, len(group))
                if k not in keys:
                    keys.append(k)
                    users[k].append(node.name)
        keys_of[node.name] = keys

    rows = []
    for node in prop.nodes:
        val = prop.values.get(node.name)
        row: dict[str, Any] = {
            "name": node.name,
            "op": node.op,
            "target": target_text(node),
            "module": _module_of(node),
            "shape": "",
            "dtype": "",
            "device": "",
            "stride": "",
            "bytes": -1,
            "bytes_expr": "",
            "bytes_hint": -1,
            "storage": -1,
            "value": "",
            "user_line": user_line(node),
        }
        keys = keys_of[node.name]
        row["shares_with"] = [m for k in keys for m in users[k] if m != node.name]
        row["shares_with"] = list(dict.fromkeys(row["shares_with"]))
        if isinstance(val, torch.Tensor):
            b, expr, hint = _tensor_bytes(val, env)
            row.update(
                shape=_dims_text(val.shape),
                dtype=_dtype_text(val.dtype),
                device=str(val.device),
                stride=_dims_text(val.stride()),
                bytes=b,
                bytes_expr=expr,
                bytes_hint=hint,
                storage=group[keys[0]],
            )
        elif isinstance(val, (list, tuple)):
            row.update(_several(_flat(val), env))
        elif val is not None:
            row["value"] = str(val)
            row["dtype"] = type(val).__name__
        rows.append(row)
    return typed(pd.DataFrame(rows, columns=list(COLUMNS)))


def typed(df: Any) -> Any:
    """``df`` with :data:`INT_COLUMNS` as int64 and every other column object, so that an empty table has
    the dtypes of a full one."""
    return df.astype({c: "int64" if c in INT_COLUMNS else "object" for c in df.columns})


def _several(items: list[Any], env: Any) -> dict[str, Any]:
    """The columns of a node with several values (parenthesised per value; bytes summed over tensors)."""
    tensors = [t for t in items if isinstance(t, torch.Tensor)]

    def each(f: Any) -> str:
        return "(" + ", ".join(f(x) if isinstance(x, torch.Tensor) else str(x) for x in items) + ")"

    total = sum(t.numel() * t.element_size() for t in tensors)
    concrete = _as_int(total)
    hint = concrete if concrete is not None else hint_of(env, total)
    return {
        "shape": each(lambda t: _dims_text(t.shape)),
        "stride": each(lambda t: _dims_text(t.stride())),
        "dtype": ", ".join(dict.fromkeys(_dtype_text(t.dtype) for t in tensors)),
        "device": ", ".join(dict.fromkeys(str(t.device) for t in tensors)),
        "bytes": -1 if concrete is None else concrete,
        "bytes_expr": str(total),
        "bytes_hint": -1 if hint is None else hint,
        "value": "" if len(tensors) == len(items) else each(lambda t: "tensor"),
    }
