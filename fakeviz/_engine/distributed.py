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

from typing import Any

import torch

from . import patches as _patches

__all__ = ["script_object_text", "snapshot"]


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
