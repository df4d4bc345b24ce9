"""torch.distributed as the recorder sees it: the text of a collective's process-group argument, and the
groups that exist while a recording runs (``meta["distributed"]``).

Note: [collectives in the record]
A collective is an op like any other in the record: ``c10d._allgather_base_`` (FSDP2's all-gather into its
own buffer), ``c10d._reduce_scatter_base_``, ``_c10d_functional.all_gather_into_tensor`` (DTensor),
``c10d.send`` / ``recv_`` (pipeline stages), with its tensors' ids, so the buffers it writes are storages
with lifetimes like any activation. Torch passes the group as a ``ScriptObject`` (c10d ops) or as the
group's name (functional ops); the recorder writes the first as ``group('NAME')`` and keeps the second as
the string it is, and at the end of the recording ``meta["distributed"]`` holds this rank, the world size
and every group by name with its global ranks. :mod:`fakeviz._analysis.collectives` reads a collective's
group, bytes in and out and the bytes a ring algorithm sends and receives from those.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from . import patches as _patches

__all__ = ["Mailbox", "current_mailbox", "script_object_text", "snapshot"]


def script_object_text(a: Any) -> str:
    """``group('NAME')`` for a c10d ProcessGroup ScriptObject, ``ReduceOp.SUM`` for a ReduceOp, else ``str(a)``."""
    try:
        qn = a._type().qualified_name()
    except Exception:  # noqa: BLE001 - not a TorchScript class instance
        return str(a)
    if qn.endswith("c10d.ProcessGroup"):
        try:
            pg = torch.distributed.ProcessGroup.unbox(a)
            return f"group({pg.group_name!r})"
        except Exception:  # noqa: BLE001 - a group torch can no longer unbox
            return "group(?)"
    if qn.endswith("c10d.ReduceOp"):
        op = getattr(a, "op", None)
        return f"ReduceOp.{getattr(op, 'name', '?')}" if op is not None else "ReduceOp"
    return str(a)  # any other class (the profiler's _RecordFunction) as torch's logging tensor writes it


def snapshot() -> dict[str, Any] | None:
    """This rank, the world size, the backend and every process group by name (global ranks, description),
    while a default group exists; else None."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    c10d = dist.distributed_c10d
    groups = {}
    for pg, name in list(c10d._world.pg_names.items()):
        ranks = sorted(c10d._world.pg_group_ranks.get(pg, {}))
        groups[str(name)] = {"ranks": ranks, "desc": str(getattr(pg, "group_desc", "") or "")}
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": str(dist.get_backend()),
        "groups": groups,
    }


# Note: [DTensor's shadow propagation]
# On a miss of its sharding cache, DTensor derives an op's output shape by running the op on fake tensors of
# the *global* shapes (``ShardingPropagator._propagate_tensor_meta_non_cached``), in ``detect_fake_mode() or
# FakeTensorMode()``. In a real run that is a fresh fake mode: no memory, nothing a profiler sees. Under a
# fakeviz recording ``detect_fake_mode()`` finds the recording's mode, so those shadow ops (``empty_strided``
# of global shapes, the op itself) would be recorded as the rank's own, and only on the first miss of the
# process: the first rank simulated would differ from the others. While a fake session is active the
# propagation runs with fakeviz's mode off the stack, so it makes its own fresh fake mode, as in a real run.
_prop_token: int | None = None


def patch_sharding_prop(on: bool) -> None:
    """Install (or remove) the wrapper of Note: [DTensor's shadow propagation] (only once DTensor is imported;
    through the registry, Note: [patch registry])."""
    global _prop_token
    import sys

    if not on:
        if _prop_token is not None:
            _patches.pop(_prop_token)
            _prop_token = None
        return
    mod = sys.modules.get("torch.distributed.tensor._sharding_prop")
    if mod is None or _prop_token is not None:
        return
    cls = mod.ShardingPropagator
    original = cls._propagate_tensor_meta_non_cached

    def _propagate_tensor_meta_non_cached(self: Any, op_schema: Any) -> Any:
        from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

        with unset_fake_temporarily():
            # a fresh mode, as in a real run; without the dispatch cache, which every mode of the process
            # shares and which does not key "cuda" by the current device: a rank on cuda:1 would get
            # cuda:0 tensors an earlier rank cached, and the op would fail on mixed devices
            fresh = FakeTensorMode(allow_non_fake_inputs=True)
            fresh.cache_enabled = False
            with fresh:
                return original(self, op_schema)

    _prop_token = _patches.push(cls, "_propagate_tensor_meta_non_cached", _propagate_tensor_meta_non_cached,
                                entry="dtensor-shadow-prop")  # fmt: skip


