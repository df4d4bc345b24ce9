"""Shared test helpers: ``tests/`` on ``sys.path`` (for ``zoo``), and the ``c_core`` / ``recorder`` fixtures
(the C core is built by ``tests/c_core.py``).

The tests mirror the package's layers: ``tests/core``, ``tests/engine``, ``tests/analysis``, ``tests/views``,
``tests/notebook`` (magics and executed notebooks) and ``tests/browser`` (real Chromium through Playwright).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # `import zoo` from every layer's folder

from c_core import build_core, have_c_compiler  # noqa: E402 - tests/ is on sys.path from here on


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
