"""Device names in a record: which are the host's, and the order they are shown in."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["device_order", "is_host", "uses_caching_allocator"]

# Memory on these device types is not an accelerator's: verdicts skip it and views put it last.
HOST_TYPES = ("cpu", "meta")


def is_host(device: str) -> bool:
    """True for ``cpu`` and ``meta`` (with or without an index), False for ``cuda:0``, ``mps``, ..."""
    return device.partition(":")[0] in HOST_TYPES


def device_order(devices: Iterable[str]) -> list[str]:
    """Accelerators first (by type, then index), host devices last: ``cuda:0, cuda:1, ..., cpu``."""

    def key(d: str) -> tuple[int, str, int]:
        kind, _, idx = d.partition(":")
        return (1 if kind in HOST_TYPES else 0, kind, int(idx) if idx.isdigit() else -1)

    return sorted(devices, key=key)


def uses_caching_allocator(device: str) -> bool:
    """True for ``cuda`` devices, whose memory the caching-allocator model (``fakeviz._analysis.allocator``) shapes."""
    return device.partition(":")[0] == "cuda"