# Note: [values between simulated ranks]
# The fake process group moves no data, yet torch's pipelining reads some values a rank receives: the warm-up vote
# of ``PipelineStage`` (``result.item()`` of a tensor ``dist.recv``'d from its neighbour) and the metadata of its
# shape inference (``dist.recv_object_list``: the sizes of the pickles, then the pickled ``_StageForwardMeta`` /
# ``_StageBackwardMeta``). ``simulate`` records ranks one after another in one process, so what rank r sends is
# known when rank r+1 is recorded: a :class:`Mailbox` (one per simulation, never a global) keeps every
# point-to-point message a rank sends (``send``, ``batch_isend_irecv``: the values where the fake run knows them,
# else None, in order per (source, destination) pair, as NCCL delivers them) and gives a later rank's receive the
# values sent to it; ``_tensor_to_object`` unpickles the received bytes (the recorded ``.cpu()`` copy first, as
# torch's own code does). torch's own code runs on both sides, op for op: only the values come from the mailbox.
# A receive from a rank not recorded yet (the backward direction: the vote's result, the gradients' metadata) gets
# what torch's own inference would give, assumed: the vote result is the product so far (every later stage votes
# as given); the gradients' metadata is ``_derive_grad_metas`` of the stage's outputs (a gradient has its output's
# shape, dtype and stride), as a STATIC stage derives it. Once the sender is recorded, every receive is checked
# against what was really sent (:meth:`Mailbox.stale`) and a rank that received other values is recorded again;
# a sender that is never recorded (``ranks=[k]``, a stand-in) leaves the assumption in ``fidelity()``.
_CURRENT = threading.local()  # .box: the mailbox of the rank being recorded in this thread (Mailbox.rank)


def current_mailbox() -> Mailbox | None:
    """The :class:`Mailbox` of the rank being recorded in this thread, or None outside a simulation."""
    return getattr(_CURRENT, "box", None)


