"""Saving a trace (``Trace.save``, ``fakeviz._core.fvz.write``, ``fakeviz report --save/--html``) writes a regular
file or nothing: never through or over a device, FIFO, socket or folder, never over the trace being read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

import fakeviz as fv
from fakeviz._core.errors import ArgumentError
from fakeviz._frontends.cli import main


@pytest.fixture(scope="module")
def trace():
    with fv.record() as t:
        torch.randn(2) * 2
    return t


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def _device(tmp_path: Path) -> Path:
    """A character device of this test's own (/dev/null's numbers), never a real one: as root, the old save
    replaced /dev/full."""
    node = tmp_path / "null-device"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError, OSError) as e:
        pytest.skip(f"cannot make a device node here ({e})")
    return node


def _specials(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.fvz"
    folder.mkdir()
    to_fifo = tmp_path / "to-fifo.fvz"
    to_fifo.symlink_to(fifo)
    return {"fifo": (fifo, "a FIFO (named pipe)"), "folder": (folder, "a folder"),
            "symlink-to-fifo": (to_fifo, "a FIFO (named pipe) (through a symlink)")}  # fmt: skip


@pytest.mark.parametrize("kind", ["fifo", "folder", "symlink-to-fifo"])
def test_save_refuses_what_is_not_a_regular_file(trace, tmp_path, kind):
    path, words = _specials(tmp_path)[kind]
    before = os.lstat(path)
    with pytest.raises(ArgumentError) as ei:
        trace.save(path)
    assert str(ei.value) == (f"path={str(path)!r}: {words}, not a regular file: saving never replaces one\n"
                             "Give the path of a .fvz file, new or one to replace.")  # fmt: skip
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)  # the same node, untouched
    assert _leftovers(tmp_path) == []


def test_save_refuses_a_device(trace, tmp_path):
    node = _device(tmp_path)
    with pytest.raises(ArgumentError, match="a character device, not a regular file"):
        trace.save(node)
    assert stat.S_ISCHR(os.lstat(node).st_mode) and _leftovers(tmp_path) == []


def test_save_replaces_a_regular_file_and_a_symlink_never_its_target(trace, tmp_path):
    old = tmp_path / "old.fvz"
    old.write_bytes(b"old")
    trace.save(old)
    assert fv.load(old).num_ops == trace.num_ops
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "link.fvz"
    link.symlink_to(victim)
    trace.save(link)  # the link is replaced by the trace; what it named is not written
    assert victim.read_text() == "keep me" and not link.is_symlink() and fv.load(link).num_ops == trace.num_ops
    planted = tmp_path / "new.fvz.tmp"  # the old save's fixed temporary name, planted as a link to the victim
    planted.symlink_to(victim)
    trace.save(tmp_path / "new.fvz")
    assert victim.read_text() == "keep me" and planted.is_symlink()
    assert [p.name for p in _leftovers(tmp_path)] == ["new.fvz.tmp"]  # only the planted link


def test_cli_never_writes_over_the_trace_it_reads(trace, tmp_path, capsys):
    src = tmp_path / "x.fvz"
    trace.save(src)
    data = src.read_bytes()
    for flag in ("--save", "--html", "--json"):
        assert main(["report", str(src), flag, str(src)]) == 2
        err = capsys.readouterr().err
        assert f"fakeviz: error: {flag} {str(src)!r}: the file being read; give another file name" in err
        assert src.read_bytes() == data
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["report", str(src), "--save", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert main(["report", str(src), "--save", str(tmp_path / "y.fvz")]) == 0  # the working call
    assert fv.load(tmp_path / "y.fvz").num_ops == trace.num_ops
