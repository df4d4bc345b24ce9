"""The public :func:`prop`: fake tensor propagation over a user's FX graph, as a table (engine + analysis)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ._analysis.fx_nodes import node_table
from ._engine.fx import Propagated, propagate

__all__ = ["PropValues", "prop"]


class PropValues(Mapping):
    """Node name -> the node's fake value, with the propagation's symbols; ``df.attrs["values"]`` of :func:`prop`.

    Values are fake tensors (or tuples of them, ``SymInt`` for ``x.size(0)``, None), shared, never copied:
    pandas deep-copies ``attrs`` on most operations, and this mapping copies as itself.
    """

    def __init__(self, propagated: Propagated) -> None:
        self.propagated = propagated

    def __getitem__(self, name: str) -> Any:
        return self.propagated.values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.propagated.values)

    def __len__(self) -> int:
        return len(self.propagated.values)

    def __deepcopy__(self, memo: dict[int, Any]) -> PropValues:
        return self

    def __eq__(self, other: object) -> bool:  # identity: comparing fake tensors has no truth value
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<fakeviz.PropValues of {len(self)} nodes, symbolic={self.propagated.symbolic}>"

    @property
    def output(self) -> Any:
        """What the graph returns, as fake values."""
        return self.propagated.output

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        """The graph module that was propagated."""
        return self.propagated.graph_module

    @property
    def shape_env(self) -> Any:
        """The ``ShapeEnv`` holding the symbols (None without ``symbolic``)."""
        return self.propagated.shape_env

    @property
    def fake_mode(self) -> Any:
        """The fake mode the values belong to (to run more ops on them: ``with values.fake_mode: ...``)."""
        return self.propagated.mode

    def guards(self) -> list[str]:
        """What the graph required of the symbols, e.g. ``Eq(s1, 16)`` (empty without ``symbolic``)."""
        return self.propagated.guards()

    def symbols(self) -> dict[str, tuple[str, int | None]]:
        """Symbol -> (its origin: ``x.size()[0]``, or the node of an unbacked ``u0``; its example value or None)."""
        return self.propagated.symbols()


def prop(
    graph_module: Any,
    *inputs: Any,
    symbolic: bool = False,
    dynamic: Sequence[Iterable[int] | int | None] | Mapping[str | int, Iterable[int] | int | None] | None = None,
) -> Any:
    """Fake tensor propagation over an FX graph: one row per node with its value's shape, dtype, storage.

    Runs torch's ``FakeTensorProp`` over ``graph_module`` with ``inputs`` made fake, so no data is
    computed and no memory beyond metadata is used; the graph is not modified.

    >>> gm = torch.fx.symbolic_trace(model)                       # doctest: +SKIP
    >>> df = fakeviz.prop(gm, torch.randn(8, 16), symbolic=True)  # doctest: +SKIP
    >>> df[["name", "target", "shape", "bytes_expr"]]            # [s93, 16], 64*s93  # doctest: +SKIP

    Args:
        graph_module: a ``torch.fx.GraphModule`` (``torch.fx.symbolic_trace(model)``, an exported program's
            ``.module()`` or ``.graph_module``, a dynamo backend's graph), or a ``torch.export.ExportedProgram``.
        *inputs: one per placeholder: real tensors (converted to fake, aliasing between them kept), fake
            tensors (used as they are; the run then happens in their fake mode), or plain values. To avoid
            allocating large real inputs, create fake ones under ``fakeviz.fake_mode(symbolic=...)``.
        symbolic: give tensor inputs symbolic sizes (``s93`` for ``x.size()[0]``: PyTorch
            names a symbol after a hash of its source; sizes 0 and 1 stay concrete), and
            sizes that depend on data (``nonzero``, ``masked_select``, ``.item()``) unbacked symbols (``u0``).
            Without it, such a node raises :class:`~fakeviz.DataDependentError` naming it.
        dynamic: with ``symbolic``, which dims become symbols, per input: a sequence aligned with the inputs
            or a mapping by placeholder name or position, each entry an int, an iterable of ints or None
            (every dim); e.g. ``dynamic={"x": 0}`` for a symbolic batch only. Default: every dim.

    Returns:
        A pandas DataFrame, one row per node in graph order, columns name, op, target, module, shape, dtype,
        device, stride, bytes, bytes_expr, bytes_hint, storage, shares_with, value, user_line (see
        :mod:`fakeviz._analysis.fx_nodes`; with symbols, ``bytes`` is -1 and ``bytes_expr`` / ``bytes_hint``
        say how much). ``df.attrs["values"]`` is a :class:`PropValues` (node name -> fake value, plus
        ``.output``, ``.guards()``, ``.symbols()``, ``.shape_env``); ``df.attrs["symbolic"]`` and
        ``df.attrs["guards"]`` (text) say how it was run.

    Raises:
        DataDependentError: a node needs tensor values (see ``symbolic``).
        FakeVizError: fake inputs from several fake modes, or from one without a ShapeEnv with ``symbolic``.
        TypeError: not a graph module, or the wrong number of inputs.
    """
    propagated = propagate(graph_module, *inputs, symbolic=symbolic, dynamic=dynamic)
    df = node_table(propagated)
    df.attrs["values"] = PropValues(propagated)
    df.attrs["symbolic"] = symbolic
    df.attrs["guards"] = propagated.guards()
    return df
