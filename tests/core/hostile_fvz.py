"""Hostile ``.fvz`` files for ``test_fvz_hostile.py``: a ZIP writer that can lie, and the worst cases of issue 30.

``write_zip`` writes the archive by hand, so a member's declared sizes, CRC and compression are whatever a test
says. ``bomb_member`` is a raw deflate stream of ``size`` repeated bytes made without compressing them all (one
compressed MiB, full-flushed, repeated), so a 2 GiB bomb costs a second to build.

Run as a script (``python hostile_fvz.py BASE.fvz OUT_DIR [CASE ...]``) it builds each worst case in turn,
loads and renders it, and prints one JSON line per case: the outcome and the peak RSS above the process's RSS
just before (after importing fakeviz and rendering ``BASE.fvz`` once; the peak is reset before each case).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import sys
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

GiB = 1 << 30
DEFLATED, STORED = 8, 0


def deflate(data: bytes) -> bytes:
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    return co.compress(data) + co.flush()


def bomb_member(prefix: bytes, size: int, fill: bytes = b"\0") -> tuple[bytes, int, int]:
    """``prefix`` then ``fill`` up to ``size`` bytes: (raw deflate stream, crc32, size), built in about a second."""
    block = fill * (1 << 20)
    n, rest = divmod(size - len(prefix), len(block))
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = co.compress(prefix) + co.flush(zlib.Z_FULL_FLUSH)
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = co.compress(block) + co.flush(zlib.Z_FULL_FLUSH)
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = co.compress(fill * rest) + co.flush()
    crc = zlib.crc32(prefix)
    for _ in range(n):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(fill * rest, crc)
    return head + body * n + tail, crc, size


def write_zip(path: Path, entries: list[dict[str, Any]]) -> Path:
    """A ZIP of ``entries``: ``name`` and ``data`` (plain bytes, deflated here) or ``raw`` (an already
    compressed stream, with ``crc`` and ``size``); ``method``, ``crc``, ``size`` (declared uncompressed size) and
    ``csize`` override what the directory declares."""
    out, central = bytearray(), bytearray()
    for e in entries:
        name = e["name"].encode()
        if "raw" in e:
            raw, crc, size = e["raw"], e["crc"], e["size"]
        else:
            data = e["data"]
            raw = deflate(data) if e.get("method", DEFLATED) == DEFLATED else data
            crc, size = zlib.crc32(data), len(data)
        method, crc, size = e.get("method", DEFLATED), e.get("crc", crc), e.get("size", size)
        csize = e.get("csize", len(raw))
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, csize, size, len(name), 0)
        out += name + raw
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, csize, size, len(name), 0, 0, 0, 0, 0,
            offset,
        )  # fmt: skip
        central += name
    cd = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), cd, 0)
    path.write_bytes(bytes(out))
    return path


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def npy_header(dtype: Any, n: int, version: tuple[int, int] = (1, 0), **fields: Any) -> bytes:
    """The ``.npy`` header of ``n`` rows of ``dtype`` (``fields`` override its dict: ``shape``, ``descr``...)."""
    buf = io.BytesIO()
    d = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (n,), **fields}
    (np.lib.format.write_array_header_1_0 if version == (1, 0) else np.lib.format.write_array_header_2_0)(buf, d)
    return buf.getvalue()


def rebuild(path: Path, parts: dict[str, bytes], **override: dict[str, Any]) -> Path:
    """``parts`` (name -> bytes) as a ZIP; ``override[name]`` changes that entry (see :func:`write_zip`)."""
    return write_zip(path, [{"name": n, "data": d, **override.get(n, {})} for n, d in parts.items()])


# ----------------------------------------------------------------- the worst cases of issue 30
def template_bomb(base: Path, out: Path, width: int = 200_000_000) -> Path:
    """Every op-argument string a ``str.format`` template that pads to ``width`` characters (a 9 KB file)."""
    parts = members(base)
    header = json.loads(parts["fakeviz.json"])
    header["strings"]["args"] = [f"{{:>{width}}}" for _ in header["strings"]["args"]]
    parts["fakeviz.json"] = json.dumps(header).encode()
    return rebuild(out / "template.fvz", parts)


def column_bomb(base: Path, out: Path) -> Path:
    """``columns/flops.npy`` inflating to 2 GiB from about 2 MB (its .npy header still says the trace's length)."""
    parts = members(base)
    head = parts["columns/flops.npy"][:128]
    raw, crc, size = bomb_member(head, 2 * GiB)
    entries = [{"name": n, "data": d} for n, d in parts.items() if n != "columns/flops.npy"]
    entries.append({"name": "columns/flops.npy", "raw": raw, "crc": crc, "size": size})
    return write_zip(out / "column_bomb.fvz", entries)


def header_bomb(base: Path, out: Path) -> Path:
    """``fakeviz.json`` inflating to 2 GiB: the real header, then spaces (valid JSON)."""
    parts = members(base)
    raw, crc, size = bomb_member(parts.pop("fakeviz.json"), 2 * GiB, b" ")
    entries = [{"name": "fakeviz.json", "raw": raw, "crc": crc, "size": size}]
    entries += [{"name": n, "data": d} for n, d in parts.items()]
    return write_zip(out / "header_bomb.fvz", entries)


def consistent_bomb(base: Path, out: Path, n: int = 100_000_000) -> Path:
    """``n`` ops of zeros, every member agreeing with the header: 4.2 GB of columns from a 4 MB file."""
    parts = members(base)
    header = json.loads(parts["fakeviz.json"])
    entries = []
    from fakeviz._core.record import column_dtype
    from fakeviz._core.schema import IN_COLS, OP_COLS, OUT_COLS

    for name in header["columns"]:
        if name in OP_COLS:
            header["columns"][name]["length"] = n
            dt = column_dtype(name)
            head = npy_header(dt, n)
            raw, crc, size = bomb_member(head, len(head) + n * dt.itemsize)
            entries.append({"name": f"columns/{name}.npy", "raw": raw, "crc": crc, "size": size})
    for name in (*IN_COLS, *OUT_COLS):  # no inputs or outputs: the offsets (all 0) agree
        header["columns"][name]["length"] = 0
        parts[f"columns/{name}.npy"] = npy(np.zeros(0, column_dtype(name)))
    parts["fakeviz.json"] = json.dumps(header).encode()
    entries += [{"name": k, "data": v} for k, v in parts.items() if k.removeprefix("columns/")[:-4] not in OP_COLS]
    return write_zip(out / f"consistent_{n}.fvz", entries)


def header_values(base: Path, out: Path) -> Path:
    """The most JSON values fakeviz parses: a ``meta`` key holding 990,000 empty lists (3 MB of JSON, just under the limit: each counts as a comma and a bracket)."""
    parts = members(base)
    text = parts["fakeviz.json"].decode()
    filler = ",".join(["[]"] * 990_000)
    parts["fakeviz.json"] = re.sub(r'"meta": \{', '"meta": {"x": [' + filler + "], ", text, count=1).encode()
    return rebuild(out / "header_values.fvz", parts)


CASES = {
    "template": template_bomb, "column_bomb": column_bomb, "header_bomb": header_bomb,
    "consistent_bomb": consistent_bomb, "header_values": header_values,
    # the largest such file the limit lets in: 440,000 ops (18 MB of columns from a 27 KB file)
    "consistent_max": lambda base, out: consistent_bomb(base, out, 440_000),
}  # fmt: skip


def _rss_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, in MB."""
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def _reset_peak() -> bool:
    """Reset this process's peak RSS (Linux: ``5 > /proc/self/clear_refs``); False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _limit_address_space(extra: int) -> None:
    """Let this process map at most ``extra`` bytes more than now: a regression is a MemoryError in this
    process, not the machine's out-of-memory killer (before the fix, the template file took 9 GB)."""
    import resource

    now = int(_rss_mb("VmSize") * 1024 * 1024)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (now + extra, hard))


