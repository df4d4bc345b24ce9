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
    checked against ``os.fstat`` of the open file (a truncated download is an error), never by reading it.

Note: [hostile checkpoints]
    A checkpoint folder is data from elsewhere, read with bounded cost and nothing outside it:

    * Confined: every file read from a folder (the index, each shard it names, the weight files found) must
      resolve, symlinks followed, inside that folder, or be a blob of a Hugging Face hub cache
      (``.../models--org--name/blobs/<hash>``: the hub's snapshot folders and older ``local_dir`` downloads
      are symlinks to those). An index's shard names are checked as text first (absolute, ``..``, empty,
      NUL: refused without touching the file system), then resolved; one outside is a
      :class:`CheckpointError` naming the entry, raised before any ``stat`` or ``open`` of it and worded
      the same whether or not the path exists.
    * Bounded: a header longer than safetensors' own limit (:data:`SAFETENSORS_MAX_HEADER`) is not a
      safetensors file; fakeviz reads headers of up to :data:`MAX_HEADER_BYTES` and indexes of up to
      :data:`MAX_INDEX_BYTES`, because ``json.loads`` takes up to about 25 bytes of memory per byte of
      JSON (``[{},{},...]``) and about 60 ms per MiB: a 99 MiB header of 1.77 M tensors took 1.76 GB and
      15 s. A checkpoint holds at most :data:`MAX_TENSORS` tensors and :data:`MAX_TOTAL_HEADER_BYTES`
      of headers across its shards. A published shard's header is far below 1 MiB (about 100 bytes
      per tensor, a few hundred tensors per shard).
    * Checked as safetensors checks it (``Metadata::validate`` in safetensors' ``tensor.rs``): strict JSON
      (no ``NaN``/``Infinity``, no key twice in an object, as serde_json), every field of its JSON type,
      ``__metadata__`` an object of strings, each shape's byte count without overflow, the tensors' byte
      ranges back to back from 0 to the end of the file (no overlap, no gap, no trailing bytes). Each error
      names the file, the tensor and the field, shown with :mod:`reprlib` so that a hostile value cannot
      make the message long.
"""

from __future__ import annotations

import json
import os
import reprlib
import struct
import warnings
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch

from .._core.errors import CheckpointError, FakeVizWarning

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_INDEX_BYTES",
    "MAX_TENSORS",
    "MAX_TOTAL_HEADER_BYTES",
    "SAFETENSORS_DTYPES",
    "SAFETENSORS_MAX_HEADER",
    "Checkpoint",
    "TensorInfo",
    "checkpoint_file",
    "find_weights",
    "gather",
    "index_shards",
    "parse_index",
    "parse_safetensors_header",
    "read_checkpoint",
    "read_safetensors_header",
    "read_torch_meta",
    "safetensors_header_length",
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

#: safetensors' own header limit: ``const MAX_HEADER_SIZE: usize = 100_000_000`` in huggingface/safetensors,
#: ``safetensors/src/tensor.rs`` (``SafeTensors::read_metadata`` refuses a longer header: ``HeaderTooLarge``).
SAFETENSORS_MAX_HEADER = 100_000_000
#: The longest safetensors header fakeviz reads (Note: [hostile checkpoints]): parsing one took at most 420 MiB
#: (``[{},{},...]``; 250 MiB for the most tensors it can hold, 300,841).
MAX_HEADER_BYTES = 16 * 2**20
#: The longest ``*.index.json`` fakeviz reads (an index takes about 100 bytes per tensor).
MAX_INDEX_BYTES = 16 * 2**20
#: The most tensors, and header bytes, one checkpoint may hold across its shards (checked after each shard:
#: 900,000 tensors in three 16 MiB headers took 410 MiB and 10 s to read).
MAX_TENSORS = 2**20
MAX_TOTAL_HEADER_BYTES = 256 * 2**20
_MAX_DIM = 2**63 - 1  # torch sizes are int64; safetensors' offsets are usize (u64)
_MAX_OFFSET = 2**64 - 1

_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother, _short.maxlong = 2, 60, 60, 40
_short.maxlist = _short.maxtuple = _short.maxdict = 6


@dataclass(frozen=True, slots=True)
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
        CheckpointError: the file is not a safetensors file, its header is malformed or longer than
            :data:`MAX_HEADER_BYTES`, or the file is shorter than its header says (a truncated download).
            Note: [hostile checkpoints].
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = safetensors_header_length(f.read(8), size, path)
        raw = f.read(n)
    if len(raw) != n:
        raise _bad(path, f"the file ended inside its {n:,}-byte header: the file is truncated", _REFETCH)
    return parse_safetensors_header(raw, size, path)


def safetensors_header_length(first: bytes, size: int, where: Path | str) -> int:
    """The header length the first 8 bytes of a safetensors file of ``size`` bytes give, checked against the file's
    size, safetensors' own limit and :data:`MAX_HEADER_BYTES` before any byte of the header is read.

    ``where`` names the file in errors (a path, or a hub file as ``owner/name@revision:file``).
    """
    if size < 8 or len(first) < 8:
        raise _bad(where, f"{size} bytes: too short for a safetensors file (8-byte header length missing)", _REFETCH)
    (n,) = struct.unpack("<Q", first[:8])
    if n > size - 8:
        raise _bad(
            where, f"header length {n:,} does not fit in a file of {size:,} bytes: not a safetensors file", _REFETCH
        )
    if n > SAFETENSORS_MAX_HEADER:
        raise _bad(where, f"header length {n:,} is over safetensors' own limit of {SAFETENSORS_MAX_HEADER:,} "
                   "bytes: not a safetensors file (safetensors refuses it too)", _REFETCH)  # fmt: skip
    if n > MAX_HEADER_BYTES:
        raise _bad(where, f"a header of {n / 2**20:,.1f} MiB is larger than fakeviz reads ({_size(MAX_HEADER_BYTES)}, "
                   "about 300,000 tensors; published shards have headers under 1 MiB)",
                   "Save the checkpoint in smaller shards (save_pretrained(max_shard_size=...)), or build the "
                   "model from its config alone with fakeviz.models.build(folder).")  # fmt: skip
    return n


def parse_safetensors_header(
    raw: bytes, size: int, where: Path | str, file: str | None = None
) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """The checked tensors of a safetensors header ``raw`` (the bytes after its 8-byte length) of a file of ``size``
    bytes: the one parser of local files and of headers read over HTTP (Note: [hostile checkpoints]).

    ``file`` is the name each :class:`TensorInfo` records (default: ``where``'s last part). Returns ``(tensors,
    metadata, 8 + len(raw))``, as :func:`read_safetensors_header`.
    """
    fix = _REFETCH
    n = len(raw)
    file = file if file is not None else PurePosixPath(str(where).replace("\\", "/")).name
    if 8 + n > size:
        raise _bad(where, f"the file ended inside its {n:,}-byte header: the file is truncated", fix)
    try:
        header = _strict_json(raw)
    except RecursionError as e:
        raise _bad(where, "the header nests JSON too deeply to be a safetensors header", fix) from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer over Python's digit limit
        raise _bad(where, f"the header is not JSON ({str(e)[:200]})", fix) from e
    if not isinstance(header, dict):
        raise _bad(where, f"the header is a JSON {_json_type(header)}, not an object", fix)
    meta = _metadata(where, header.pop("__metadata__", None), fix)
    tensors = _entries(where, file, header, size - 8 - n, fix)
    return tensors, meta, 8 + n


_REFETCH = "Re-download the file, or check that it is a safetensors file."


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {_short.repr(key)} appears twice in one object")
            seen.add(key)
    return out


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict_json(raw: bytes) -> Any:
    """``json.loads`` as strict as safetensors' serde_json: no NaN/Infinity, no key twice in one object."""
    return json.loads(raw, object_pairs_hook=_pairs, parse_constant=_constant)


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)  # fmt: skip


