"""The recorder: one event per dispatched aten op, on fake or real tensors.

Split by concern; ``_State`` (``state.py``) is composed of one mixin per concern and is what the C core
(Note: [recorder core in C], ``fakeviz/_engine/native.py``) calls by attribute name:

* ``ops.py``: op recording (``record``, outputs, argument templates, the recorded op cache), ``run_op``
  and the errors raised by ops;
* ``storages.py``: tensor and storage ids, storage lifetimes (free callbacks), roles;
* ``autograd.py``: the saved-tensor hooks, backward events, leaves and gradients;
* ``modules.py``: phases, the module stack, user lines, parameter tables, optimizer hooks;
* ``modes.py``: the fused fake recording mode, the real-run mode, the C core's dispatch hooks, the deepcopy
  patch;
* ``fastpath.py``: the fake-tensor fast path the mode, the saved-tensor hooks and the C core share (the fast
  fake detach, the light FakeTensor wrap and cache-hit outputs, the fast dispatch-cache key);
* ``recording.py``: ``Recording`` and ``record()``; ``fake_session.py``: ``FakeSession``;
* ``common.py``: what they all share (phase codes, row positions, op handles).

Known limitations
-----------------
* ``prim.*`` ops are never recorded (they are bookkeeping, not user ops).
* Storages are identified on first sight; a storage that no recorded op ever
  produced or consumed (e.g. a kernel's internal workspace) is invisible.
* A tensor resized in place (``resize_``, ``set_``) keeps its storage's largest size seen; a storage resized
  directly (``untyped_storage().resize_``, as FSDP2 frees and re-makes its unsharded parameters) ends its row
  and starts a new one (Note: [storage resize]).
"""

from __future__ import annotations

from .fake_session import FakeSession
from .recording import Recording, record

__all__ = ["FakeSession", "Recording", "record"]
