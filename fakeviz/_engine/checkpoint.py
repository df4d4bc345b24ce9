"""What a checkpoint holds (names, dtypes, shapes), read without its tensor data.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming every
tensor's dtype, shape and byte range; :func:`read_safetensors_header` reads those ``8 + N`` bytes and
nothing else (Note: [checkpoint headers only]). A sharded checkpoint's ``*.safetensors.index.json``
names the shard of each tensor; :func:`read_checkpoint` reads the header of each shard once. ``.bin`` /
``.pt`` files go through ``torch.load(map_location="meta", weights_only=True, mmap=True)``, which
builds meta tensors from the pickle and never touches the storages.

Note: [checkpoint headers only]
    ``safetensors.safe_open`` maps the whole file (it failed with ENOMEM on a 131 GiB file on a 24 GiB
    machine), and ``torch.load`` without ``mmap=True`` reads every storage. Here a file is opened with
    ``open(path, "rb")`` and read twice: 8 bytes, then the header. The size of the data region is
    checked against ``os.stat`` (a truncated download is an error), never by reading it.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._core.errors import CheckpointError, FakeVizWarning

__all__ = [
    "SAFETENSORS_DTYPES",
    "Checkpoint",
    "TensorInfo",
    "find_weights",
    "read_checkpoint",
    "read_safetensors_header",
    "read_torch_meta",
]

#: safetensors dtype codes (the format's spec) -> torch dtypes (those this torch build has).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    code: getattr(torch, name)
    for code, name in {
        "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
        "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
        "U16": "uint16", "U32": "uint32", "U64": "uint64", "C64": "complex64",
        "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    }.items()
    if hasattr(torch, name)
}  # fmt: skip

_MAX_HEADER = 256 * 1024 * 1024  # safetensors' own limit is 100 MB; anything larger is not a header


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint: its dtype, shape and the file that holds it."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    file: str

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass
class Checkpoint:
    """The tensors of a checkpoint folder or file, without data.

    Attributes:
        tensors: name -> :class:`TensorInfo`, in file order.
        files: the weight files read (headers only).
        format: ``"safetensors"`` or ``"torch"``.
        header_bytes: bytes read from the weight files (headers; 0 for torch files, which are mapped).
    """

    tensors: dict[str, TensorInfo]
    files: list[Path]
    format: str
    header_bytes: int = 0

    def nbytes(self) -> int:
        """Bytes the tensors take at their checkpoint dtypes."""
        return sum(t.numel * t.dtype.itemsize for t in self.tensors.values())

    def main_dtype(self) -> torch.dtype | None:
        """The floating dtype that holds most elements (the dtype the model was saved in), or None."""
        counts: dict[torch.dtype, int] = {}
        for t in self.tensors.values():
            if t.dtype.is_floating_point:
                counts[t.dtype] = counts.get(t.dtype, 0) + t.numel
        return max(counts, key=counts.__getitem__) if counts else None


def _bad(path: Path | str, what: str, fix: str = "") -> CheckpointError:
    return CheckpointError(f"{path}: {what}" + (f"\n{fix}" if fix else ""))


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """The tensors a safetensors file holds, from its header only (Note: [checkpoint headers only]).

    Args:
        path: a ``.safetensors`` file.

    Returns:
        ``(tensors, metadata, header_bytes)``: name -> :class:`TensorInfo`, the header's
        ``__metadata__`` (strings), and the bytes read (``8 + header length``).

    Raises:
        CheckpointError: the file is not a safetensors file, its header is malformed, or it is shorter
            than its header says (a truncated download).
    """
    path = Path(path)
    size = os.stat(path).st_size
    fix = "Re-download the file, or check that it is a safetensors file."
    if size < 8:
        raise _bad(path, f"{size} bytes: too short for a safetensors file (8-byte header length missing)", fix)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > min(size - 8, _MAX_HEADER):
            raise _bad(
                path, f"header length {n:,} does not fit in a file of {size:,} bytes: not a safetensors file", fix
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"the header is not JSON ({e})", fix) from e
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object", fix)
    meta = header.pop("__metadata__", None) or {}
    data_size = size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        try:
            code, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            ok = all(isinstance(s, int) and s >= 0 for s in shape) and 0 <= begin <= end
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise _bad(path, f"tensor {name!r}: malformed header entry {entry!r}", fix)
        if code not in SAFETENSORS_DTYPES:
            raise _bad(path, f"tensor {name!r}: dtype {code!r} is not known to this torch build",
                       "Upgrade torch, or convert the checkpoint to a supported dtype.")  # fmt: skip
        info = TensorInfo(SAFETENSORS_DTYPES[code], shape, path.name)
        if end - begin != info.numel * info.dtype.itemsize:
            raise _bad(path, f"tensor {name!r}: {end - begin:,} bytes for shape {list(shape)} of {code}", fix)
        if end > data_size:
            raise _bad(path, f"tensor {name!r} ends at byte {end:,} of the data, but the file holds {data_size:,} "
                       "bytes of data: the file is truncated", fix)  # fmt: skip
        tensors[name] = info
    return tensors, {str(k): str(v) for k, v in meta.items()}, 8 + n


def _state_dict_of(obj: Any) -> dict[str, torch.Tensor] | None:
    if isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        if all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
        for key in ("state_dict", "model", "module"):
            inner = _state_dict_of(obj.get(key))
            if inner is not None:
                return inner
    return None


def read_torch_meta(path: str | os.PathLike[str]) -> dict[str, TensorInfo]:
    """The tensors of a ``torch.save`` file (``.bin``/``.pt``) as meta tensors, never reading their data.

    Uses ``torch.load(map_location="meta", weights_only=True, mmap=True)``. A file in the legacy
    (non-zip) format cannot be mapped: it is read whole, with a :class:`FakeVizWarning`.

    Raises:
        CheckpointError: the file cannot be loaded with ``weights_only=True`` or holds no state dict.
    """
    path = Path(path)
    fix = "Only checkpoints of tensors (a state dict) can be read without running their pickle."
    legacy = not zipfile.is_zipfile(path)
    if legacy:
        with open(path, "rb") as f:
            legacy = f.read(2) == b"\x80\x02"  # the legacy format: a protocol-2 pickle first
        if not legacy:
            raise _bad(path, "not a torch.save file (neither its zip format nor the legacy pickle format)")
        warnings.warn(f"{path}: a legacy (non-zip) torch.save file cannot be memory-mapped; reading it whole",
                      FakeVizWarning, stacklevel=3)  # fmt: skip
    try:
        obj = torch.load(path, map_location="meta", weights_only=True, mmap=not legacy)
    except Exception as e:  # noqa: BLE001 - the unpickler raises many types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _bad(path, f"torch.load(weights_only=True) failed: {first}", fix) from e
    sd = _state_dict_of(obj)
    if sd is None:
        raise _bad(path, f"holds a {type(obj).__name__}, not a state dict (a dict of tensors)")
    return {k: TensorInfo(v.dtype, tuple(v.shape), path.name) for k, v in sd.items()}


_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLES = ("model.safetensors", "pytorch_model.bin", "model.pt", "pytorch_model.pt")


def find_weights(folder: str | os.PathLike[str]) -> tuple[Path | None, list[Path]]:
    """The weight files of a checkpoint folder: ``(index file or None, weight files)``.

    Looks for, in order: a safetensors or ``.bin`` index, ``model.safetensors``, ``pytorch_model.bin``,
    then any ``*.safetensors``, then any ``*.bin``/``*.pt`` (sorted by name).
    """
    folder = Path(folder)
    for name in _INDEXES:
        if (folder / name).is_file():
            return folder / name, []
    for name in _SINGLES:
        if (folder / name).is_file():
            return None, [folder / name]
    for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth"):
        found = sorted(p for p in folder.glob(pattern) if p.is_file())
        if found:
            return None, found
    return None, []


def _read_index(index: Path) -> tuple[list[Path], dict[str, str]]:
    """The shard files an index names (each once, in order) and its weight map, from one read of the index."""
    try:
        raw = json.loads(index.read_text())
        weight_map = raw["weight_map"]
        files = list(dict.fromkeys(str(v) for v in weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _bad(index, f"not a checkpoint index ({type(e).__name__}: {e})",
                   "An index is JSON with a 'weight_map' of tensor name -> shard file.") from e  # fmt: skip
    missing = [f for f in files if not (index.parent / f).is_file()]
    if missing:
        raise _bad(index, f"{len(missing)} shard(s) named in the index are missing: {', '.join(missing[:5])}",
                   "Download the missing shards (or all of the checkpoint) into the same folder.")  # fmt: skip
    return [index.parent / f for f in files], weight_map


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The tensors of a checkpoint: a folder, an index ``*.index.json``, or one weight file.

    Safetensors files are read from their headers only; torch files as meta tensors. Tensors the index
    assigns to a shard must be in that shard's header.

    Raises:
        CheckpointError: no weight files, a malformed or truncated file, a missing shard, or an index that
            disagrees with its shards.
    """
    path = Path(path)
    index: Path | None = None
    if path.is_dir():
        index, files = find_weights(path)
        if index is None and not files:
            raise _bad(path, "no weights found (model.safetensors[.index.json], pytorch_model.bin[.index.json], "
                       "*.safetensors, *.bin, *.pt)", "Point at the folder that holds the weight files.")  # fmt: skip
    elif path.name.endswith(".index.json"):
        index, files = path, []
    elif path.is_file():
        files = [path]
    else:
        raise _bad(path, "no such file or folder")
    weight_map: dict[str, str] | None = None
    if index is not None:
        files, weight_map = _read_index(index)
    tensors: dict[str, TensorInfo] = {}
    header_bytes = 0
    fmt = "safetensors" if all(f.suffix == ".safetensors" for f in files) else "torch"
    for f in files:
        if f.suffix == ".safetensors":
            found, _, nbytes = read_safetensors_header(f)
            header_bytes += nbytes
        else:
            found = read_torch_meta(f)
        tensors.update(found)
    if weight_map is not None:
        _check_index(index, weight_map, tensors)  # type: ignore[arg-type]
    return Checkpoint(tensors, files, fmt, header_bytes)


def _check_index(index: Path, weight_map: dict[str, str], tensors: dict[str, TensorInfo]) -> None:
    wrong = [n for n, f in weight_map.items() if n not in tensors or tensors[n].file != Path(f).name]
    if wrong:
        raise _bad(index, f"{len(wrong)} tensor(s) are not in the shard the index names: {_names(wrong)}",
                   "The index and the shards come from different downloads; download them again together.")  # fmt: skip


def _names(names: Iterable[str], limit: int = 5) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