def _field(path: Path | str, name: str, field: str, value: Any, want: str, fix: str) -> CheckpointError:
    return _bad(path, f"tensor {_short.repr(name)}: field {field!r} is {_short.repr(value)} (a JSON "
                f"{_json_type(value)}), where safetensors has {want}", fix)  # fmt: skip


def _metadata(path: Path | str, meta: Any, fix: str) -> dict[str, str]:
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise _bad(path, f"field '__metadata__' is a JSON {_json_type(meta)}, where safetensors has an object of "
                   "strings", fix)  # fmt: skip
    for k, v in meta.items():
        if not isinstance(v, str):
            raise _bad(path, f"field '__metadata__' entry {_short.repr(k)} is {_short.repr(v)} (a JSON "
                       f"{_json_type(v)}), where safetensors has a string", fix)  # fmt: skip
    return meta


def _uint(value: Any, limit: int) -> bool:
    return type(value) is int and 0 <= value <= limit


def _entries(path: Path | str, file: str, header: dict[str, Any], data_size: int, fix: str) -> dict[str, TensorInfo]:
    """Each entry of a parsed header checked field by field, then the byte ranges as safetensors checks them."""
    tensors: dict[str, TensorInfo] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise _bad(path, f"tensor {_short.repr(name)}: its entry is {_short.repr(entry)} (a JSON "
                       f"{_json_type(entry)}), where safetensors has an object", fix)  # fmt: skip
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise _bad(path, f"tensor {_short.repr(name)}: field {key!r} is missing", fix)
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(code, str):
            raise _field(path, name, "dtype", code, 'a dtype code such as "BF16"', fix)
        if not (isinstance(shape, list) and all(_uint(s, _MAX_DIM) for s in shape)):
            raise _field(path, name, "shape", shape, "an array of non-negative integers", fix)
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_uint(o, _MAX_OFFSET) for o in offsets)):
            raise _field(path, name, "data_offsets", offsets, "an array of two non-negative integers", fix)
        begin, end = offsets
        if begin > end:
            raise _field(path, name, "data_offsets", offsets, "[begin, end] with begin <= end", fix)
        if code not in SAFETENSORS_DTYPES:
            raise _bad(path, f"tensor {_short.repr(name)}: dtype {_short.repr(code)} is not known to this torch build",
                       "Upgrade torch, or convert the checkpoint to a supported dtype.")  # fmt: skip
        dtype = SAFETENSORS_DTYPES[code]
        nbytes = dtype.itemsize
        for s in shape:  # safetensors: checked_mul, an overflow is an error (ValidationOverflow)
            nbytes *= s
            if nbytes > _MAX_OFFSET:
                raise _field(path, name, "shape", shape, "a shape whose byte count fits in 64 bits", fix)
        if end - begin != nbytes:
            raise _bad(path, f"tensor {_short.repr(name)}: field 'data_offsets' spans {end - begin:,} bytes, but shape "
                       f"{_short.repr(shape)} of {code} takes {nbytes:,}", fix)  # fmt: skip
        if end > data_size:
            raise _bad(path, f"tensor {_short.repr(name)} ends at byte {end:,} of the data, but the file holds "
                       f"{data_size:,} bytes of data: the file is truncated", fix)  # fmt: skip
        tensors[name] = TensorInfo(dtype, tuple(shape), file)
        ranges.append((begin, end, name))
    ranges.sort()
    at, before = 0, ""
    for begin, end, name in ranges:  # safetensors' Metadata::validate: back to back from byte 0
        if begin != at:
            what = (f"overlaps tensor {_short.repr(before)} (which ends at byte {at:,})" if begin < at else
                    f"leaves bytes {at:,}-{begin:,} of the data to no tensor")  # fmt: skip
            raise _bad(path, f"tensor {_short.repr(name)}: field 'data_offsets' [{begin:,}, {end:,}] {what}; "
                       "safetensors refuses such a file", fix)  # fmt: skip
        at, before = end, name
    if at != data_size:
        raise _bad(path, f"the tensors end at byte {at:,} of the data, but the file holds {data_size:,}: "
                   "safetensors refuses a file with bytes after its last tensor", fix)  # fmt: skip
    return tensors


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
    then any ``*.safetensors``, then any ``*.bin``/``*.pt`` (sorted by name). A symlink counts whatever it
    points to, so that :func:`read_checkpoint` refuses one pointing outside the folder in the same words
    whether or not its target exists (Note: [hostile checkpoints]).
    """
    folder = Path(folder)
    for name in _INDEXES:
        if _present(folder / name):
            return folder / name, []
    for name in _SINGLES:
        if _present(folder / name):
            return None, [folder / name]
    for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth"):
        found = sorted(p for p in folder.glob(pattern) if _present(p))
        if found:
            return None, found
    return None, []


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a name the file system refuses (too long, not encodable) instead of raising."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _present(path: Path) -> bool:
    try:
        return path.is_file() or path.is_symlink()
    except (OSError, ValueError):
        return False


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n:,} bytes"


_HUB_BLOBS = "blobs"


def _within(target: Path, root: Path) -> bool:
    """``target`` (resolved) is inside ``root`` (resolved), or is a blob of a Hugging Face hub cache."""
    if target.is_relative_to(root):
        return True
    return target.parent.name == _HUB_BLOBS and target.parent.parent.name.startswith("models--")


def _outside(folder: Path, name: Any, root: Path | None = None) -> str | None:
    """Why ``folder / name`` is not a file inside ``folder`` (``root``: it resolved), or None.

    Note: [hostile checkpoints].
    """
    why = _textual(name)
    if why is not None:
        return why
    try:  # only now the file system: the symlinks on the way, inside the folder
        root = root or folder.resolve()
        target = (root / name).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop; a name the file system cannot encode
        return "cannot be resolved (a symlink loop, or not a file name here)"
    if _within(target, root):
        return None
    return "resolves outside the checkpoint folder (a symlink?)"


def _textual(name: Any) -> str | None:
    """Why ``name``, as text, is not a relative file name inside a checkpoint (before any file system call)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        return "is not a file name"
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or name.startswith(("/", "\\")):
        return "is an absolute path, outside the checkpoint folder"
    if ".." in posix.parts or ".." in windows.parts:
        return "climbs out of the checkpoint folder ('..')"
    return None


