"""The nodes of an exported program as a table: :func:`fakeviz._analysis.fx_nodes.node_table`, plus what
the export knows.

A pure function of a ``torch.export.ExportedProgram``. Its graph already holds every node's fake value
(``node.meta["val"]``: a fake tensor, a symbolic or plain number, or a tuple of them), so the program is
read as a :class:`~fakeviz._engine.fx.Propagated` (no propagation runs) and :func:`node_table` makes the
table: shape, stride, dtype, device, bytes, storage and the user's line are written exactly as
``fakeviz.prop`` writes them (``[s0, 6]``, ``float32``, ``cuda:0``; ``""`` and -1 for a node without a
tensor). What only the export knows is added on top: the ``kind`` of each node (from the program's graph
signature), a placeholder's ``target`` (the parameter, buffer or input it stands for) and ``module``
paths that start with the exported model's class name (``MLP.fc1``), as a trace's module column does.
"""

from __future__ import annotations

from typing import Any

import torch

from .._engine.fx import Propagated
from .._engine.session import new_fake_mode
from .fx_nodes import COLUMNS, node_table, typed

__all__ = ["NODE_COLUMNS", "export_nodes"]

#: The columns of :func:`export_nodes`, in order: :data:`fakeviz._analysis.fx_nodes.COLUMNS` with
#: ``kind`` after ``target``.
NODE_COLUMNS: tuple[str, ...] = (
    *COLUMNS[: COLUMNS.index("target") + 1],
    "kind",
    *COLUMNS[COLUMNS.index("target") + 1 :],
)

_INPUT_KINDS = {
    "USER_INPUT": "input",
    "PARAMETER": "parameter",
    "BUFFER": "buffer",
    "CONSTANT_TENSOR": "constant",
    "CUSTOM_OBJ": "object",
    "TOKEN": "token",
}


def export_nodes(program: Any) -> Any:
    """pandas DataFrame, one row per node of ``program``'s graph, in graph order.

    Columns (:data:`NODE_COLUMNS`): those of :func:`fakeviz._analysis.fx_nodes.node_table` (name, op, target,
    module, shape, dtype, device, stride, bytes, bytes_expr, bytes_hint, storage, shares_with, value,
    user_line; see there), with ``kind`` after ``target``: ``parameter``, ``buffer``, ``input``,
    ``constant``, ``op`` (a ``call_function``), ``output``, or the node's ``op`` otherwise. Export-specific:
    a placeholder's ``target`` is the parameter, buffer or input it stands for (``fc1.weight``, ``x``);
    ``module`` starts with the exported model's class name (``MLP.fc1``; ``MLP`` for the model's own
    code; a parameter's or buffer's owner for its placeholder). ``None`` is program=None: an empty
    table with these columns and dtypes.
    """
    import pandas as pd

    if program is None:
        return typed(pd.DataFrame(columns=list(NODE_COLUMNS)))
    df = node_table(_as_propagated(program))
    inputs = _input_specs(program)
    root = _root_name(program)
    kinds, targets, modules = [], [], []
    for node, target, module in zip(program.graph_module.graph.nodes, df["target"], df["module"]):
        if node.op == "placeholder":
            kind, target = inputs.get(node.name, ("input", node.name))
            if kind in ("parameter", "buffer", "constant") and target:
                owner = target.rpartition(".")[0]
                module = f"{root}.{owner}" if owner else root
        elif node.op == "output":
            kind = "output"
        else:
            kind = "op" if node.op == "call_function" else node.op
            module = _module(node.meta.get("nn_module_stack"), root) or module
        kinds.append(kind)
        targets.append(target)
        modules.append(module)
    df["target"], df["module"] = targets, modules
    df.insert(NODE_COLUMNS.index("kind"), "kind", kinds)
    return typed(df[list(NODE_COLUMNS)])


def _as_propagated(program: Any) -> Propagated:
    """The program's graph and the fake values its nodes hold, as :func:`fakeviz._engine.fx.propagate` gives them."""
    from torch._guards import detect_fake_mode

    gm = program.graph_module
    nodes = list(gm.graph.nodes)
    values = {n.name: n.meta.get("val") for n in nodes}
    mode = detect_fake_mode([v for v in values.values() if v is not None]) or new_fake_mode()
    return Propagated(
        graph_module=gm,
        nodes=nodes,
        values=values,
        mode=mode,
        symbolic=any(_symbolic(v) for v in values.values()),
        inputs=tuple(values[n.name] for n in nodes if n.op == "placeholder"),
    )


def _symbolic(val: Any) -> bool:
    if isinstance(val, (list, tuple)):
        return any(_symbolic(v) for v in val)
    if isinstance(val, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in val.shape)
    return isinstance(val, torch.SymInt)


def _input_specs(program: Any) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for spec in program.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name is None:
            continue
        kind = _INPUT_KINDS.get(spec.kind.name, spec.kind.name.lower())
        out[name] = (kind, spec.target if spec.target is not None else name)
    return out


def _root_name(program: Any) -> str:
    """The class name of the exported module (``MLP``), as the module column of a trace names the root."""
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path, cls = next(iter(stack.values()))
            if not path:
                return _class_name(cls)
    return ""


def _class_name(cls: Any) -> str:
    name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    return name.rpartition(".")[2]


def _module(stack: dict[str, Any] | None, root: str) -> str:
    """The module path of an ``nn_module_stack``, prefixed with the root's class name; ``""`` without one."""
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    if not path:
        return root
    return f"{root}.{path}" if root else path