class Mailbox:
    """The point-to-point messages of one simulation (Note: [values between simulated ranks])."""

    def __init__(self) -> None:
        self.sent: dict[int, dict[tuple[int, int], Any]] = {}  # src -> (dst, seq) -> values (None: unknown)
        self.got: dict[int, dict[tuple[int, int], tuple[Any, str | None]]] = {}  # dst -> (src, seq) -> (values, why)
        self._count: dict[tuple[str, int, int], int] = {}  # ("s"/"r", a, b) -> messages so far in this recording
        self._queued: dict[tuple[int, int], list[Any]] = {}  # (src, dst) -> values assumed for the next receives
        self._rank = -1
        self._trace: Any = None

    # ------------------------------------------------------------------------------ one rank's recording
    @contextlib.contextmanager
    def rank(self, rank: int, trace: Any = None) -> Iterator[None]:
        """Rank ``rank`` is being recorded (in this thread, into ``trace``): its sends are kept, its receives
        answered."""
        self._rank, self._trace = rank, trace
        self._expected: list[tuple[tuple[int, ...], Any, Any, str]] = []
        _CURRENT.box = self
        self.sent[rank], self.got[rank] = {}, {}
        self._count = {}
        self._queued = {}
        tokens = _push_exchange(self)
        try:
            yield
        finally:
            for t in reversed(tokens):
                _patches.pop(t)
            self._rank, self._trace = -1, None
            _CURRENT.box = None

    def post(self, dst: int, tensor: Any, known: bool = False) -> None:
        key = ("s", self._rank, dst)
        seq = self._count.get(key, 0)
        self._count[key] = seq + 1
        self.sent[self._rank][(dst, seq)] = _values_of(tensor)
        if known:
            self._unsay("c10d.send")

    def _unsay(self, op: str) -> None:
        """Drop the newest "this rank's own values" assumption of ``op`` (Note: [values after collectives]): the
        values went to, or came from, the other rank."""
        from .value_reads import COLLECTIVE_VALUES

        rows = self._trace.meta.get("assumptions") if self._trace is not None else None
        for i in range(len(rows or ()) - 1, -1, -1):
            if rows[i][1].startswith(op) and rows[i][2] == COLLECTIVE_VALUES:
                del rows[i]
                return

    def deliver(self, src: int, tensor: Any, known: bool = False) -> None:
        key = ("r", src, self._rank)
        seq = self._count.get(key, 0)
        self._count[key] = seq + 1
        why = None
        if src in self.sent and src != self._rank and (self._rank, seq) in self.sent[src]:
            value = self.sent[src][(self._rank, seq)]
        elif self._queued.get((src, self._rank)):
            value, why = self._queued[(src, self._rank)].pop(0)
        elif any(e[0] == tuple(tensor.shape) and e[1] == tensor.dtype for e in self._expected):
            _, _, value, why = next(e for e in self._expected if e[0] == tuple(tensor.shape) and e[1] == tensor.dtype)
        else:
            value, why = self._echo(src, tensor)
        self.got[self._rank][(src, seq)] = (value, why)
        if value is not None:
            _give_values(tensor, value)
            if known:  # the receive buffer had values: the values layer said they stay this rank's own
                self._unsay("c10d.recv_")

    def _echo(self, src: int, tensor: Any) -> tuple[Any, str | None]:
        """The newest values this rank sent to ``src`` in a tensor of the same shape and dtype (the vote: the
        product so far), or unknown."""
        for (dst, _), v in sorted(self.sent[self._rank].items(), key=lambda kv: -kv[0][1]):
            if dst == src and v is not None and tuple(v.shape) == tuple(tensor.shape) and v.dtype == tensor.dtype:
                return v, (f"the values received from rank {src} (not recorded before this rank) are assumed to be "
                           f"the ones this rank sent it (PipelineStage's warm-up vote: every later stage votes "
                           f"as the stages before it)")  # fmt: skip
        return None, None

    def expect(self, shape: tuple[int, ...], dtype: Any, fill: int, why: str) -> None:
        """A receive of ``shape`` and ``dtype`` from a rank not recorded yet gets ``fill`` everywhere (a fact the step
        knows by construction, ``why`` says which), until the end of this rank's recording; checked like every
        assumption."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            value = torch.full(tuple(shape), fill, dtype=dtype, device="cpu")
        self._expected.append((tuple(shape), dtype, value, why))

    def assume_object(self, src: int, obj: Any, why: str) -> None:
        """The next object receive from ``src`` gets ``obj`` unless ``src`` has sent one already: its sizes
        tensor and its pickled bytes are queued as the next two messages."""
        import io

        from torch._subclasses.fake_tensor import unset_fake_temporarily

        c10d = torch.distributed.distributed_c10d
        if src in self.sent and src != self._rank:
            return
        f = io.BytesIO()
        c10d._pickler(f).dump(obj)
        buf = bytearray(f.getvalue())
        with unset_fake_temporarily():
            data = torch.frombuffer(buf, dtype=torch.uint8).clone()
            size = torch.tensor([data.numel()], dtype=torch.long, device="cpu")
        self._queued[(src, self._rank)] = [(size, why), (data, why)]

    # ------------------------------------------------------------------------------ after the recordings
    def stale(self, recorded: set[int]) -> list[int]:
        """Recorded ranks that received values other than what a recorded sender really sent: to record again."""
        out = []
        for dst in sorted(recorded):
            for (src, seq), (value, _) in self.got.get(dst, {}).items():
                if src not in recorded or src not in self.sent:
                    continue
                real = self.sent[src].get((dst, seq), "missing")
                if not _same(real, value):
                    out.append(dst)
                    break
        return out

    def assumptions(self, rank: int, recorded: set[int]) -> list[str]:
        """The assumptions ``rank``'s record still rests on: values from senders never recorded."""
        return sorted({why for (src, _), (_, why) in self.got.get(rank, {}).items()
                       if why is not None and src not in recorded})  # fmt: skip


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return False
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and bool(torch.equal(a, b))


def _values_of(t: Any) -> Any:
    """The values a fake run knows of ``t`` (a CPU copy), else None."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._mode_utils import no_dispatch

    if type(t) is FakeTensor:
        c = t.constant
        if c is None:
            return None
        with no_dispatch():
            return c.detach().cpu().clone()
    if isinstance(t, torch.Tensor) and not t.is_meta and type(t) is torch.Tensor:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return t.detach().cpu().clone()
    return None


def _give_values(t: Any, value: Any) -> None:
    """``t`` (a fake receive buffer) now holds ``value``, as after a real receive."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._mode_utils import no_dispatch

    if type(t) is not FakeTensor or tuple(t.shape) != tuple(value.shape) or t.dtype != value.dtype:
        return
    with no_dispatch():
        t.constant = value.clone()


@contextlib.contextmanager
def _inside() -> Iterator[None]:
    _CURRENT.inside = True
    try:
        yield
    finally:
        _CURRENT.inside = False


