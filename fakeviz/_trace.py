"""The Trace: the public face of one recorded run, and the one place that composes every layer.

A :class:`Trace` is a :class:`~fakeviz._core.record.Record` (the engine fills it while the
``with fv.record()`` block runs) with the analyses of :mod:`fakeviz._analysis` and the views of
:mod:`fakeviz._views` as methods. Analyses keep their results in the record's one memo
(:meth:`~fakeviz._core.record.Record.cached`), emptied whenever the record grows. The ``.fvz`` file
format is described in :mod:`fakeviz._core.fvz`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._analysis import alias as _alias
from ._analysis import fidelity as _fidelity
from ._analysis import flops as _flops
from ._analysis import memory as _memory
from ._analysis import snapshot as _snapshot
from ._analysis import tables as _tables
from ._analysis import timing as _timing
from ._analysis import tree as _tree
from ._analysis.verdict import verdict as _verdict
from ._core import fvz as _fvz
from ._core.record import Record
from ._core.schema import CATEGORIES, PHASES, ROLES
from ._views import text as _text

__all__ = ["CATEGORIES", "PHASES", "ROLES", "Trace", "load"]


class Trace(Record):
    """A recorded run: ops, their outputs, and the storages they live in.

    Columns are filled while recording; the DataFrame views (:attr:`ops`,
    :attr:`outputs`, :attr:`storages`) are built on demand and are valid also on
    a partial trace (after an error inside :func:`fakeviz.record`).
    """

    # --------------------------------------------------------------- DataFrames
    @property
    def ops(self) -> Any:
        """pandas DataFrame, one row per recorded op.

        Columns: seq, op, phase, module, user_line, args, n_inputs, n_outputs,
        is_view, inplace, and the first output's shape, dtype, device, stride,
        storage, storage_offset, plus ``nbytes`` (all outputs together).
        """
        return _tables.ops_table(self)

    @property
    def outputs(self) -> Any:
        """pandas DataFrame, one row per output tensor of every op."""
        return _tables.outputs_table(self)

    @property
    def storages(self) -> Any:
        """pandas DataFrame, one row per storage (the unit of memory and aliasing).

        Columns: storage, device, nbytes, category (see :data:`CATEGORIES`), roles
        (what the recorder saw it used as, ``"|"``-joined :data:`ROLES`), name
        (parameter/buffer FQNs), alloc_seq / free_seq (lifetime in op seqs, -1 =
        before recording / still alive), owner (tensor id of the parameter whose
        gradient or optimizer state it is), and the creating op's op, phase,
        module and user_line.
        """
        return _tables.storages_table(self)

    # ----------------------------------------------------------------- op log
    def args_strings(self) -> list[str]:
        """Each op's arguments as text, tensors written as ``$id``."""
        return _tables.args_strings(self)

    def oplog(self, *, limit: int | None = None, start: int = 0) -> str:
        """The op log, one line per op in the logging-tensor form.

        ``$3: bf16[8, 4096] cuda:0 = aten.mm.default($1, $2)``. Multi-output ops
        list every output; ops with no tensor output start with ``_``.
        """
        return "\n".join(self.oplog_lines(limit=limit, start=start))

    def oplog_lines(self, *, limit: int | None = None, start: int = 0) -> list[str]:
        """:meth:`oplog` as a list of lines."""
        return _tables.oplog_lines(self, limit=limit, start=start)

    def phase_counts(self) -> dict[str, int]:
        """Number of ops per phase."""
        return _tables.phase_counts(self)

    # ------------------------------------------------------------------ memory
    def live_bytes(self) -> Any:
        """Live storage bytes per device after each op: see :func:`fakeviz._analysis.memory.live_bytes`."""
        return _memory.live_bytes(self)

    def peak_bytes(self) -> dict[str, dict[str, Any]]:
        """Per device: peak live storage bytes and the op seq where it was first reached."""
        return _memory.peak_bytes(self)

    def memory(self, *, device: str | None = None, allocator: bool = True) -> Any:
        """Live bytes per device and category after every op: see :func:`fakeviz._analysis.memory.memory_timeline`."""
        return _memory.memory_timeline(self, device=device, allocator=allocator)

    def peak(self, *, top: int = 10) -> dict[str, Any]:
        """Per device, a :class:`~fakeviz._analysis.memory.Peak`: bytes, op, module, line, what was alive."""
        return _memory.peaks(self, top=top)

    def verdict(self, capacity: str | int | float) -> dict[str, Any]:
        """Does every accelerator fit ``capacity``? See :func:`fakeviz._analysis.verdict.verdict`."""
        return _verdict(self, capacity)

    def export_memory_snapshot(self, path: str | Path | None = None, *, capacity: Any = None) -> dict[str, Any]:
        """PyTorch's memory snapshot of this run (caching-allocator model), for ``torch.cuda._memory_viz``.

        ``python -m torch.cuda._memory_viz trace_plot FILE -o out.html`` and
        https://pytorch.org/memory_viz open the written file. See :mod:`fakeviz._analysis.snapshot`.
        """
        return _snapshot.export_memory_snapshot(self, path, capacity=capacity)

    # ------------------------------------------------------- modules, aliasing
    @property
    def modules(self) -> Any:
        """The layer tree, one row per module with inclusive figures: see :mod:`fakeviz._analysis.tree`."""
        return _tree.modules(self)

    def folded_modules(self) -> Any:
        """The layer tree with repeated numbered blocks folded (``layers.0-79 x80``), odd ones flagged."""
        return _tree.folded_modules(self)

    @property
    def tensors(self) -> Any:
        """One row per tensor id: storage, creating op, view base, names, writes (see :mod:`fakeviz._analysis.alias`)."""
        return _alias.tensor_table(self)

    def aliases(self, x: Any) -> Any:
        """Every tensor sharing storage with ``x`` (a ``$N`` id, a parameter name or a recorded tensor)."""
        return _alias.aliases(self, x)

    def alias_graph(self, around: Any = None, *, max_nodes: int = 400) -> tuple[Any, Any]:
        """``(nodes, edges)`` DataFrames of storages, tensors, views, writes and tied names."""
        return _alias.alias_graph(self, around, max_nodes=max_nodes)

    # --------------------------------------------------------- FLOPs, fidelity
    def flop_coverage(self) -> Any:
        """One row per distinct op: op, kind (registry/added/zero/unknown), count, flops.

        ``kind == "unknown"`` lists every op without a FLOP formula (counted as no
        figure, never as 0); see :mod:`fakeviz._engine.flops` for the conventions.
        """
        return _flops.flop_coverage(self)

    def flops(self) -> dict[str, int]:
        """Total FLOPs per phase (ops without a formula are left out: see :meth:`flop_coverage`)."""
        return _flops.flops_by_phase(self)

    def time(self, gpu: Any = "H100", *, tf32: bool = False, host_scale: float = 1.0, **links: Any) -> Any:
        """Estimated time of every op on ``gpu`` (Note: [time model] in :mod:`fakeviz._analysis.timing`).

        A DataFrame, one row per op: ``seq, op, phase, module, cls`` (kernel class), ``flops, bytes, est_s``
        (the op's own time), ``bound`` (compute, memory, latency, or none for views), and ``start_s``/``end_s`` on
        the step's critical path. ``time().groupby("module")["est_s"].sum()`` gives the time per module.
        ``tf32``: fp32 matmuls on tensor cores (``torch.backends.cuda.matmul.allow_tf32``); ``host_scale``: the
        host's issuing cost relative to the one measured (0.5 for a host twice as fast); ``links``:
        ``gpus_per_node`` (8) and ``network_bytes_per_s`` (50e9) for collectives.
        """
        return _timing.op_times(self, gpu, tf32=tf32, host_scale=host_scale, **links)

    def step_time(self, gpu: Any = "H100", *, start: int | None = None, tf32: bool = False, host_scale: float = 1.0,
                  **links: Any) -> Any:  # fmt: skip
        """The estimated time of this record's step on ``gpu``: a :class:`fakeviz._analysis.timing.StepTime`
        (``step_s``, GPU, host and communication seconds, time per kernel class and phase, ``bound``, and
        ``timed``: which step). The step is one training step, never the set-up before it, and of several the last
        (Note: [one step] in :mod:`fakeviz._analysis.timing`); ``start=0`` times the whole record."""
        return _timing.step_time(self, gpu, start=start, tf32=tf32, host_scale=host_scale, **links)

    def fidelity(self) -> dict[str, Any]:
        """How each op was faked and what limited fidelity: see :func:`fakeviz._analysis.fidelity.fidelity_report`."""
        return _fidelity.fidelity_report(self)

    # ------------------------------------------------------------ presentation
    def explore(self, capacity: Any = None, **selection: Any) -> Any:
        """The explorer widget: layer tree, memory bars, timeline, alias graph and ops table, linked.

        ``capacity`` is a GPU name ("H100") or a size ("80GB"); ``selection`` may preset
        ``selected_module``, ``device``, ``phase`` or ``search``. Needs ipywidgets/anywidget.
        """
        from ._views.explorer import Explorer

        return Explorer.from_trace(self, capacity, **selection)

    def to_html(self, path: str | Path, capacity: Any = None, *, title: str | None = None) -> Path:
        """Write one self-contained interactive HTML report (works offline): see :mod:`fakeviz._views.report`."""
        from ._views.report import to_html

        return to_html(self, path, capacity, title=title)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """``text/plain`` and the static summary as ``text/html`` (what nbviewer and GitHub show).

        A notebook shows the explorer instead (:meth:`_ipython_display_`).
        """
        return {"text/plain": repr(self), "text/html": self._repr_html_()}

    def _ipython_display_(self) -> None:
        """In a notebook: the static summary, then the explorer (Note: [static fallback] in ``_views/explorer.py``).

        While recording or for an empty trace, the text and static HTML alone. When the explorer cannot be
        built here (its JavaScript bundle missing, a broken install, a bug), a short note names the error
        and what to do, then the text and static HTML show as they would without a kernel.
        """
        from IPython.display import display

        if self.recording or not len(self):
            display(self._repr_mimebundle_(), raw=True)
            return
        try:
            widget = self.explore()
        except Exception as exc:  # noqa: BLE001 - shown below, with the summary, not raised from a display
            display(_explorer_error(exc), raw=True)
            html = _static_html(self, note="Static summary: the interactive explorer could not be shown (see above).")
            display({"text/plain": repr(self), "text/html": html}, raw=True)
            return
        widget._ipython_display_()

    def panels(self, capacity: Any = None, **kwargs: Any) -> Any:
        """Linked plotly panels: layer tree icicle, memory bars, timeline and alias graph (``FigureWidget``s).

        Click a module in the icicle and the other three show that module. See
        :func:`fakeviz._views.panels.panels` for the options. Needs ipywidgets and plotly.
        """
        from ._views.panels import panels

        return panels(self, capacity, **kwargs)

    def __repr__(self) -> str:
        return _text.trace_repr(self)

    def _repr_html_(self) -> str:
        return _static_html(self)

    # ------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the trace to ``path`` (``.fvz``, see :mod:`fakeviz._core.fvz`): a new path or a regular file,
        replaced whole; a device, FIFO, socket or folder (or a symlink to one) raises
        ``ArgumentError`` (a ``ValueError``)."""
        return _fvz.write(self, path)

    @classmethod
    def load(cls, path: str | Path | bytes) -> Trace:
        """Read a trace written by :meth:`save` (or the bytes :meth:`to_bytes` gives). Raises
        :class:`~fakeviz.TraceFormatError` if unreadable."""
        if isinstance(path, (bytes, bytearray, memoryview)):
            return _fvz.from_bytes(path, cls)
        return _fvz.read(path, cls)

    def to_bytes(self) -> bytes:
        """The trace as the bytes of a ``.fvz`` file (what :meth:`save` writes; :func:`load` reads them back)."""
        return _fvz.to_bytes(self)


def load(path: str | Path | bytes) -> Trace:
    """Read a ``.fvz`` trace file written by :meth:`Trace.save`, or its bytes (:meth:`Trace.to_bytes`; never
    unpickles)."""
    return Trace.load(path)


def _static_html(trace: Trace, **kwargs: Any) -> str:
    from ._views.static import static_html

    return static_html(trace, **kwargs)


def _explorer_error(exc: BaseException) -> dict[str, str]:
    """The note a notebook shows when the explorer of a trace cannot be built: what failed, what to do."""
    from ._core.fmt import html_text

    lines = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]
    todo = "`trace.explore()` raises it with its full traceback."
    text = f"fakeviz: the interactive explorer could not be shown ({what}). {todo}"
    html = (
        "<div class='fv-display-error' style='color:#b00020'><b>fakeviz: the interactive explorer could not be "
        f"shown</b> ({html_text(what)}). {html_text(todo)}</div>"
    )
    return {"text/plain": text, "text/html": html}
