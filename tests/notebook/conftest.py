"""The IPython shell the magic tests run cells in."""

from __future__ import annotations

import pytest

IPython = pytest.importorskip("IPython")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402


@pytest.fixture
def ip():
    """A real ``InteractiveShell`` with fakeviz loaded and ``torch`` imported; afterwards the sessions are reset,
    the extension unloaded and every name the test defined removed."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "fakeviz")
    shell.user_ns.pop("_fake", None)
    shell.run_cell("import torch", store_history=False)
    before = set(shell.user_ns)
    yield shell
    shell.run_line_magic("fake_reset", "")
    shell.run_line_magic("unload_ext", "fakeviz")
    for k in set(shell.user_ns) - before:
        shell.user_ns.pop(k, None)
