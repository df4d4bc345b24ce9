"""A trace displayed in a notebook (issue 41, item 6): the explorer, or a shown error and the summary.

Through a real InteractiveShell; the outputs are what the shell published (``capture_output``), the
bundles a notebook would store.
"""

from __future__ import annotations

import pytest

IPython = pytest.importorskip("IPython")
from IPython.utils.capture import capture_output  # noqa: E402

from fakeviz._views import explorer  # noqa: E402

WIDGET = "application/vnd.jupyter.widget-view+json"
KERNEL_HINT = "Run the cell with a kernel"


def _shown(ip, code: str) -> list[dict]:
    with capture_output() as cap:
        r = ip.run_cell(code)
    assert r.error_in_exec is None and r.error_before_exec is None, r
    return [o.data for o in cap.outputs]


def test_a_trace_shows_its_explorer(ip):
    outs = _shown(ip, "%%fake -o t\nx = torch.ones(3) + 1\n")
    assert [WIDGET in o for o in outs] == [False, True]  # the static summary, then the widget
    assert not any("could not be shown" in o.get("text/plain", "") for o in outs)


def test_a_missing_bundle_is_shown_not_swallowed(ip, tmp_path, monkeypatch):
    # the state of a source checkout before `npm run build`: the bundle file is not there
    missing = tmp_path / "explorer.js"
    monkeypatch.setattr(explorer, "_BUNDLE", missing)
    outs = _shown(ip, "%%fake -o t\nx = torch.ones(3) + 1\n")
    assert len(outs) == 2 and not any(WIDGET in o for o in outs), outs
    note, summary = outs
    text = note["text/plain"]
    # what failed and what to do, in the text and in the HTML a notebook shows
    assert text.startswith("fakeviz: the interactive explorer could not be shown (FileNotFoundError:"), text
    assert str(missing) in text and "npm run build" in text and "trace.explore()" in text
    assert "npm run build" in note["text/html"] and "FileNotFoundError" in note["text/html"]
    # the text and static summary still show, and do not tell a running kernel to run the cell with a kernel
    assert summary["text/plain"].startswith(repr(ip.user_ns["t"]).splitlines()[0])
    assert "fakeviz trace" in summary["text/html"] and "could not be shown" in summary["text/html"]
    assert KERNEL_HINT not in summary["text/html"] + note["text/html"]
    # the error itself is one call away, with its traceback
    with pytest.raises(FileNotFoundError, match="npm run build"):
        ip.user_ns["t"].explore()


def test_an_empty_trace_shows_its_text(ip):
    outs = _shown(ip, "%%fake -o t\ny = 1\n")
    assert len(outs) == 1 and set(outs[0]) == {"text/plain", "text/html"}
    assert "could not be shown" not in outs[0]["text/plain"]
