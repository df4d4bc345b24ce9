"""``fakeviz.check_export``: will this model export? ``torch.export`` on fake tensors, on cpu, cuda or both.

The facade composes the engine (:func:`fakeviz._engine.export.export_program`: the export, recorded, and
why it failed), the analysis (:func:`fakeviz._analysis.export_nodes.export_nodes`: the graph as a table)
and the views (:mod:`fakeviz._views.export`) into one result, :class:`ExportCheck`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ._analysis.export_nodes import export_nodes
from ._engine.export import export_program
from ._trace import Trace
from ._views import export as _view

__all__ = ["ExportCheck", "check_export"]


@dataclass(repr=False)
class ExportCheck:
    """The result of :func:`check_export`.

    Attributes:
        ok: the model exported.
        program: the ``torch.export.ExportedProgram`` (None when the export failed).
        nodes: pandas DataFrame, one row per graph node: the columns of ``fakeviz.prop``'s table (name, op,
            target, module, shape, dtype, device, stride as text such as ``[s0, 12]``, ``float32``,
            ``cuda:0``; bytes, bytes_expr, bytes_hint, storage, shares_with, value, user_line) with ``kind``
            (parameter, buffer, input, constant, op, output) after ``target`` (see
            :func:`fakeviz._analysis.export_nodes.export_nodes`); empty, with the same columns, when the
            export failed.
        trace: the export recorded like any other run (a :class:`~fakeviz.Trace`; on failure it stops
            where the export did, and ``trace.error`` says so).
        reason: on failure, at most about 15 lines: what failed in plain words, your line, what to change.
        error: on failure, the exception torch raised (its ``__cause__`` chain kept).
        kind: on failure, ``"data-dependent"``, ``"device mismatch"``, ``"graph break"``,
            ``"dynamic shapes"``, ``"no fake kernel"`` or ``"other"``.
        user_line: on failure, ``"file:line in function"`` of your code where it failed, if found.
        strict: whether ``program`` comes from a strict (TorchDynamo) export.
        log: what torch printed or logged while exporting (kept out of your output).
        model: the fake copy of the model that was exported (your model is never modified).
    """

    ok: bool
    program: Any
    nodes: Any
    trace: Trace
    reason: str | None = None
    error: BaseException | None = None
    kind: str | None = None
    user_line: str | None = None
    strict: bool = False
    log: str = ""
    model: Any = field(default=None)

    def explore(self, capacity: Any = None, **selection: Any) -> Any:
        """The explorer on :attr:`trace` (layer tree, memory per device, ops table). Needs ipywidgets/anywidget."""
        return self.trace.explore(capacity, **selection)

    def raise_for_error(self) -> None:
        """Raise :attr:`error` (with :attr:`reason` as a note) if the export failed; do nothing otherwise."""
        if self.error is not None:
            err = self.error
            if self.reason and self.reason not in getattr(err, "__notes__", ()):
                err.add_note(self.reason)
            raise err

    def __repr__(self) -> str:
        return _view.export_repr(self.ok, self.nodes, self.kind)

    def __str__(self) -> str:
        return _view.export_text(self.ok, self.reason, self.nodes, kind=self.kind)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self) if cycle else str(self))

    def _repr_html_(self) -> str:
        return _view.export_html(self.ok, self.reason, self.nodes, kind=self.kind, strict=self.strict)


def check_export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    device: str | torch.device | None = None,
) -> ExportCheck:
    """Export ``model`` with ``torch.export`` on fake tensors, without its target device, and say whether it worked.

    ``model`` may be fake (built under :func:`fakeviz.fake_mode` or :func:`fakeviz.record`), meta or real,
    on cpu, on a (fake) cuda device, or split between them; it is copied into a fake mode first, so no
    weight is read and your model is never modified.

    >>> with fv.fake_mode():                                            # doctest: +SKIP
    ...     model = MLP(); model.fc1.to("cuda:0"); x = torch.randn(8, 64, device="cuda:0")
    >>> check = fv.check_export(model, (x,))                            # doctest: +SKIP
    >>> check.ok, check.nodes[["name", "target", "shape", "device"]]    # doctest: +SKIP

    Args:
        model: the ``nn.Module`` to export.
        args: positional example inputs, a tuple (fake, meta or real tensors).
        kwargs: keyword example inputs.
        dynamic_shapes: as for ``torch.export.export`` (``{"x": {0: torch.export.Dim("batch")}}``).
        strict: export with TorchDynamo (``True``) or by running the Python (``False``, the default).
        device: where meta parameters, buffers and inputs are placed (default ``"cpu"``).

    Returns:
        An :class:`ExportCheck`: ``.ok``, ``.program``, ``.nodes``, ``.trace``, and on failure ``.reason``
        and ``.error``. A failed export is a result, not an exception (``.raise_for_error()`` raises it).
    """
    run = export_program(
        model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict, device=device, record_cls=Trace
    )
    return ExportCheck(
        ok=run.ok,
        program=run.program,
        nodes=export_nodes(run.program),
        trace=run.record,  # type: ignore[arg-type]
        reason=run.reason,
        error=run.error,
        kind=run.kind,
        user_line=run.user_line,
        strict=strict,
        log=run.log,
        model=run.model,
    )
