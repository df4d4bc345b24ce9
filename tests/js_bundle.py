"""The explorer's JavaScript bundle for the tests: built once, before any test of a run needs it.

A plain module (as ``tests/c_core.py``): ``tests/conftest.py`` builds the bundle at the start of a test session
(in the pytest process that starts the xdist workers, or the only one), and the ``bundle`` fixtures of the view and
browser tests call :func:`ensure_bundle` again, which only checks it is current.

Note: [one bundle build per run]
``npm run build`` (esbuild) rewrites ``fakeviz/static/explorer.js`` and ``explorer.css`` in place, and ``npm ci``
deletes ``js/node_modules`` before it installs. Two test processes doing either at once (the two xdist workers of
one run, or two runs in one working tree) would hand a reader a half-written bundle or a missing ``vitest``. So:
the build runs under an exclusive lock (a file in the temporary directory, keyed by the checkout's path), only when
an output is missing or older than a source of the build (``js/src``, ``build.mjs``, ``package.json``, the
lockfile), and a run's first build happens in ``pytest_sessionstart`` before any worker exists: many tests read the
bundle without asking for it (``fv.explore``, ``to_html``, the tutorials), which a serial run in directory order
hid (``tests/browser`` built it before ``tests/core`` ran).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["JS", "STATIC", "ensure_bundle", "npm"]

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "js"
STATIC = ROOT / "fakeviz" / "static"
OUTPUTS = (STATIC / "explorer.js", STATIC / "explorer.css")
TOOLS = ("esbuild", "vitest")  # what the build and `npm test` run: `npm ci` installs both


def npm(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``npm ARGS`` in ``js/``; fails the calling test with npm's own output when it exits non-zero."""
    exe = shutil.which("npm")
    assert exe is not None, "npm is not installed"
    proc = subprocess.run([exe, *args], cwd=JS, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"npm {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Exclusive across processes for this checkout (Note: [one bundle build per run])."""
    key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"fakeviz-js-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _sources() -> list[Path]:
    found = [JS / "build.mjs", JS / "package.json", JS / "package-lock.json"]
    found += [p for p in (JS / "src").rglob("*") if p.is_file()]
    return [p for p in found if p.is_file()]


def _stale() -> bool:
    if not all(p.is_file() for p in OUTPUTS):
        return True
    built = min(p.stat().st_mtime for p in OUTPUTS)
    return any(p.stat().st_mtime > built for p in _sources())


def ensure_bundle() -> Path | None:
    """``fakeviz/static/explorer.js``, (re)built with npm when it is missing or older than a source of the build.

    Returns:
        The bundle's path; None when npm is not installed and the bundle was never built (the caller skips).
        ``npm ci`` runs first when ``js/node_modules`` lacks esbuild or vitest. A failing npm fails the caller
        with npm's own output.
    """
    if shutil.which("npm") is not None:
        with locked():
            if not all((JS / "node_modules" / ".bin" / t).exists() for t in TOOLS):
                npm("ci", "--no-audit", "--no-fund")
            if _stale():
                npm("run", "build")
    return OUTPUTS[0] if OUTPUTS[0].is_file() else None
