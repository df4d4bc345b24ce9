"""Tensor ids, storage ids, storage lifetimes (free callbacks) and what each storage was used as (roles)."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..._core.schema import ROLE_PARAM, TID_BITS
from ..quant.bnb import weight_parts
from ..sparse import PARTS as _SPARSE_PARTS
from ..sparse import sparse_parts
from .common import (
    _N_OP,
    _N_OUT,
    _N_ST,
    _OP_PHASE,
    _OUT_STORAGE,
    _OUT_TENSOR,
    _ST_ALLOC,
    _ST_CARRIED,
    _ST_DEVICE,
    _ST_FREE,
    _ST_NAME,
    _ST_NBYTES,
    _ST_OWNER,
    _ST_ROLES,
    P_INIT,
    inner_tensors,
    is_real_plain,
    is_wrapper,
)


class _StorageRef(weakref.ref):
    """Weak reference to a live storage that knows its StorageImpl address and storage id
    (cheaper than a closure per storage, and one GC-tracked object instead of a closure,
    its cells and a tuple)."""

    __slots__ = ("key", "sid")


_SERIAL = itertools.count(1)  # Note: [tensor tags]

# Note: [sparse tensors in the record]
# A sparse tensor has no storage of its own (``untyped_storage()`` and ``nbytes`` raise): its memory is that of the
# tensors it holds, the indices and the values (COO: ``_indices()`` ``[sparse_dim, nnz]`` int64 and ``_values()``
# ``[nnz, *dense dims]``; CSR/BSR: ``crow_indices``, ``col_indices``, ``values``; CSC/BSC: ``ccol_indices``,
# ``row_indices``, ``values``). The recorder registers each part's storage as a storage row on the sparse
# tensor's device, born at the op that made it and freed when the part is (which is when the sparse tensor is,
# unless a view of a part outlives it); the sparse tensor's output row names the values' storage, its nbytes
# are the parts' bytes together, its stride is written as the layout (``sparse_coo``) and its offset 0. The
# parts are read without a dispatch (``fakeviz._engine.sparse.sparse_parts``), so reading them is not an op of
# the record. A real run records the same rows. How many elements a conversion from dense keeps (nnz) depends on
# the values: Note: [sparse conversions under fake tensors] in fakeviz._engine.sparse.


class StoragesMixin:
    """The part of ``_State`` that names tensors and storages and watches storages for their free.

    Owns ``tid_base``/``tid_limit`` (Note: [tensor tags]), ``next_tensor``, ``live`` and ``on_free``; the C core
    (Note: [recorder core in C]) shares ``live`` and calls ``tensor_id``, ``storage_id`` and ``on_free``.
    """

    def _init_storages(self) -> None:
        # Note: [tensor tags]
        # A tensor's id is kept in its __dict__ as one int, base + id, where base is
        # unique to this recording (ids of another recording fall outside [base, top)).
        # An int is not tracked by the cyclic GC, where a (token, id) tuple was: one
        # GC-tracked object less per tensor.
        self.tid_base = next(_SERIAL) << TID_BITS
        self.tid_limit = self.tid_base + (1 << TID_BITS)
        self.live: dict[int, _StorageRef] = {}  # StorageImpl address -> its weakref (which has the id)
        self.on_free = self._on_free  # one bound method for every storage's weakref callback
        self.next_tensor = 0
        self.dormant: dict[int, tuple[Any, int, int, int, int]] = {}  # Note: [storage resize]
        self.fake_run = False  # a fake record: real leaves it reads get their state back (restore_real_state)
        self.real_leaves: list[tuple[Any, Any]] = []
        self.real_states: dict[tuple[int, int], tuple[Any, Any, dict[str, Any] | None]] = {}

    def tensor_id(self, t: Any) -> int:
        """The ``$N`` id of a tensor; unseen tensors are registered as inputs."""
        d = t.__dict__
        tag = d.get("_fakeviz_tid")
        base = self.tid_base
        if tag is not None and base <= tag < self.tid_limit:
            return tag - base
        tid = self.next_tensor
        self.next_tensor = tid + 1
        d["_fakeviz_tid"] = base + tid
        roles = ROLE_PARAM if isinstance(t, torch.nn.Parameter) or d.get("_is_param") else 0
        self.builder.tensor_rows.extend((tid, self.storage_id(t, -1, roles)))
        if self.fake_run and t.requires_grad and is_real_plain(t) and t.is_leaf:
            self.real_leaves.append((weakref.ref(t), t.grad))  # Note: [real leaves in a fake record]
        return tid

    def keep_real_state(self, opt: Any, p: Any) -> None:
        """Keep the state ``opt`` has for real parameter ``p`` before its first step in this fake record."""
        key = (id(opt), id(p))
        if key not in self.real_states:
            st = opt.state.get(p)
            self.real_states[key] = (weakref.ref(opt), weakref.ref(p), dict(st) if st is not None else None)

    def restore_real_state(self) -> int:
        """Note: [real leaves in a fake record]
        A real module run in a fake record (its weights converted at each use: Note: [converted tensors]) gets
        fake gradients, which autograd accumulates into the real parameters' ``.grad``, and an optimizer over
        them steps into fake state (AdamW's ``exp_avg``, ``step``). Left there, a later real backward
        accumulated into the fake gradient and a real ``step()`` ran on fake state: the real training lost its
        update without an error. When the record ends, every real leaf it read whose ``.grad`` is now a
        FakeTensor gets back the gradient it had when the record first saw it, and every optimizer state of a
        real parameter that now holds a FakeTensor gets back what it was before the record's first step (none:
        the entry goes). Returns how many gradients and states were restored."""
        n = 0
        for ref, old in self.real_leaves:
            t = ref()
            if t is not None and isinstance(t.grad, FakeTensor):
                t.grad = old
                n += 1
        for opt_ref, p_ref, old_state in self.real_states.values():
            opt, p = opt_ref(), p_ref()
            st = opt.state.get(p) if opt is not None and p is not None else None
            if st is not None and any(isinstance(v, FakeTensor) for v in st.values()):
                if old_state is None:
                    del opt.state[p]
                else:
                    opt.state[p] = old_state
                n += 1
        self.real_leaves, self.real_states = [], {}
        return n

    def storage_id(self, t: Any, seq: int, roles: int = 0) -> int:
        if is_wrapper(t):
            # Note: [wrapper tensors hold no memory]: a DTensor (an FSDP2 / tensor-parallel parameter) is a
            # wrapper of the global shape; its memory is its local tensor's storage. A torchao quantized weight
            # (Int8Tensor, Int4Tensor, Float8Tensor) holds several (the packed data, its scales, zero points):
            # each gets the roles; the id is the first's (the data)
            sids = self.storage_ids(t, seq, roles)
            return sids[0] if sids else -1
        try:
            st = t.untyped_storage()
        except (NotImplementedError, RuntimeError):  # sparse, nested, functional wrappers
            return self.sparse_storage(t, seq, roles)[1] if t.layout in _SPARSE_PARTS else -1
        key = st._cdata
        hit = self.live.get(key)
        if hit is not None:
            if roles:
                self.builder.storage_rows[hit.sid * _N_ST + _ST_ROLES] |= roles
            return hit.sid
        dev = t.device
        devid = self.t_devices.ids.get(dev)
        if devid is None:
            devid = self.t_devices.add(dev, str(dev))
        return self._new_storage(st, key, devid, seq, roles)

    def storage_ids(self, t: Any, seq: int, roles: int = 0) -> list[int]:
        """The storage ids of every tensor that holds ``t``'s memory (a wrapper's inner tensors: ``inner_tensors``),
        each registered with ``roles``."""
        if not is_wrapper(t):
            # a bitsandbytes weight's quant state (absmax, codes, SCB) is the weight's too (Note: [quantized weights
            # in the record] in fakeviz/_engine/quant/bnb.py)
            parts = weight_parts(t)
            return [self.storage_id(t, seq, roles)] + [s for x in parts if (s := self.storage_id(x, seq, roles)) >= 0]
        return [s for x in inner_tensors(t) if (s := self.storage_id(x, seq, roles)) >= 0]

    def sparse_storage(self, t: Any, seq: int, roles: int = 0) -> tuple[int, int]:
        """Sparse tensor ``t``'s bytes (its parts' together) and the storage id of its values, registering each
        part's storage on ``t``'s device (Note: [sparse tensors in the record])."""
        dev = t.device
        devid = self.t_devices.ids.get(dev)
        if devid is None:
            devid = self.t_devices.add(dev, str(dev))
        nb, sid = 0, -1
        for part in sparse_parts(t):
            n = part.numel() * part.element_size()
            nb = nb + n if type(n) is int and nb >= 0 else -1  # -1: an unbacked symbolic nnz
            st = part.untyped_storage()
            key = st._cdata
            hit = self.live.get(key)
            if hit is not None:
                sid = hit.sid
                if roles:
                    self.builder.storage_rows[sid * _N_ST + _ST_ROLES] |= roles
            else:
                sid = self._new_storage(st, key, devid, seq, roles)
        return nb, sid

    def add_roles(self, t: Any, roles: int, owner: int = -1) -> int:
        """Mark the storage of ``t`` with ROLE_* bits (registering it if unseen)."""
        sid = self.storage_id(t, -1, roles)
        if sid >= 0 and owner >= 0:
            self.builder.storage_rows[sid * _N_ST + _ST_OWNER] = owner
        return sid

    def _new_storage(self, st: Any, key: int, devid: int, seq: int, roles: int) -> int:
        b = self.builder
        std = b.storage_rows
        sid = len(std) // _N_ST
        try:
            nb = st.nbytes()
            nb = nb if type(nb) is int else -1
        except Exception:  # noqa: BLE001 - unbacked symbolic size
            nb = -1
        std.extend((devid, nb, seq, -1, roles, -1, -1, -1))
        self._watch(st, key, sid)
        return sid

    def _watch(self, st: Any, key: int, sid: int) -> None:
        """Make storage ``st`` (StorageImpl address ``key``) live as ``sid``; record its free."""
        ref = _StorageRef(st, self.on_free)
        ref.key = key
        ref.sid = sid
        self.live[key] = ref

    def storage_resized(self, st: Any, new: int) -> None:
        """Note: [storage resize]
        FSDP2 frees an unsharded parameter's memory with ``untyped_storage().resize_(0)`` after use and makes it
        again with ``resize_(n)`` before the next all-gather: one StorageImpl, several lifetimes. No op is
        dispatched for either (``UntypedStorage.resize_`` is patched in a session to call this). A resize
        ends the storage's current row at this point of the record (its weakref is dropped: no free callback
        for that row) and a resize to a size above 0 starts a new row with the device, roles, name and owner
        of the last one, so memory follows the storage's size as it is. A storage never seen is left to be
        registered when a tensor uses it."""
        key = st._cdata
        now = len(self.builder.op_rows) // _N_OP
        std = self.builder.storage_rows
        ref = self.live.get(key)
        if ref is not None:
            row = ref.sid * _N_ST
            if std[row + _ST_NBYTES] == new:
                return
            self.dormant[key] = (weakref.ref(st), std[row + _ST_DEVICE], std[row + _ST_ROLES], std[row + _ST_NAME],
                                 std[row + _ST_OWNER])  # fmt: skip
            std[row + _ST_FREE] = now
            del self.live[key]
        if new <= 0:
            return
        prev = self.dormant.pop(key, None)
        if prev is None or prev[0]() is not st:
            return
        _, devid, roles, name, owner = prev
        sid = self._new_storage(st, key, devid, now, roles)
        std[sid * _N_ST + _ST_NAME] = name
        std[sid * _N_ST + _ST_OWNER] = owner

    def _on_free(self, ref: _StorageRef) -> None:
        sid = ref.sid
        b = self.builder
        b.storage_rows[sid * _N_ST + _ST_FREE] = len(b.op_rows) // _N_OP
        live = self.live
        if live.get(ref.key) is ref:
            del live[ref.key]

    def carry_in(self, carried: list[Any]) -> dict[int, int]:
        """Note: [carried storages]
        A fake session (``%%fake`` cells) lasts across records: a storage an earlier record left alive
        (model parameters, gradients, optimizer state, a kept activation) is still memory when the next
        record starts. Each is registered before the first op, as existing before recording (``st_alloc``
        -1, so it counts from the first op), with its roles, its name and, in ``st_carried``, the phase of
        the op that made it (so it keeps its category); its free is watched as any storage's. A cell's peak
        is then the peak at that point of the notebook, and the cells of a session, joined, are the one
        record of the same code run as one block.

        ``carried`` holds what :meth:`carry_out` returned (``weakref``, device, roles, phase, name, serial) for a
        storage; dead ones are skipped. Returns storage id -> serial for the storages carried in.
        """
        b = self.builder
        std = b.storage_rows
        names = b.tables["names"]
        serials: dict[int, int] = {}
        for ref, device, roles, phase, name, serial in carried:
            st = ref()
            if st is None:
                continue
            key = st._cdata
            if key in self.live:
                continue
            dev = torch.device(device)  # a fake tensor's storage is on meta: the record's device, kept
            devid = self.t_devices.ids.get(dev)
            if devid is None:
                devid = self.t_devices.add(dev, str(dev))
            sid = self._new_storage(st, key, devid, -1, roles)
            std[sid * _N_ST + _ST_CARRIED] = phase
            if name is not None:
                std[sid * _N_ST + _ST_NAME] = names.add(name, name)
            serials[sid] = serial
        return serials

    def carry_out(self) -> list[tuple[Any, int, str, int, int, str | None]]:
        """The storages still alive at the end of the record (Note: [carried storages]): for each its
        storage, id, device, roles, the phase of the op that made it (kept from the record it was carried in
        from; init when it existed before recording) and its name."""
        b = self.builder
        std, op_rows = b.storage_rows, b.op_rows
        n_ops = len(op_rows) // _N_OP
        strings = b.tables["names"].strings
        devices = self.t_devices.strings
        out = []
        for ref in list(self.live.values()):
            st = ref()
            if st is None:
                continue
            row = ref.sid * _N_ST
            phase = std[row + _ST_CARRIED]
            if phase < 0:
                alloc = std[row + _ST_ALLOC]
                phase = op_rows[alloc * _N_OP + _OP_PHASE] if 0 <= alloc < n_ops else P_INIT
            name = std[row + _ST_NAME]
            device = devices[std[row + _ST_DEVICE]]
            out.append((st, ref.sid, device, std[row + _ST_ROLES], phase, strings[name] if name >= 0 else None))
        return out

    def copied(self, src: Any, out: Any) -> None:
        """Note: [deepcopy of recorded tensors]
        ``Tensor.__deepcopy__`` makes the copy with recorded ops (fake: ``aten.clone``; real: ``new_empty``
        and ``set_`` onto a storage copied without an op) and then assigns the source's ``__dict__`` to it,
        which overwrites the copy's tensor id with the source's: every later op on the copy would name the
        source. Give the copy back the id of the last recorded output on its storage (the clone, or the
        ``set_``), or a fresh id on its first use when no op produced it. Listed in ``fidelity()``: the ops
        of a fake deepcopy (clone) differ from a real one's (new_empty, set_); the storages do not."""
        d = out.__dict__
        if d.get("_fakeviz_tid") != src.__dict__.get("_fakeviz_tid"):
            return
        d.pop("_fakeviz_tid", None)
        try:
            hit = self.live.get(out.untyped_storage()._cdata)
        except (NotImplementedError, RuntimeError):
            hit = None
        out_rows = self.builder.out_rows
        if hit is not None:
            for row in range(len(out_rows) // _N_OUT - 1, max(-1, len(out_rows) // _N_OUT - 64), -1):
                if out_rows[row * _N_OUT + _OUT_STORAGE] == hit.sid:
                    d["_fakeviz_tid"] = self.tid_base + out_rows[row * _N_OUT + _OUT_TENSOR]
                    break
        self.trace.meta.setdefault("deepcopies", []).append([self.builder.num_ops(), self.tensor_id(out)])

    def converted(self, src: Any, out: Any) -> None:
        """Note: [converted tensors]
        A tensor the recording mode does not own (a real tensor, or a FakeTensor of another fake mode: a model
        built with ``fv.fake_mode()`` or by ``fakeviz report`` before the record) is converted into the mode at
        its first use in an op (FakeTensorMode's ``from_real_tensor``, memoised per source tensor): the op runs
        on a copy of it with a storage of its own. The op's inputs are recorded as the source tensor, but a
        view the op returns lives in the copy's storage, which was then a new storage (every ``weight.t()``
        of a Linear, saved for backward, counted as an activation). The copy's storage is entered as another
        address of the source's storage id; its entry goes when the copy's storage dies, without a free (the
        source's own storage records that)."""
        try:
            st = out.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return
        key = st._cdata
        if key in self.live:
            return
        sid = self.storage_id(src, -1)
        if sid < 0:
            return
        ref = _StorageRef(st, self._alias_gone)
        ref.key = key
        ref.sid = sid
        self.live[key] = ref

    def _alias_gone(self, ref: _StorageRef) -> None:
        live = self.live
        if live.get(ref.key) is ref:
            del live[ref.key]

    def _alias_lifted(self, src: Any, out: Any) -> None:
        """Note: [lift_fresh]
        A real ``aten.lift_fresh`` (``torch.tensor(...)``) returns its input; the fake
        one returns a new FakeTensor over a new storage. Give the fake output the
        input's tensor id and move the input's storage entry onto the output's
        storage, so fake and real runs see one tensor and one storage."""
        tid = self.tensor_id(src)
        out.__dict__["_fakeviz_tid"] = self.tid_base + tid
        try:
            st_in = src.untyped_storage()
            st_out = out.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return
        hit = self.live.pop(st_in._cdata, None)
        if hit is not None:
            self._watch(st_out, st_out._cdata, hit.sid)