def checkpoint_file(folder: str | os.PathLike[str], name: str, *, what: str = "file") -> Path:
    """``folder / name``, refused unless it resolves inside ``folder`` (Note: [hostile checkpoints]).

    ``name`` is checked as text before the file system is asked anything (absolute, ``..``, empty, NUL),
    then resolved with its symlinks; the answer does not depend on whether a path outside exists.

    Raises:
        CheckpointError: ``name`` is not a relative path inside ``folder``.
    """
    folder = Path(folder)
    why = _outside(folder, name)
    if why is not None:
        raise _bad(folder, f"{what} {_short.repr(name)} {why}", _CONFINED)
    return folder / name


_CONFINED = "A checkpoint's files must be inside its folder: re-download the checkpoint, or fix its index."


def _read_index(index: Path) -> tuple[list[Path], dict[str, str]]:
    """The shard files an index names (each once, in order) and its weight map, from one bounded read of the index.

    Every shard must be inside the index's folder (:func:`checkpoint_file`), checked before any is opened.
    """
    if not _is_file(index):
        raise _bad(index, "not a file", _INDEX_FIX)
    try:
        with open(index, "rb") as f:
            data = f.read(MAX_INDEX_BYTES + 1)
    except OSError as e:
        raise _bad(index, f"cannot be read ({type(e).__name__}: {e.strerror or e})") from e
    weight_map = parse_index(data, index)
    shards = _shards(weight_map, index)
    root = index.parent.resolve()
    for shard, tensor in shards.items():  # every name confined before any shard is looked at
        why = _outside(index.parent, shard, root)
        if why is not None:
            raise _bad(index, f"weight_map entry {_short.repr(tensor)}: shard {_short.repr(shard)} {why}", _CONFINED)
    files = [index.parent / shard for shard in shards]
    missing = [shard for shard, f in zip(shards, files) if not _is_file(f)]
    if missing:
        raise _bad(index, f"{len(missing)} shard(s) named in the index are missing: {_names(missing)}",
                   "Download the missing shards (or all of the checkpoint) into the same folder.")  # fmt: skip
    return files, weight_map


