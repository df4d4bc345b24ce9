"""Run the tutorial notebooks as Binder would: in a fresh virtual environment built from ``binder/``.

``execute("03_training.ipynb")`` runs a notebook once per test session (later calls get the same
executed copy) with nbclient, in a kernel of ``.venv-binder``: a virtual environment made with
``python -m venv``, ``pip install -r binder/requirements.txt`` (its CPU-index line dropped: this
machine's pip finds the local CPU torch wheel instead) plus ``ipykernel`` (Binder's base image has it),
then ``binder/postBuild`` run as repo2docker runs it. The environment is rebuilt whenever those two files
change (a stamp holds their hash); CI starts from a clean clone, so there it is always new.

``FAKEVIZ_NB_KERNEL=dev`` runs the notebooks in this interpreter's ``python3`` kernel instead (quick while
writing a notebook; CI never sets it).

The executed notebook carries ``metadata["_peak_rss"]`` (the kernel's peak resident memory in bytes: ``VmHWM``
of ``/proc/self/status``, read in a cell added after the last one and removed again) and ``metadata["_updates"]`` (every
``update_display_data`` message: progress lines are only visible there).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
BINDER = ROOT / "binder"
VENV = ROOT / ".venv-binder"
KERNEL = "fakeviz-binder"
RSS_LIMIT = 1.5e9

_executed: dict[str, nbformat.NotebookNode] = {}
# VmHWM: the kernel's own high-water mark. Not getrusage's ru_maxrss: Linux keeps that across execve, so a kernel
# forked from a large pytest process starts with the parent's RSS as its "peak" (seen: 1.83 GB for every notebook)
_RSS_CELL = (
    "import re as _re, pathlib as _p; "
    "print('peak-rss-kb', _re.search(r'VmHWM:\\s+(\\d+)', _p.Path('/proc/self/status').read_text()).group(1))"
)


def _stamp() -> str:
    h = hashlib.sha256()
    for name in ("requirements.txt", "postBuild", "apt.txt"):
        p = BINDER / name
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()


def binder_env() -> Path:
    """The fresh Binder-like environment (built here when missing or stale); returns its ``share/jupyter``."""
    import fcntl

    VENV.parent.mkdir(exist_ok=True)
    with open(ROOT / ".venv-binder.lock", "w") as lock:  # one build at a time (parallel pytest runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build()


def _build() -> Path:
    stamp = VENV / ".binder-stamp"
    if not (stamp.exists() and stamp.read_text() == _stamp()):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        reqs = VENV / "requirements.txt"
        lines = (BINDER / "requirements.txt").read_text().splitlines()
        reqs.write_text("\n".join(line for line in lines if "download.pytorch.org" not in line) + "\n")
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, "-r", str(reqs), "ipykernel"], "pip install -r binder/requirements.txt")
        env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("PYTHONPATH", None)
        _run(["bash", str(BINDER / "postBuild")], "binder/postBuild", env=env)
        _run([str(VENV / "bin" / "python"), "-m", "ipykernel", "install", "--prefix", str(VENV), "--name", KERNEL],
             "ipykernel install")  # fmt: skip
        stamp.write_text(_stamp())
    return VENV / "share" / "jupyter"


def _run(cmd: list[str], what: str, env: dict | None = None) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


class _Client(nbclient.NotebookClient):
    """Keeps every update_display_data message (progress lines are only visible there)."""

    updates: list

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") == "update_display_data":
            self.updates.append((cell_index, msg["content"].get("data", {})))
        return super().process_message(msg, cell, cell_index)


def execute(name: str, workdir: Path | None = None) -> nbformat.NotebookNode:
    """``notebooks/NAME`` executed (once per session), outputs in place; see the module docstring."""
    if name in _executed:
        return _executed[name]
    nb = nbformat.read(NB_DIR / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(_RSS_CELL))
    if os.environ.get("FAKEVIZ_NB_KERNEL") == "dev":
        kernel, env_path = "python3", None
    else:
        kernel, env_path = KERNEL, binder_env()
    workdir = workdir or _workdir(name)
    old = os.environ.get("JUPYTER_PATH")
    if env_path is not None:
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(env_path), old) if p)
    try:
        client = _Client(nb, timeout=900, kernel_name=kernel, resources={"metadata": {"path": str(workdir)}})
        client.updates = []
        client.execute()
    finally:
        if env_path is not None and old is None:
            os.environ.pop("JUPYTER_PATH")
        elif env_path is not None:
            os.environ["JUPYTER_PATH"] = old
    last = nb.cells.pop()
    kb = re.search(r"peak-rss-kb (\d+)", text(last))
    nb.metadata["_peak_rss"] = int(kb.group(1)) * 1024 if kb else None
    nb.metadata["_updates"] = client.updates
    nb.metadata["_kernel"] = kernel
    _executed[name] = nb
    return nb


def _workdir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix="fakeviz-nb-" + name.split("_")[0] + "-"))


def _outputs(cell) -> list[dict]:
    """The cell's outputs with consecutive writes to one stream joined, as a notebook shows them: a loaded kernel
    may flush ``print(a, b)`` as two stream messages ("a" and " b\n"), which must not read as two lines."""
    outs: list[dict] = []
    for out in cell.get("outputs", []):
        prev = outs[-1] if outs else None
        if (out.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):  # fmt: skip
            outs[-1] = {**prev, "text": prev["text"] + out["text"]}
        else:
            outs.append(dict(out))
    return outs


def text(cell) -> str:
    """Everything a reader sees in a cell's outputs, as text (stdout, text/plain, text/html, errors)."""
    parts = []
    for out in _outputs(cell):
        if "text" in out:
            parts.append(out["text"])
        data = out.get("data", {})
        parts.extend(str(data[k]) for k in ("text/plain", "text/html") if k in data)
        if out.get("output_type") == "error":
            parts.append(out["ename"] + ": " + out["evalue"])
    return "\n".join(parts)


def plain(cell) -> str:
    """The cell's printed text and plain-text results (no HTML, so each table row appears once)."""
    parts = []
    for out in _outputs(cell):
        parts.append(out.get("text", ""))
        parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def find_int(pattern: str, s: str) -> int:
    """The integer (commas allowed) of ``pattern``'s first group in ``s``."""
    m = re.search(pattern, s)
    assert m, f"{pattern!r} not in:\n{s[:3000]}"
    return int(m.group(1).replace(",", ""))


def errors(cell) -> str:
    """The cell's traceback as a reader sees it (colours removed), or ''."""
    return "\n".join(
        re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(o.traceback))
        for o in cell.get("outputs", [])
        if o.output_type == "error"
    )


def cell(nb, start: str):
    """The one code cell whose source starts with ``start``."""
    found = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(start)]
    assert len(found) == 1, f"{len(found)} code cells start with {start!r}"
    return found[0]


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]
