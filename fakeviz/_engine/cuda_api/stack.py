"""The process's stack of fake sessions (each its thread's), what a session answering as a GPU knows, and the GPU's
properties."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..._core.errors import FakeVizError
from ..._core.gpus import CAPABILITY, DEVICE_NAMES, MULTIPROCESSORS, ROCM_ARCH, SM_LIMITS, Capacity
from .. import patches as _patches

__all__ = [
    "CUDA_TYPE", "DEFAULT_GPU", "LOCK", "ORIGINALS", "STACK", "DeviceProperties", "GpuSession", "InvalidDeviceError",
    "MemoryReader", "active", "device_index", "outside", "properties",
]  # fmt: skip

DEFAULT_GPU = "H100"
CUDA_TYPE = 1  # c10::DeviceType::CUDA, as torch.Stream.device_type reports it
#: ``(device, since) -> flat memory_stats`` of the record so far (see ``fakeviz._analysis.cuda_stats``)
MemoryReader = Callable[[str, int], "dict[str, int]"]


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties(i)`` reports for a fake GPU (None: not known for this GPU)."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    warp_size: int = 32
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    max_threads_per_multi_processor: int | None = None
    regs_per_multiprocessor: int | None = None
    shared_memory_per_block: int | None = None
    shared_memory_per_block_optin: int | None = None
    shared_memory_per_multiprocessor: int | None = None
    gcnArchName: str = ""  # noqa: N815 - torch's attribute name (ROCm builds)

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})"
        )


def properties(gpu: str | None) -> DeviceProperties:
    """The properties of a GPU of the catalog (None: :data:`DEFAULT_GPU`; a capacity such as "80GB": an H100 of
    that size). Facts from :mod:`fakeviz._core.gpus`; an AMD GPU answers as a ROCm build of torch would."""
    cap = Capacity.parse(gpu if gpu is not None else DEFAULT_GPU)
    name = cap.gpu or DEFAULT_GPU
    if name in ROCM_ARCH:
        arch, (major, minor) = ROCM_ARCH[name]
        return DeviceProperties(DEVICE_NAMES[name], major, minor, cap.bytes, MULTIPROCESSORS[name], warp_size=64,
                                gcnArchName=arch)  # fmt: skip
    major, minor = CAPABILITY[name]
    threads, smem_sm, smem_optin = SM_LIMITS[(major, minor)]
    return DeviceProperties(
        DEVICE_NAMES[name], major, minor, cap.bytes, MULTIPROCESSORS[name], max_threads_per_multi_processor=threads,
        regs_per_multiprocessor=65536, shared_memory_per_block=49152, shared_memory_per_block_optin=smem_optin,
        shared_memory_per_multiprocessor=smem_sm,
    )  # fmt: skip


class InvalidDeviceError(FakeVizError, AssertionError):
    """A cuda index the fake machine does not have (an AssertionError like torch's "Invalid device id", and a
    RuntimeError like its "invalid device ordinal")."""


@dataclasses.dataclass(eq=False)
class GpuSession:
    """One fake session on the stack; ``on``: it answers ``torch.cuda`` as a GPU (else as the build does).

    ``memory(device, since)`` gives ``torch.cuda.memory_stats``-shaped figures of the record (None in
    ``fake_mode()``: ``missing`` says why there are none); ``version()`` changes whenever the record does
    (the figures are cached per version); ``clock()`` is the number of ops so far; ``meta`` is the record's
    meta (notes go in ``meta["cuda_api"]``). ``resets`` / ``accumulated`` hold what
    ``reset_peak_memory_stats`` / ``reset_accumulated_memory_stats`` saw, per device index. ``thread`` is the
    thread that opened it (its :func:`fakeviz._engine.patches.home`): the session answers there only.
    """

    on: bool
    props: DeviceProperties
    count: int
    memory: MemoryReader | None = None
    version: Callable[[], Any] | None = None
    clock: Callable[[], int] | None = None
    meta: dict[str, Any] | None = None
    missing: str = (
        "fakeviz.fake_mode() records nothing, so there are no memory figures; run the block in "
        "fakeviz.record(device=...) to read them"
    )
    resets: dict[int, tuple[int, dict[str, int]]] = dataclasses.field(default_factory=dict)
    accumulated: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    cache: dict[int, tuple[Any, dict[str, int]]] = dataclasses.field(default_factory=dict)
    thread: int = dataclasses.field(default_factory=_patches.home)

    def count_note(self, key: str) -> None:
        """Count one use of something the fidelity report should name (``meta["cuda_api"][key]``)."""
        if self.meta is not None:
            notes = self.meta.setdefault("cuda_api", {})
            notes[key] = notes.get(key, 0) + 1

    def list_note(self, key: str, value: Any) -> None:
        """Append ``value`` to ``meta["cuda_api"][key]``."""
        if self.meta is not None:
            self.meta.setdefault("cuda_api", {}).setdefault(key, []).append(value)


LOCK = threading.RLock()  # guards STACK and ORIGINALS
STACK: list[GpuSession] = []
ORIGINALS: dict[tuple[Any, str], Any] = {}  # (owner, attribute name) -> torch's own value, while patched


def active() -> GpuSession | None:
    """The session that answers now: the calling thread's newest session if it answers as a GPU (Note: [torch.cuda
    on fake GPUs]); autograd's device threads running its backward are its thread's (Note: [threads] in
    ``fakeviz._engine.patches``). None in any other thread: torch.cuda answers as the build does there."""
    if not STACK:
        return None
    h = _patches.home()
    for s in reversed(STACK):
        if s.thread == h:
            return s if s.on else None
    return None


def outside(name: str) -> Any:
    """torch.cuda's own attribute ``name`` (a fake class kept past its session answers as the build does)."""
    return ORIGINALS.get((torch.cuda, name)) or getattr(torch.cuda, name)


def device_index(s: GpuSession, device: Any, *, what: str = "device") -> int:
    """A cuda device argument as an index of the session's GPUs (None / ``"cuda"``: the current device).

    Raises:
        InvalidDeviceError: the index is not one of the session's GPUs.
        ValueError: not a cuda device (torch's own message).
    """
    from torch.cuda._utils import _get_device_index

    index = _get_device_index(device, optional=True)
    if not 0 <= index < s.count:
        raise InvalidDeviceError(
            f"Invalid device id: {what} cuda:{index}, but this fake machine has {s.count} GPU(s) "
            f"(cuda:0 .. cuda:{s.count - 1}); pass gpus={index + 1} to fakeviz.record(...) for more"
        )
    return index