_INDEX_FIX = "An index is JSON with a 'weight_map' of tensor name -> shard file; re-download it."


def parse_index(data: bytes, where: Path | str) -> dict[str, str]:
    """The weight map (tensor name -> shard file) of an index's bytes, checked (Note: [hostile checkpoints]).

    ``data`` is at most ``MAX_INDEX_BYTES + 1`` bytes (a longer index is refused); ``where`` names it in errors.
    """
    fix = _INDEX_FIX
    if len(data) > MAX_INDEX_BYTES:
        raise _bad(where, f"longer than the {_size(MAX_INDEX_BYTES)} fakeviz reads from an index (about "
                   "150,000 tensors)", "Build the model from its config alone with "
                   "fakeviz.models.build(folder).")  # fmt: skip
    try:
        raw = _strict_json(data)
    except RecursionError as e:
        raise _bad(where, "nests JSON too deeply to be a checkpoint index", fix) from e
    except ValueError as e:
        raise _bad(where, f"not a checkpoint index (not JSON: {str(e)[:200]})", fix) from e
    if not isinstance(raw, dict):
        raise _bad(where, f"not a checkpoint index (a JSON {_json_type(raw)}, not an object)", fix)
    if "weight_map" not in raw:
        raise _bad(where, "not a checkpoint index (no 'weight_map')", fix)
    weight_map = raw["weight_map"]
    if not isinstance(weight_map, dict):
        raise _bad(where, f"field 'weight_map' is a JSON {_json_type(weight_map)}, where an index has an object", fix)
    if len(weight_map) > MAX_TENSORS:
        raise _bad(where, f"names {len(weight_map):,} tensors, more than the {MAX_TENSORS:,} fakeviz reads",
                   "Build the model from its config alone with fakeviz.models.build(folder).")  # fmt: skip
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise _bad(where, f"weight_map entry {_short.repr(tensor)} is {_short.repr(shard)} (a JSON "
                       f"{_json_type(shard)}), where an index has a shard file name", fix)  # fmt: skip
    return weight_map


