"""The recorder's per-op path in C (``csrc/fvcore.c`` and its parts in ``csrc/fvcore/``), built on first use.

Note: [recorder core in C]
Recording a fake Llama run cost about 10 us of Python per op on top of the fake
kernel, most of it interpreter overhead (attribute and dict lookups, tuple packing,
frames), not work. The C core does, with the CPython C API only (no torch headers),
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
what is recorded: the C core must give the same trace, which ``tests/engine/test_native_core.py``
checks column by column.

The C core writes rows by column name: the row widths and field positions come from a header,
``fv_schema.h``, generated from :data:`fakeviz._core.schema.LAYOUT` at build time
(:func:`schema_header`), so the layout is declared once, in Python. Likewise every name it reaches Python
objects by (attributes, keyword arguments, the frame depth) is declared in ``native_contract.py`` and
generated into ``fv_names.h``; the build refuses sources that disagree with it and the loaded core must
carry the same contract hash (Note: [the C core's contract]).

The source is one translation unit in several files (a "unity build"): ``fvcore.c`` holds the
``Core`` type and the module, and includes its parts from ``csrc/fvcore/`` (``core.h``: the struct,
interned names and shared helpers; then storages, output rows, record, run_op, fast detach, the
fake mode's hooks, pack_saved; each says at its top what it holds), so every function stays
``static`` and inlines across parts. Only ``fvcore.c`` is compiled, once, with the system C
compiler (under a second), cached next to the fake-cuda shim (``$FAKEVIZ_CACHE_DIR`` or
``~/.cache/fakeviz``) under a name that hashes every source file (:func:`_sources`: an edit to any
part builds a new core), the generated header and the Python build (a layout change builds a new
core too), and imported from there; the core also refuses, at construction, a layout other than
the one it was built for (:func:`layout_signature`). Without a compiler, or with
``FAKEVIZ_PURE_PYTHON=1``, the Python implementation records (slower, same trace);
:func:`status` says which one is in use and why.

Note: [the C core's torch contract]
The recorder overrides and calls private methods of FakeTensorMode and reads fields of its dispatch-cache
entries; :data:`TORCH_CONTRACT` lists each with the parameters (fields) fakeviz was written for, the one table
of them. The Python recorder binds each to the signature the installed torch has (Note: [private torch
signatures] in ``recorder/signatures.py``: adapted by name, or stepped aside to torch's own path with one
warning). The C core calls ``__torch_dispatch__`` positionally (:data:`CORE_NEEDS`): a torch that changed it
records with the Python implementation, and one :class:`~fakeviz._engine.torch_compat.TorchInternalsWarning`
says what changed (``status()`` too). The C core's two dispatch-cache hooks are installed only where torch
kept their signature; elsewhere the Python recorder's adapted hooks serve and the C core records the rest.
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

from .._core import schema as _schema
from . import native_contract as _contract
from .cuda_shim import cache_dir

__all__ = ["CORE_NEEDS", "TORCH_CONTRACT", "check_contract", "column_macro", "contract_problems", "core",
           "layout_signature", "schema_header", "status", "torch_parameters"]  # fmt: skip

_CSRC = Path(__file__).with_name("csrc")
_SRC = _CSRC / "fvcore.c"  # the one file compiled; it includes the parts
_PARTS = _CSRC / "fvcore"  # the parts fvcore.c includes (``#include "fvcore/<part>"``)
_lock = threading.Lock()
_state: dict[str, object] = {}


HEADER = "fv_schema.h"

#: What the recorder relies on in ``torch._subclasses.fake_tensor`` (Note: [the C core's torch contract]):
#: ``FakeTensorMode`` methods (and module functions) by the parameters fakeviz was written for, dataclasses by
#: their fields. ``recorder/signatures.py`` binds the methods to what torch has; a field that moved turns the
#: light cache-hit outputs off (Note: [light cache-hit outputs]).
TORCH_CONTRACT: dict[str, tuple[str, ...]] = {
    # the dispatch protocol, called positionally by the C core and by the recording mode
    "FakeTensorMode.__torch_dispatch__": ("self", "func", "types", "args", "kwargs"),
    # overridden by the recording mode (recorder/modes.py), torch's own called from the override
    "FakeTensorMode._dispatch_impl": ("self", "func", "types", "args", "kwargs"),
    "FakeTensorMode._validate_cache_key": ("self", "func", "args", "kwargs"),
    "FakeTensorMode._cache_key": ("self", "state", "func", "args", "kwargs"),
    "FakeTensorMode._output_from_cache_entry": ("self", "state", "entry", "key", "func", "args"),
    "FakeTensorMode._make_cache_entry": ("self", "state", "key", "func", "args", "kwargs", "output"),
    "FakeTensorMode.validate_and_convert_non_fake_tensors": ("self", "func", "converter", "flat_args", "args_spec"),
    "FakeTensorMode.may_turn_const": ("self", "t"),
    # called only: the dispatch cache with values hidden (values.py), the fallback-kernel probe (recorder/modes.py)
    "FakeTensorMode._cached_dispatch_impl": ("self", "func", "types", "args", "kwargs"),
    "run_fallback_kernel": ("fake_mode", "func", "flat_args", "args_spec", "orig_not_implemented_exception"),
    # read by the light cache-hit outputs (recorder/fastpath.py)
    "_DispatchCacheValidEntry": ("output_infos", "is_output_tuple"),
    "_DispatchCacheEntryOutputInfo": ("inplace_idx", "metadata", "view_idx", "constant_value"),
}

#: The entries of :data:`TORCH_CONTRACT` the C core cannot record without (it calls them positionally).
CORE_NEEDS: tuple[str, ...] = ("FakeTensorMode.__torch_dispatch__",)


def torch_parameters(path: str) -> tuple[str, ...] | None:
    """The parameters (a dataclass's fields) that ``torch._subclasses.fake_tensor.<path>`` has in the installed
    torch, ``self`` included; None where torch has no such name, ``()`` where it has no signature to read."""
    import dataclasses
    import inspect

    import torch._subclasses.fake_tensor as ft

    obj: object = ft
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if dataclasses.is_dataclass(obj):
        return tuple(f.name for f in dataclasses.fields(obj))
    try:
        return tuple(inspect.signature(obj).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ()


def contract_problems(contract: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """How the installed torch differs from ``contract`` (by default all of :data:`TORCH_CONTRACT`; empty when it
    keeps it)."""
    problems = []
    for path, expected in (TORCH_CONTRACT if contract is None else contract).items():
        got = torch_parameters(path)
        if got is None:
            problems.append(f"{path} is missing")
        elif got != expected:
            problems.append(f"{path}({', '.join(got)}) where fakeviz expects ({', '.join(expected)})")
    return problems


def column_macro(prefix: str, column: str) -> str:
    """The C name of a column's position: ``FV_<table>_<column>``, less the table's own prefix
    (``("OP", "phase")`` -> ``FV_OP_PHASE``, ``("ST", "st_free")`` -> ``FV_ST_FREE``)."""
    short = column[len(prefix) + 1 :] if column.startswith(prefix.lower() + "_") else column
    return f"FV_{prefix}_{short.upper()}"


def layout_signature() -> str:
    """The row layout and phase codes in one line, ``OP=op,phase,...;OUT=...;...;PHASES=init,...``: handed
    to the C core, which refuses to record with any other than the one its header was generated from."""
    tables = [f"{prefix}=" + ",".join(cols) for prefix, _, cols in _schema.LAYOUT]
    return ";".join([*tables, "PHASES=" + ",".join(_schema.PHASES)])


def schema_header() -> str:
    """The text of ``fv_schema.h``: for every row table of :data:`fakeviz._core.schema.LAYOUT` its
    width (``FV_OP_WIDTH``) and the position of each column in a row (``FV_OP_PHASE``), the code of
    each phase (``FV_PHASE_BACKWARD``) and the layout signature (``FV_LAYOUT``, see
    :func:`layout_signature`)."""
    lines = [
        f"/* {HEADER}: generated by fakeviz._engine.native.schema_header() from fakeviz._core.schema.LAYOUT;",
        " * do not edit (nor check in: it is written next to each build). */",
        "#ifndef FV_SCHEMA_H",
        "#define FV_SCHEMA_H",
    ]
    names: set[str] = set()
    for prefix, attr, cols in _schema.LAYOUT:
        width = f"FV_{prefix}_WIDTH"
        lines += ["", f"/* Builder.{attr}: {len(cols)} int64 fields per row */", f"#define {width} {len(cols)}"]
        names.add(width)
        for i, name in enumerate(cols):
            macro = column_macro(prefix, name)
            if macro in names or not macro.isidentifier():
                raise ValueError(f"schema column {prefix}.{name}: C name {macro} is taken or not a C name")
            names.add(macro)
            lines.append(f"#define {macro} {i}")
    lines += ["", "/* the codes of the phase column */"]
    lines += [f"#define FV_PHASE_{phase.upper()} {i}" for i, phase in enumerate(_schema.PHASES)]
    lines += ["", f'#define FV_LAYOUT "{layout_signature()}"', "", "#endif", ""]
    return "\n".join(lines)


def _sources() -> dict[str, bytes]:
    """The text of every file the core is built from, by its path under ``csrc/``, in a fixed order:
    ``fvcore.c`` first, then every C file and header under ``csrc/fvcore/`` by name (the parts it
    includes, and anything else there: a file the build might include is never left out)."""
    parts = sorted(p for p in _PARTS.rglob("*") if p.is_file() and p.suffix in (".c", ".h"))
    return {p.relative_to(_CSRC).as_posix(): p.read_bytes() for p in (_SRC, *parts)}


def _cache_key(sources: dict[str, bytes], header: str) -> str:
    """The hash that names a build: each source's path, length and text (in the order given, so no two
    sets of files hash alike), then the generated headers (``header``: both, one after the other) and the
    Python build."""
    key = hashlib.sha256()
    for name, text in sources.items():
        key.update(f"{name}\0{len(text)}\0".encode())
        key.update(text)
    key.update(header.encode() + sys.version.encode() + sys.executable.encode())
    return key.hexdigest()[:16]


def _library_path(header: str) -> Path:
    """Where the core built from ``csrc/fvcore.c`` with its parts and ``header`` for this Python is cached."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_dir() / f"fvcore_{_cache_key(_sources(), header)}{suffix}"


