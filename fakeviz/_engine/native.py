"""The recorder's per-op path in C (``csrc/fvcore.c``), built on first use.

Note: [recorder core in C]
Recording a fake Llama run cost about 10 us of Python per op on top of the fake
kernel, most of it interpreter overhead (attribute and dict lookups, tuple packing,
frames), not work. ``fvcore.c`` does, with the CPython C API only (no torch headers),
what these Python pieces do on their common paths:

* the recording mode's ``__torch_dispatch__`` and its two dispatch-cache hooks
  (bound to the mode instance while it records, see ``_install_core_hooks``),
* ``_State.run_op``, ``_State.record``, ``_State.pack_saved``, new storages and
  their free callbacks,
* the fast fake detach (Note: [fast fake detach]) of saved-tensor aliases and of
  autograd's unpack detaches.

Every uncommon path (an op the recorded op cache has not seen, an unseen input
tensor, a new code object or source line, lift_fresh, errors, ...) calls the Python
method that handles it, so the Python implementation stays the single definition of
what is recorded: the C core must give the same trace, which ``tests/test_core.py``
checks column by column.

It is compiled once with the system C compiler (under a second), cached next to
the fake-cuda shim (``$FAKEVIZ_CACHE_DIR`` or ``~/.cache/fakeviz``) under a name
that hashes the source and the Python build, and imported from there. Without a
compiler, or with ``FAKEVIZ_PURE_PYTHON=1``, the Python implementation records
(slower, same trace); :func:`status` says which one is in use and why.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from .cuda_shim import cache_dir

__all__ = ["core", "status"]

_SRC = Path(__file__).with_name("csrc") / "fvcore.c"
_lock = threading.Lock()
_state: dict[str, object] = {}


def _library_path() -> Path:
    key = hashlib.sha256(_SRC.read_bytes() + sys.version.encode() + sys.executable.encode())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_dir() / f"fvcore_{key.hexdigest()[:16]}{suffix}"


def _compile(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    lang: list[str] = []
    if cc is None:
        cc = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
        lang = ["-x", "c"]
    if cc is None:
        raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang, $CXX, c++, g++, clang++)")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RuntimeError(f"Python headers not found ({include}/Python.h)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cc, "-O2", "-shared", "-fPIC", "-w", *lang, f"-I{include}", str(_SRC), "-o", tmp]
    if sys.platform == "darwin":
        cmd[1:1] = ["-undefined", "dynamic_lookup"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(
                f"compiling the recorder core failed ({cc} exited with {proc.returncode}): {proc.stderr[-2000:]}"
            )
        os.replace(tmp, target)  # atomic: concurrent builders never load half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> ModuleType:
    path = _library_path()
    if not path.exists():
        _compile(path)
    loader = importlib.machinery.ExtensionFileLoader("_fvcore", str(path))
    spec = importlib.util.spec_from_loader("_fvcore", loader, origin=str(path))
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def core() -> ModuleType | None:
    """The compiled core module, or None when the Python implementation must record."""
    if os.environ.get("FAKEVIZ_PURE_PYTHON", "") not in ("", "0"):
        return None
    with _lock:
        if "module" not in _state:
            try:
                _state["module"] = _load()
                _state["reason"] = ""
            except Exception as exc:  # noqa: BLE001 - any failure: record in Python, say why
                _state["module"] = None
                _state["reason"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        return _state["module"]  # type: ignore[return-value]


def status() -> str:
    """``"c"`` or ``"python (why)"``: which recorder core records in this process."""
    if os.environ.get("FAKEVIZ_PURE_PYTHON", "") not in ("", "0"):
        return "python (FAKEVIZ_PURE_PYTHON is set)"
    mod = core()
    return "c" if mod is not None else f"python ({_state.get('reason', '')})"
