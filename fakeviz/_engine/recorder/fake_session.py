"""``FakeSession``: one fake mode that lasts across several :func:`~fakeviz._engine.recorder.record` blocks.

It lives here, in the recorder, and not in :mod:`fakeviz._engine.session` next to ``fake_mode()``: its
mode is the recorder's fused fake mode (``_FakeRecordingMode``, Note: [recorder fused into the fake
mode]), while the recorder itself is built on ``session`` (``check_device``, ``new_fake_mode``,
``session_patches``). From ``session.py`` it would have to import ``fakeviz._engine.recorder.modes``,
which first runs this package's ``__init__`` and so imports ``session`` again: an import cycle that only
a lazy import would hide.
"""

from __future__ import annotations

from ..session import new_fake_mode
from .modes import _FakeRecordingMode


class FakeSession:
    """One fake mode that lasts across several :func:`record` blocks.

    Fake tensors from two different fake modes cannot be mixed; objects made in
    one ``record(session=s)`` block can be used in the next one with the same
    ``s`` (this is what ``%%fake`` does across notebook cells).
    """

    def __init__(self, *, symbolic: bool = False) -> None:
        self.symbolic = symbolic
        self._mode: _FakeRecordingMode | None = None

    @property
    def mode(self) -> _FakeRecordingMode:
        if self._mode is None:
            self._mode = new_fake_mode(symbolic=self.symbolic, cls=_FakeRecordingMode)
        return self._mode

    def __repr__(self) -> str:
        return f"<fakeviz.FakeSession symbolic={self.symbolic} started={self._mode is not None}>"