def run(case: str, base: Path, out: Path) -> dict[str, Any]:
    """Build ``case``, then load and render it (or see it refused): the outcome and the peak RSS above before."""
    import fakeviz as fv
    from fakeviz._frontends.cli import main as cli

    path = CASES[case](base, out)
    if not _reset_peak():
        raise RuntimeError("cannot reset the peak RSS here (/proc/self/clear_refs)")
    baseline = _rss_mb("VmRSS")
    t0 = time.perf_counter()
    try:
        trace = fv.load(path)
    except fv.TraceFormatError as exc:
        outcome = f"TraceFormatError: {exc}"
    except MemoryError:
        outcome = "MemoryError"
    else:
        try:
            trace.oplog(limit=5)
            _ = trace.ops
            trace.to_html(out / "x.html")
            with contextlib.redirect_stdout(io.StringIO()):
                cli(["report", str(path), "--oplog", "5"])
            outcome = "loaded and rendered"
        except MemoryError:
            outcome = "MemoryError"
        del trace
    peak = _rss_mb("VmHWM") - baseline
    size = path.stat().st_size
    path.unlink()
    return {"case": case, "outcome": outcome[:300], "file_bytes": size,
            "peak_above_baseline_mb": round(peak, 1), "seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip


def main(base: str, out: str, *cases: str) -> None:
    """Each case in turn, in this one process (the peak is reset before each), one JSON line per case."""
    import fakeviz as fv

    fv.load(base).to_html(Path(out) / "base.html")  # fakeviz, pandas and plotly imported and warm
    _limit_address_space(2 << 30)
    for case in cases or CASES:
        print(json.dumps(run(case, Path(base), Path(out))), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
