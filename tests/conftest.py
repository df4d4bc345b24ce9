"""Shared test helpers: ``tests/`` on ``sys.path`` (for ``zoo``), and the one helper that builds the C core.

The tests mirror the package's layers: ``tests/core``, ``tests/engine``, ``tests/analysis``, ``tests/views``,
``tests/notebook`` (magics and executed notebooks) and ``tests/browser`` (real Chromium through Playwright).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # `import zoo` from every layer's folder


def have_c_compiler() -> bool:
    """A C compiler the recorder's core can be built with (``cc``, as ``fakeviz._engine.native`` calls it)."""
    return any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def build_core() -> str:
    """Build (or load from the cache) the recorder's C core; returns ``fakeviz._engine.native.status()``.

    Every test that needs the C core goes through here, so a build failure shows once, with the
    compiler's own message, instead of as a silent fallback to the Python recorder.
    """
    from fakeviz._engine import native

    native.core()
    return native.status()


needs_core = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler: the Python implementation records")


@pytest.fixture(scope="session")
def c_core() -> str:
    """The C core, built once per test session (skips without a compiler; fails if the build fails)."""
    if not have_c_compiler():
        pytest.skip("no C compiler: the Python implementation records")
    status = build_core()
    assert status == "c", f"the C core did not build: {status}"
    return status


@pytest.fixture(params=["c", "python"])
def recorder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which recorder records: the C core (built once, ``c_core``) or the Python one (``FAKEVIZ_PURE_PYTHON=1``)."""
    if request.param == "c":
        request.getfixturevalue("c_core")
        monkeypatch.delenv("FAKEVIZ_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setenv("FAKEVIZ_PURE_PYTHON", "1")
    return request.param
