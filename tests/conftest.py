"""Shared test helpers: ``tests/`` on ``sys.path`` (for ``zoo``), and the ``c_core`` / ``recorder`` fixtures
(the C core is built by ``tests/c_core.py``).

The tests mirror the package's layers: ``tests/core``, ``tests/engine``, ``tests/analysis``, ``tests/views``,
``tests/notebook`` (magics and executed notebooks) and ``tests/browser`` (real Chromium through Playwright).
"""

from __future__ import annotations

import gc
import os
import re
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # `import zoo` from every layer's folder

from c_core import build_core, have_c_compiler  # noqa: E402 - tests/ is on sys.path from here on
from js_bundle import ensure_bundle  # noqa: E402


@pytest.fixture(scope="session")
def c_core() -> str:
    """The C core, built once per test session (skips without a compiler; fails if the build fails)."""
    if not have_c_compiler():
        pytest.skip("no C compiler: the Python implementation records")
    if os.environ.get("FAKEVIZ_PURE_PYTHON", "") not in ("", "0"):  # the CI's Python-recorder pass over tests/engine
        pytest.skip("FAKEVIZ_PURE_PYTHON=1 for this run: the C core's own tests run in the main suite")
    status = build_core()
    assert status == "c", f"the C core did not build: {status}"
    return status


@pytest.fixture(params=["c", "python"])
def recorder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which recorder records: the C core (built once, ``c_core``) or the Python one (``FAKEVIZ_PURE_PYTHON=1``).

    Under ``FAKEVIZ_PURE_PYTHON=1`` for the whole run (``scripts/test_python_recorder.sh``, the CI's pass over the
    recorder's tests with the Python recorder) the C parameter is skipped: the main suite runs it."""
    if request.param == "c" and os.environ.get("FAKEVIZ_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("FAKEVIZ_PURE_PYTHON=1 for this run: the Python recorder only (the main suite runs the C core)")
    if request.param == "c":
        request.getfixturevalue("c_core")
        monkeypatch.delenv("FAKEVIZ_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setenv("FAKEVIZ_PURE_PYTHON", "1")
    return request.param


# ----------------------------------------------------------------------------------------- one run, two workers
# Note: [the suite under xdist]
# `scripts/test.sh` and `scripts/test_torch.sh` run the suite with pytest-xdist (`-n 2 --dist loadfile`: the CI's two
# cores). Three things keep that equal to a serial run:
# - a file runs whole on one worker (`loadfile`), so its module fixtures are built once, as in a serial run;
# - a tutorial's checks (tests/notebook/test_tutorial_NN.py) and tests/notebook/test_tutorials.py's test that runs
#   the same notebook share one work unit (`_scope`): nbrun executes a notebook once per process and hands later
#   callers that copy, so two workers would execute it twice. These units go first, so each runs on a worker
#   that has run nothing else yet: a kernel inherits the peak RSS of the process that starts it (Linux keeps
#   ru_maxrss across exec), and tutorial 02 checks its kernel's peak (`-p no:xdist` / `-n 0` runs serially);
# - the explorer's bundle is built before the workers start (Note: [one bundle build per run] in js_bundle.py).
# Tests that measure their own process (peak RSS, threads) measure the worker, a process of their own as before.
_TUTORIAL = re.compile(r"tests/notebook/test_tutorial_(\d+)\w*\.py$")
_TUTORIAL_RUN = re.compile(r"tests/notebook/test_tutorials\.py::test_runs_in\w*\[(\d+)_")


def _scope(nodeid: str) -> str:
    """The work unit a test belongs to: its file, or ``tutorial NN`` (see Note: [the suite under xdist])."""
    path = nodeid.split("::", 1)[0]
    m = _TUTORIAL.search(path) or _TUTORIAL_RUN.search(nodeid)
    return f"tutorial {m.group(1)}" if m else path


def pytest_collection_finish(session: pytest.Session) -> None:
    """Exempt what the imports made from every later garbage collection (Note: [gc.freeze after collection])."""
    gc.collect()
    gc.freeze()


# Note: [gc.freeze after collection]
# Many tests call gc.collect() before each recording, so that no cyclic garbage is freed in the middle of one and the
# real and fake records free storages at the same op. A full collection walks every tracked object, and after the
# test modules are imported (torch, torch._dynamo, transformers, pandas, plotly) those are about 400,000: 0.3-1.5 s a
# call, thousands of calls. Collected modules, classes and functions live for the whole session; gc.freeze() moves
# them to the permanent generation, which collections skip, so a collection walks only what tests made (gc.collect()
# measured: 1.45 s -> 2 us right after the freeze). Everything a test makes is collected as before.


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the explorer's bundle once, in the process that starts the workers (or the only one)."""
    if hasattr(session.config, "workerinput"):
        return
    try:
        ensure_bundle()
    except AssertionError:
        pass  # npm failed: the tests that need the bundle call ensure_bundle themselves and fail with npm's output


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` with a tutorial's tests in one unit, the tutorials first (Note: [the suite under xdist])."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class TutorialsFirst(LoadFileScheduling):
        sorted = False

        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.sorted:  # the queue is in collection order: tutorials first, the rest as collected
                order = sorted(self.workqueue, key=lambda s: not s.startswith("tutorial "))
                self.workqueue = type(self.workqueue)((s, self.workqueue[s]) for s in order)
                self.sorted = True
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the order: xdist would put the files with most tests first
    return TutorialsFirst(config, log)
