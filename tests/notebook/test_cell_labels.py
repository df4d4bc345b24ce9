"""A ``%%fake`` cell is named by its own prompt number (issue 41, item 6), on IPython 8 and 9 alike.

IPython 9 counts a cell before running it (``shell.execution_count`` is one ahead while the cell runs);
IPython 8 counts it after. The cell the magic runs must still be ``Cell In[N]`` for the prompt ``[N]``:
in the trace's label, its ops' user lines, the error's text and IPython's own traceback. Run under
IPython 8 with ``PYTHONPATH=<dir with ipython 8> pytest tests/notebook/test_cell_labels.py``.
"""

from __future__ import annotations

import re

import pytest

IPython = pytest.importorskip("IPython")

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(ip, code: str):
    """Run ``code`` as the next notebook cell; returns (its prompt number, the result)."""
    r = ip.run_cell(code, store_history=True)
    assert r.execution_count is not None
    return r.execution_count, r


def test_failing_cell_names_its_own_prompt(ip):
    ip.run_cell("a = 1", store_history=True)  # a prompt before, so a count off by one shows
    n, r = _run(ip, "%%fake -o t\nx = torch.ones(3)\ny = x + 1\nraise ValueError('boom')\n")
    want = f"Cell In[{n}]"
    err = r.error_in_exec
    assert isinstance(err, ValueError)
    lines = [ANSI.sub("", x) for x in err._render_traceback_()]
    assert lines[0] == f"ValueError in {want}, line 3:", lines  # lines count from the body, as IPython does
    t = ip.user_ns["t"]
    assert t.meta["label"] == want
    assert set(t.ops.user_line) == {f"{want}, line 1", f"{want}, line 2"}, set(t.ops.user_line)
    # IPython's own traceback of the cell (what %fake_tb and --tb show) names the same cell
    tb = ip.InteractiveTB.stb2text(ip.InteractiveTB.structured_traceback(type(err), err, err.__traceback__))
    assert want in ANSI.sub("", tb) and f"Cell In[{n + 1}]" not in ANSI.sub("", tb)
    # the next cell gets the next number, and its lines are its own
    m, r2 = _run(ip, "%%fake -o t2 --no-display\nz = torch.zeros(2)\n")
    assert m == n + 1 and r2.error_in_exec is None
    assert set(ip.user_ns["t2"].ops.user_line) == {f"Cell In[{m}], line 1"}
    assert set(t.ops.user_line) == {f"{want}, line 1", f"{want}, line 2"}  # the earlier trace is unchanged


def test_function_lines_and_session_trace_name_their_cells(ip):
    n1, r1 = _run(ip, "%%fake --no-display\ndef f(v):\n    return v * 2\n")
    n2, r2 = _run(ip, "%%fake -o t --no-display\nx = f(torch.ones(2))\n")
    assert r1.error_in_exec is None and r2.error_in_exec is None
    assert set(ip.user_ns["t"].ops.user_line) == {f"Cell In[{n2}], line 1", f"Cell In[{n1}], line 2 in f"}
    whole = ip.run_line_magic("fake_trace", "")
    assert [c["label"] for c in whole.meta["cells"]] == [f"Cell In[{n1}]", f"Cell In[{n2}]"]


def test_nested_cell_is_named_by_the_enclosing_prompt(ip):
    n, r = _run(
        ip, "%%fake -o t --no-display\nx = torch.ones(2)\nget_ipython().run_cell_magic('fake', '', 'y = x * 3')\n"
    )
    assert r.error_in_exec is None
    labels = set(ip.user_ns["t"].ops.user_line)
    # both bodies are cell n's (two lines of one name: the table keeps them apart as "… line 1 #1")
    assert {x.split(" #")[0] for x in labels} == {f"Cell In[{n}], line 1"}, labels