def _headers() -> dict[str, str]:
    """The generated headers a build includes, by file name: the row layout (:func:`schema_header`) and
    the names C reaches Python by (:func:`fakeviz._engine.native_contract.names_header`)."""
    return {HEADER: schema_header(), _contract.HEADER: _contract.names_header()}


def _check_sources() -> None:
    """Refuse to build from C sources that disagree with the contract (Note: [the C core's contract])."""
    problems = _contract.source_problems({name: text.decode() for name, text in _sources().items()})
    if problems:
        raise RuntimeError(
            "the recorder core's C sources and its contract (fakeviz/_engine/native_contract.py) disagree: "
            + "; ".join(problems[:10])
            + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        )


def _compile(target: Path, headers: dict[str, str]) -> None:
    _check_sources()
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
    try:
        with tempfile.TemporaryDirectory(dir=target.parent) as gen:
            for name, text in headers.items():
                (Path(gen) / name).write_text(text)
            # fvcore.c's quoted includes of its parts resolve next to it: no -I for them
            cmd = [cc, "-O2", "-shared", "-fPIC", "-w", *lang, f"-I{gen}", f"-I{include}", str(_SRC), "-o", tmp]
            if sys.platform == "darwin":
                cmd[1:1] = ["-undefined", "dynamic_lookup"]
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
    problems = contract_problems({path: TORCH_CONTRACT[path] for path in CORE_NEEDS})
    if problems:
        import warnings

        import torch

        from .torch_compat import TorchInternalsWarning

        why = (f"torch {torch.__version__} changed FakeTensorMode internals the C recorder core calls: "
               + "; ".join(problems) + " (the Python recorder records instead: same trace, slower)")  # fmt: skip
        warnings.warn(f"fakeviz: {why}", TorchInternalsWarning, stacklevel=2)
        raise RuntimeError(why)
    headers = _headers()
    path = _library_path("".join(headers.values()))
    if not path.exists():
        _compile(path, headers)
    loader = importlib.machinery.ExtensionFileLoader("_fvcore", str(path))
    spec = importlib.util.spec_from_loader("_fvcore", loader, origin=str(path))
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    check_contract(mod)
    return mod


def check_contract(mod: ModuleType, expected: str | None = None) -> None:
    """Refuse a loaded core built from another contract than the one declared now (``expected``, by default
    :func:`fakeviz._engine.native_contract.contract_hash`): a stale build reads names Python may no longer
    have. Warns once (:class:`FakeVizWarning`) and raises, so :func:`core` records in Python instead."""
    want = _contract.contract_hash() if expected is None else expected
    got = getattr(mod, "CONTRACT", None)
    if got != want:
        import warnings

        from .._core.errors import FakeVizWarning

        why = (f"the recorder core at {getattr(mod, '__file__', '?')} was built for the contract {got!r}, not "
               f"{want!r} (fakeviz/_engine/native_contract.py changed since): the Python recorder records instead "
               "(same trace, slower); delete the stale build to rebuild it")  # fmt: skip
        warnings.warn(f"fakeviz: {why}", FakeVizWarning, stacklevel=3)
        raise RuntimeError(why)


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
