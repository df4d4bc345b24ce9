"""Safetensors files whose data region is a hole (never written): multi-GB checkpoints that take no disk.

Used by ``tests/engine/test_checkpoint.py`` (no tensor data is ever read), ``benchmarks/cli.py``
(``from_pretrained`` on a 70B-shaped sharded checkpoint) and ``tests/engine/test_checkpoint_hostile.py``
(hostile headers, lengths and indexes: ``write_raw_safetensors``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

__all__ = ["write_raw_safetensors", "write_sparse_safetensors"]


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], int]]) -> int:
    """A safetensors file of ``name -> (dtype code, shape, itemsize)`` with a hole for data: returns its size."""
    header, offset = {}, 0
    for name, (code, shape, itemsize) in tensors.items():
        n = itemsize
        for s in shape:
            n *= s
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return 8 + len(raw) + offset


def write_raw_safetensors(path: Path, header: dict | bytes, data_size: int, length: int | None = None) -> int:
    """A safetensors file exactly as given, for hostile cases: the header (a dict written as JSON, or raw bytes,
    unpadded), its 8-byte length (``length``, default the header's), then a hole of ``data_size`` bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw) if length is None else length) + raw)
        f.truncate(8 + len(raw) + data_size)
    return 8 + len(raw) + data_size


class CountingFile:
    """A file whose ``read`` appends the bytes it returned to ``reads``: the checkpoint tests patch the reader's
    ``open`` with :func:`counting_open` to assert how much of a file was read."""

    def __init__(self, f: Any, reads: list[int]) -> None:
        self.f = f
        self.reads = reads

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.reads.append(len(data))
        return data

    def fileno(self) -> int:  # the reader takes the file's size from the open file (fstat), not from its path
        return self.f.fileno()

    def __enter__(self) -> CountingFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()


def counting_open(reads: list[int]) -> Any:
    """An ``open(path, mode="r")`` whose files count what they read into ``reads``."""
    import builtins

    real = builtins.open
    return lambda p, mode="r": CountingFile(real(p, mode), reads)