def _peer(group: Any, peer: int | None, group_peer: int | None) -> int:
    c10d = torch.distributed.distributed_c10d
    g = c10d._group_or_default_group(group)
    return c10d.get_global_rank(g, c10d._canonicalize_group_rank(g, peer, group_peer))


def _push_exchange(box: Mailbox) -> list[int]:
    """The record-scope changes of Note: [values between simulated ranks] (registry entries ``p2p-values`` and
    ``pipeline-meta-inference``)."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    send0, recv0, batch0 = c10d.send, c10d.recv, c10d.batch_isend_irecv
    to_object0, to_tensor0 = c10d._tensor_to_object, c10d._object_to_tensor
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> Any:
        if getattr(_CURRENT, "inside", False):  # torch's own re-entry (a torch function mode calls send again)
            return send0(tensor, dst, group, tag, group_dst)
        known = _values_of(tensor) is not None
        with _inside():
            out = send0(tensor, dst, group, tag, group_dst)
        box.post(_peer(group, dst, group_dst), tensor, known)
        return out

    def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> Any:
        if getattr(_CURRENT, "inside", False):
            return recv0(tensor, src, group, tag, group_src)
        known = _values_of(tensor) is not None
        with _inside():
            out = recv0(tensor, src, group, tag, group_src)
        if src is not None or group_src is not None:
            box.deliver(_peer(group, src, group_src), tensor, known)
        return out

    def batch_isend_irecv(p2p_op_list: list[Any]) -> Any:
        if getattr(_CURRENT, "inside", False):
            return batch0(p2p_op_list)
        known = [_values_of(op.tensor) is not None for op in p2p_op_list]
        with _inside():
            works = batch0(p2p_op_list)
        for op, had in zip(p2p_op_list, known):
            peer = c10d.get_global_rank(op.group, op.group_peer)
            if op.op in (c10d.isend, dist.isend):
                box.post(peer, op.tensor, had)
            else:
                box.deliver(peer, op.tensor, had)
        return works

    def _tensor_to_object(tensor: Any, tensor_size: Any, group: Any, *rest: Any, **kw: Any) -> Any:
        value = _values_of(tensor)
        if value is None:
            return to_object0(tensor, tensor_size, group, *rest, **kw)
        tensor.cpu()  # the device-to-host copy torch's own code makes
        with unset_fake_temporarily():
            return to_object0(value, int(tensor_size), group, *rest, **kw)

    def _object_to_tensor(obj: Any, device: Any, group: Any, *rest: Any, **kw: Any) -> Any:
        byte_tensor, size = to_tensor0(obj, device, group, *rest, **kw)
        if _values_of(byte_tensor) is None:  # the pickle's bytes, known here: kept for the receiving rank
            with unset_fake_temporarily():
                real, _ = to_tensor0(obj, torch.device("cpu"), group, *rest, **kw)
            _give_values(byte_tensor, real)
        return byte_tensor, size

    tokens = []
    tokens.append(_patches.push(c10d, "_object_to_tensor", _object_to_tensor, entry="p2p-values"))
    for owner in (c10d, dist):
        tokens.append(_patches.push(owner, "send", send, entry="p2p-values"))
        tokens.append(_patches.push(owner, "recv", recv, entry="p2p-values"))
        tokens.append(_patches.push(owner, "batch_isend_irecv", batch_isend_irecv, entry="p2p-values"))
    tokens.append(_patches.push(c10d, "_tensor_to_object", _tensor_to_object, entry="p2p-values"))
    stage_mod = sys.modules.get("torch.distributed.pipelining.stage")
    cls = getattr(stage_mod, "PipelineStage", None)
    if cls is not None and "_recv_meta" in cls.__dict__ and hasattr(stage_mod, "_StageBackwardMeta"):
        recv_meta0 = cls.__dict__["_recv_meta"]

        def _recv_meta(self: Any, src_stage: int) -> Any:
            if src_stage > self.stage_index and getattr(self, "_stage_meta", None) is not None:
                metas = stage_mod._derive_grad_metas(tuple(self._stage_meta.outputs or ()))
                box.assume_object(
                    self._resolve_peer_global_rank(src_stage), stage_mod._StageBackwardMeta(backward_metas=metas),
                    f"the gradients' metadata from stage {src_stage} (not recorded before this rank) is derived from "
                    f"stage {self.stage_index}'s outputs (_derive_grad_metas: shape, dtype and stride of each output)",
                )  # fmt: skip
            return recv_meta0(self, src_stage)

        tokens.append(_patches.push(cls, "_recv_meta", _recv_meta, entry="pipeline-meta-inference"))
    return tokens
