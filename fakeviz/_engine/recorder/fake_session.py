"""``FakeSession``: one fake mode that lasts across several :func:`~fakeviz._engine.recorder.record` blocks.

It lives here, in the recorder, and not in :mod:`fakeviz._engine.session` next to ``fake_mode()``: its
mode is the recorder's fused fake mode (``_FakeRecordingMode``, Note: [recorder fused into the fake
mode]), while the recorder itself is built on ``session`` (``check_device``, ``new_fake_mode``,
``session_patches``). From ``session.py`` it would have to import ``fakeviz._engine.recorder.modes``,
which first runs this package's ``__init__`` and so imports ``session`` again: an import cycle that only
a lazy import would hide.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ..session import new_fake_mode
from .join import join_records
from .modes import _FakeRecordingMode

if TYPE_CHECKING:
    from ..._core.record import Record
    from .state import _State


class FakeSession:
    """One fake mode that lasts across several :func:`record` blocks.

    Fake tensors from two different fake modes cannot be mixed; objects made in
    one ``record(session=s)`` block can be used in the next one with the same
    ``s`` (this is what ``%%fake`` does across notebook cells).

    Memory is one story across the blocks (Note: [carried storages]): a block's
    record starts with every storage an earlier block of the session left alive
    (parameters, gradients, optimizer state, kept activations), marked as carried
    in and keeping its category, and with the root modules seen so far; so each
    block's peak is the peak at that point. ``records`` keeps each finished
    block's record; :meth:`joined` makes them one record.
    """

    def __init__(self, *, symbolic: bool = False) -> None:
        self.symbolic = symbolic
        self._mode: _FakeRecordingMode | None = None
        # (record, session serial of each of its storages, label) per finished block
        self.records: list[tuple[Record, np.ndarray, str | None]] = []
        self._carried: list[tuple[Any, str, int, int, str | None, int]] = []  # Note: [carried storages]
        self._roots: list[Any] = []  # weakrefs of the root modules seen
        self._next_serial = 0
        self._carried_in: dict[int, int] = {}
        self.seen_forward = False

    @property
    def mode(self) -> _FakeRecordingMode:
        if self._mode is None:
            self._mode = new_fake_mode(symbolic=self.symbolic, cls=_FakeRecordingMode)
        return self._mode

    @property
    def started(self) -> _FakeRecordingMode | None:
        """The session's fake mode if a block has started it, else None."""
        return self._mode

    def start(self, state: _State) -> None:
        """Before the block's first op: carry in what earlier blocks left alive (Note: [carried storages])."""
        state.seen_forward = self.seen_forward  # top-level ops after an earlier block's forward are "other"
        self._carried_in = state.carry_in(self._carried)
        for ref in self._roots:
            mod = ref()
            if mod is not None:
                state.module_id(mod)

    def end(self, state: _State, record: Record) -> None:
        """After the block's record finished: keep it (labelled ``record.meta["label"]``, as ``%%fake`` sets it),
        and what it leaves alive for the next block."""
        n_st = len(record.col("st_device"))
        serials = np.full(n_st, -1, np.int64)
        for sid, serial in self._carried_in.items():
            if sid < n_st:
                serials[sid] = serial
        fresh = serials < 0
        k = int(fresh.sum())
        serials[fresh] = np.arange(k, dtype=np.int64) + self._next_serial
        self._next_serial += k
        carried = []
        for st, sid, device, roles, phase, name in state.carry_out():
            if 0 <= sid < n_st:
                carried.append((weakref.ref(st), device, roles, phase, name, int(serials[sid])))
        self._carried = carried
        self._carried_in = {}
        self.seen_forward = self.seen_forward or bool(state.seen_forward)
        roots = {id(m): weakref.ref(m) for r in self._roots if (m := r()) is not None}
        roots.update({k: r for k, r in state.roots.items() if r() is not None})
        self._roots = list(roots.values())
        self.records.append((record, serials, record.meta.get("label")))

    def joined(self, record_cls: type[Record] | None = None) -> Record:
        """Every finished block of the session as one record, blocks marked in ``meta["cells"]``."""
        if not self.records:
            raise ValueError("this fake session has recorded nothing yet")
        return join_records(self.records, record_cls or type(self.records[-1][0]))

    def __repr__(self) -> str:
        return (
            f"<fakeviz.FakeSession symbolic={self.symbolic} started={self._mode is not None} "
            f"records={len(self.records)} carried={len(self._carried)}>"
        )
