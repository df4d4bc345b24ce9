"""Import-time notices of optional libraries stay out of cells and builds unless asked (Note: [import notices])."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest

from fakeviz._core.notices import IMPORT_NOTICES, quiet_import_notices

BUILD = "import fakeviz as fv; fv.models.build('gpt2', num_hidden_layers=1); print('built')"
CELL = """
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic('load_ext', 'fakeviz')
ip.run_cell_magic('fake', '--no-display' + ARGS, "import fakeviz as fv\\nm = fv.models.build('gpt2', num_hidden_layers=1)")
print('built')
"""


def _stderr(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAKEVIZ_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={**clean, **env})
    assert out.returncode == 0 and "built" in out.stdout, out.stderr
    return out.stderr


def _notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "torchao" in line or "_pytree" in line]


def test_the_first_build_prints_no_import_notice():
    pytest.importorskip("torchao")
    loud = _notices(_stderr(BUILD, FAKEVIZ_VERBOSE="1"))
    if not loud:
        pytest.skip("this environment's torchao and torch print no import notice: nothing to keep out")
    assert _notices(_stderr(BUILD)) == []


def test_a_fake_cell_prints_no_import_notice_unless_verbose():
    pytest.importorskip("torchao")
    loud = _notices(_stderr(f"ARGS = ' --verbose'\n{CELL}"))
    if not loud:
        pytest.skip("this environment's torchao and torch print no import notice: nothing to keep out")
    assert _notices(_stderr(f"ARGS = ''\n{CELL}")) == []


def test_the_scope_drops_only_its_threads_notices_and_leaves_nothing_behind(caplog):
    log = logging.getLogger(IMPORT_NOTICES[0])
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep(logging.DEBUG)
    log.addHandler(keep)
    try:
        with quiet_import_notices():
            with quiet_import_notices():  # scopes nest
                log.warning("inner")
            log.warning("this thread")
            log.error("an error passes")
            other = threading.Thread(target=lambda: log.warning("another thread"))
            other.start()
            other.join()
        log.warning("after")
        with quiet_import_notices(verbose=True), quiet_import_notices():  # a verbose scope holds the inner ones
            log.warning("verbose")
    finally:
        log.removeHandler(keep)
    assert seen == ["an error passes", "another thread", "after", "verbose"]
    assert all(not logging.getLogger(name).filters for name in IMPORT_NOTICES)
