"""``offload=``: what a plan keeps in host memory instead of on its GPUs (Note: [offload]).

Note: [offload]
Two kinds, each the way torch itself does it, so the record holds the host copies and the copies between host and
GPU as the ops that make them:

* ``offload="cpu"`` (parallel plans with ``dp_shard`` / ``dp_replicate``): FSDP2's ``CPUOffloadPolicy()``
  (``fully_shard(..., offload_policy=CPUOffloadPolicy())``, ``pin_memory=True``, torchtitan's
  ``enable_cpu_offload``): every block and the root are sharded with it, the model is materialized on the host
  (``to_empty(device="cpu")``, as torchtitan's init device is ``"cpu"`` with offload) and its buffers moved to the
  GPU (torchtitan's ``buffer_device``). Each rank's sharded parameters, their gradients and AdamW's state then live
  in its host memory (pinned where torch pins: FSDP2 pins the sharded parameters and gradients), and the optimizer
  step runs on the CPU. FSDP2 copies a block's sharded parameters host-to-device before its all-gather (forward,
  and again in backward) and the reduce-scattered gradients device-to-host. A rank's result has a ``cpu`` row (the
  rank's host memory, its own fake ``cpu``: each rank is a process with its own host memory in the simulation) beside
  its GPU.
* ``offload="activations"``: ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around the step's forward and
  backward (the training step, as torchtitan's and torch's examples wrap it): every tensor autograd saves is copied
  to a pinned host tensor when saved and back to the GPU when the backward unpacks it. The GPU keeps no saved
  activations between forward and backward (each is copied back as its backward node runs); the host holds them.
  On the device-map path, the plan's ``transfers`` and on parallel plans ``Simulation.transfers(rank)`` (:func:`fakeviz._analysis.placement.transfers`) show these copies.

With ``offload="cpu"`` the step's inputs are made where the model's parameters are (``fakeviz.models.inputs``: the
host) and FSDP's root moves them to the GPU, as a data loader that yields host tensors would; their copies are among
the transfers (a few bytes per token). ``Simulation.transfers(rank)`` and ``Plan.transfers`` count the whole
record, set-up included (the buffers moved to the GPU).

The device-map path has no ``offload="cpu"``: a map entry ``"cpu"`` is accelerate's own offload there (``device_map=
{..., "model.layers.30": "cpu"}``, or what ``"auto"`` / ``"sequential"`` put on the cpu when the GPUs are full): those
modules' weights stay on the host and run there, their inputs copied over by the hooks (``Plan.transfers``), and
such a plan is reported as not fitting (``Plan.offloaded``). ``offload="activations"`` works on both paths.

What fakeviz does not model here: the time the copies take is the time model's (PCIe bandwidth, as for any
``_to_copy`` between host and GPU); whether the host has the memory is not checked (a ``cpu`` row has no capacity).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pandas as pd
import torch

from .._core.errors import ArgumentError
from .._core.gpus import MAX_JOB_BYTES

__all__ = [
    "OFFLOADS",
    "check_offload",
    "fsdp_kwargs",
    "gpu_rows",
    "materialize",
    "saved_on_host",
    "with_host_row",
]

OFFLOADS: dict[str, str] = {
    "cpu": "FSDP2's CPUOffloadPolicy: sharded parameters, gradients and optimizer state in host memory "
    "(parallel plans with dp_shard)",
    "activations": "torch.autograd.graph.save_on_cpu(pin_memory=True): saved activations in host memory",
}


def check_offload(value: Any, *, parallel: dict[str, int] | None = None, train: bool = True) -> str | None:
    """``offload=`` as None, ``"cpu"`` or ``"activations"`` (Note: [offload]); an ArgumentError otherwise.

    Args:
        value: None (nothing offloaded), ``"cpu"`` or ``"activations"``.
        parallel: the plan's degrees (None: the device-map path); ``"cpu"`` needs ``dp_shard`` or ``dp_replicate``.
        train: whether the plan trains (``"activations"`` offloads what autograd saves for a backward).

    Returns:
        The offload's name, or None.
    """
    if value is None or value is False:
        return None
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in OFFLOADS:
        raise ArgumentError("offload", value, "not an offload fakeviz knows",
                            "Give None, 'cpu' (" + OFFLOADS["cpu"] + ") or 'activations' (" + OFFLOADS["activations"]
                            + ").")  # fmt: skip
    dp = {k: v for k, v in (parallel or {}).items() if k in ("dp_shard", "dp_replicate") and v > 1}
    if name == "cpu" and not dp:
        where = f"parallel={parallel}" if parallel else "a device-map plan"
        raise ArgumentError("offload", value, f"FSDP2's CPU offload shards over dp_shard, and {where} has none",
                            "Give parallel={'dp_shard': N, ...}, or keep a device map and put modules on the host "
                            "with a 'cpu' entry (device_map={..., 'model.layers.30': 'cpu'}: accelerate's offload).")  # fmt: skip
    if parallel and parallel.get("pp", 1) > 1:
        raise ArgumentError("offload", value, "pipeline plans (pp) take no offload in fakeviz yet",
                            "Leave offload out with pp, or give dp_shard / tp degrees without pp.")  # fmt: skip
    if name == "activations" and not train:
        raise ArgumentError("offload", value, "a forward without training saves no activations for a backward",
                            "Give train=True, or leave offload out.")  # fmt: skip
    return name


def fsdp_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """``fully_shard``'s keyword arguments for the plan's offload: ``offload_policy=CPUOffloadPolicy()`` or none."""
    if settings.get("offload") != "cpu":
        return {}
    from .._engine import torch_compat

    policy = torch_compat.require("torch.distributed.fsdp.CPUOffloadPolicy", "plan(offload='cpu')")
    return {"offload_policy": policy(pin_memory=True)}


def materialize(model: torch.nn.Module, settings: dict[str, Any]) -> None:
    """``to_empty`` onto the rank's GPU; with ``offload="cpu"`` onto the host, the buffers then on the GPU
    (torchtitan's ``init_device="cpu"`` and ``buffer_device``)."""
    gpu = torch.device("cuda", torch.cuda.current_device())
    if settings.get("offload") != "cpu":
        model.to_empty(device=gpu)
        return
    model.to_empty(device=torch.device("cpu"))
    for mod in model.modules():
        for name, buf in list(mod._buffers.items()):
            if buf is not None:
                mod._buffers[name] = buf.to(gpu)


@contextlib.contextmanager
def saved_on_host(settings: dict[str, Any]) -> Iterator[None]:
    """``save_on_cpu(pin_memory=True)`` around the block when the plan offloads activations, else nothing.

    Note: [saved activations on the host in a record]
    Saved-tensor hooks do not nest: the innermost pair alone packs. A recording's own pair (which marks what autograd
    saves as an activation) is pushed when the recording starts, so torch's ``save_on_cpu`` entered inside it would
    shadow it, and the host copies would count as temporaries. So torch's own pack and unpack (the ``save_on_cpu``
    object's ``pack_hook`` / ``unpack_hook``: the same ops) are composed with the pair beneath (the recording's, read
    with ``torch._C._autograd._top_saved_tensors_default_hooks``): the host copy is what that pair packs, so the
    record marks the host copy as the saved activation, and unpacking hands it back to torch's unpack, which copies
    it to the GPU. Outside a recording (nothing beneath) it is torch's ``save_on_cpu`` as it is.
    """
    if settings.get("offload") != "activations":
        yield
        return
    from .._engine import torch_compat

    inner = torch.autograd.graph.save_on_cpu(pin_memory=True)
    top = torch_compat.lookup("torch._C._autograd._top_saved_tensors_default_hooks")
    below = top(False) if top is not None else None
    if below is None:
        with inner:
            yield
        return
    pack_below, unpack_below = below

    def pack(t: torch.Tensor) -> Any:
        device, host = inner.pack_hook(t)
        return device, pack_below(host)

    def unpack(packed: Any) -> torch.Tensor:
        device, host = packed
        return inner.unpack_hook((device, unpack_below(host)))

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def with_host_row(peaks: pd.DataFrame, trace: Any, settings: dict[str, Any]) -> pd.DataFrame:
    """``peaks`` (one row per GPU, :func:`fakeviz._analysis.placement.peaks_table`) with a ``cpu`` row when the plan
    offloads (Note: [offload]): the host memory's bytes by kind at its own peak; ``capacity`` and ``headroom`` are
    None (fakeviz does not know the host's memory) and ``fits`` True."""
    if not settings.get("offload") or not len(peaks):
        return peaks
    from .._analysis import placement

    host = placement.peaks_table(trace, {"cpu": MAX_JOB_BYTES})  # any capacity: the bytes by kind are the same
    host["capacity"] = host["headroom"] = None
    host["fits"] = True
    for col in peaks.columns.difference(host.columns):  # a simulation's rank, class, recorded: the GPU row's
        host[col] = peaks[col].iloc[0]
    return pd.concat([peaks, host[peaks.columns]], ignore_index=True)


def gpu_rows(peaks: pd.DataFrame) -> pd.DataFrame:
    """The GPU rows of a peaks table (without the ``cpu`` row :func:`with_host_row` adds): what a GPU's peak,
    headroom and fit are read from. A host row is a ``cpu`` row without a capacity: a simulation on
    ``device="cpu"`` has ranks whose own device is ``cpu``, with their capacity, and they stay."""
    if not len(peaks):
        return peaks
    return peaks[~((peaks.device.astype(str) == "cpu") & peaks.capacity.isna())]