def _shards(weight_map: dict[str, str], where: Path | str) -> dict[str, str]:
    """Each shard an index names, once, in order -> the first tensor naming it."""
    shards: dict[str, str] = {}
    for tensor, shard in weight_map.items():
        shards.setdefault(shard, tensor)
    return shards


def index_shards(weight_map: dict[str, str], where: Path | str) -> list[str]:
    """The shard names of a weight map, each once, in order, refused as text if one is not a relative file name
    inside the checkpoint (absolute, ``..``, empty, NUL): for an index whose shards are not files here (the hub's)."""
    shards = _shards(weight_map, where)
    for shard, tensor in shards.items():
        why = _textual(shard)
        if why is not None:
            raise _bad(where, f"weight_map entry {_short.repr(tensor)}: shard {_short.repr(shard)} {why}", _CONFINED)
    return list(shards)


def gather(
    where: Path | str, headers: Iterable[tuple[dict[str, TensorInfo], int]], weight_map: dict[str, str] | None
) -> tuple[dict[str, TensorInfo], int]:
    """The tensors of a checkpoint's files, one header at a time, within :data:`MAX_TENSORS` and
    :data:`MAX_TOTAL_HEADER_BYTES` (checked after each file), and agreeing with the index's ``weight_map``.

    ``headers`` yields ``(tensors, header bytes)`` per file, lazily: reading stops at the file over a limit.
    Returns ``(tensors, header bytes)``.
    """
    tensors: dict[str, TensorInfo] = {}
    header_bytes = 0
    for found, nbytes in headers:
        header_bytes += nbytes
        tensors.update(found)
        if len(tensors) > MAX_TENSORS or header_bytes > MAX_TOTAL_HEADER_BYTES:
            last = next(iter(found.values())).file if found else "a file"
            raise _bad(where, f"more than {MAX_TENSORS:,} tensors or {_size(MAX_TOTAL_HEADER_BYTES)} of headers "
                       f"(after {last}: {len(tensors):,} tensors, {header_bytes:,} bytes of headers): more than "
                       "fakeviz reads", "Build the model from its config alone with fakeviz.models.build(folder).")  # fmt: skip
    if weight_map is not None:
        _check_index(where, weight_map, tensors)
    return tensors, header_bytes


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
        for f in [index] if index is not None else files:
            checkpoint_file(path, f.name, what="weight file")
            if not _is_file(f):
                raise _bad(path, f"weight file {_short.repr(f.name)} is not a file (a broken symlink?)",
                           "Re-download the checkpoint.")  # fmt: skip
    elif path.name.endswith(".index.json"):
        index, files = path, []
    elif path.is_file():
        files = [path]
    else:
        raise _bad(path, "no such file or folder")
    weight_map: dict[str, str] | None = None
    if index is not None:
        files, weight_map = _read_index(index)
    fmt = "safetensors" if all(f.suffix == ".safetensors" for f in files) else "torch"

    def headers() -> Iterable[tuple[dict[str, TensorInfo], int]]:
        for f in files:
            if f.suffix == ".safetensors":
                found, _, nbytes = read_safetensors_header(f)
                yield found, nbytes
            else:
                yield read_torch_meta(f), 0

    tensors, header_bytes = gather(index if index is not None else path, headers(), weight_map)
    return Checkpoint(tensors, files, fmt, header_bytes)


def _check_index(index: Path | str, weight_map: dict[str, str], tensors: dict[str, TensorInfo]) -> None:
    wrong = [n for n, f in weight_map.items() if n not in tensors or tensors[n].file != Path(f).name]
    if wrong:
        raise _bad(index, f"{len(wrong)} tensor(s) are not in the shard the index names: {_names(wrong)}",
                   "The index and the shards come from different downloads; download them again together.")  # fmt: skip


def _names(names: Iterable[str], limit: int = 5) -> str:
    names = list(names)
    shown = ", ".join(n if len(n) <= 80 else n[:77] + "..." for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
