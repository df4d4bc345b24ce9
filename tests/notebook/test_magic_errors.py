"""Errors inside ``%%fake`` as a notebook user reads them (issue 15, item 4), through a real InteractiveShell.

The text IPython prints for an error is what the exception's ``_render_traceback_`` returns; these tests
read it (and what the shell printed), never fakeviz internals.
"""

from __future__ import annotations

import re

import pytest
import torch

import fakeviz as fv

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402

from fakeviz._frontends.magic import FakeCellError  # noqa: E402
from fakeviz._frontends.magic.errors import MAX_LINES  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def shown(err: BaseException) -> list[str]:
    return [ANSI.sub("", x) for x in err._render_traceback_()]


def clean(ip) -> None:
    assert torch._guards.detect_fake_mode() is None and not fv.is_fake(torch.ones(1))
    assert torch.get_default_dtype() == torch.float32


def check_text(lines: list[str], name: str) -> str:
    text = "\n".join(lines)
    assert len(lines) <= MAX_LINES, text
    assert lines[0].startswith(f"{name} in Cell In["), text  # the exception and the user's cell line come first
    assert "/torch/" not in text and "site-packages" not in text, text  # torch internals hidden
    assert "symbolic=True" not in text and ".trace`" not in text, text  # the magic's own terms
    assert "ipython-input" not in text and "ipykernel" not in text, text
    assert "%fake_tb" in text
    return text


def test_data_dependent_error_is_short_and_in_magic_terms(ip, capsys):
    r = ip.run_cell("%%fake -o t\nx = torch.empty(3)\nif x.sum() > 0:\n    pass\n")
    err = r.error_in_exec
    assert isinstance(err, fv.DataDependentError)
    lines = shown(err)
    text = check_text(lines, "DataDependentError")
    assert lines[1] == "----> 2 if x.sum() > 0:"
    assert "is in `t`" in text
    t = ip.user_ns["t"]
    assert t.error["type"] == "DataDependentError" and t.error["message"].startswith("DataDependentError")
    clean(ip)
    # %fake_tb shows the full chain, torch internals included
    capsys.readouterr()
    ip.run_line_magic("fake_tb", "")
    full = ANSI.sub("", capsys.readouterr().out)
    assert "DataDependentOutputException" in full and "fake_tensor.py" in full


def test_symbolic_guard_error_speaks_of_the_flag(ip):
    r = ip.run_cell("%%fake --symbolic -o t\nx = torch.empty(5)\nn = torch.nonzero(x)\nif n.shape[0] > 2:\n    pass\n")
    err = r.error_in_exec
    assert isinstance(err, fv.DataDependentError)
    text = check_text(shown(err), "DataDependentError")
    assert "--symbolic" in text and "if n.shape[0] > 2:" in text
    clean(ip)


def test_device_mismatch_names_the_line_and_what_to_do(ip):
    r = ip.run_cell("%%fake -d cuda:0 -o t\nx = torch.ones(3)\ny = torch.ones(3, device='cpu')\nz = x + y\n")
    err = r.error_in_exec
    assert err is not None and "same device" in str(err)
    lines = shown(err)
    text = check_text(lines, type(err).__name__)
    assert lines[1] == "----> 3 z = x + y"
    assert ".to('cuda:0')" in text and "The partial trace (2 ops) is in `t`" in text
    assert ip.user_ns["t"].error["type"] == type(err).__name__  # the banner names the same exception
    clean(ip)


def test_full_traceback_flag_and_config(ip):
    r = ip.run_cell("%%fake --tb -o t\nx = torch.empty(3)\nif x.sum() > 0:\n    pass\n")
    assert not hasattr(r.error_in_exec, "_render_traceback_")  # IPython shows its own, full traceback
    ip.run_line_magic("config", "FakeMagics.full_traceback = True")
    try:
        r = ip.run_cell("%%fake -o t\nx = torch.empty(3)\nif x.sum() > 0:\n    pass\n")
        assert not hasattr(r.error_in_exec, "_render_traceback_")
    finally:
        ip.run_line_magic("config", "FakeMagics.full_traceback = False")
    clean(ip)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("--device cuda:x", "--device 'cuda:x'"),
        ("--device cuda:99", "cuda:0 .. cuda:"),
        ("--dtype foo", "--dtype 'foo'"),
        ("--capacity lots", "--capacity 'lots'"),
        ("-o 1bad", "-o '1bad'"),
    ],
)
def test_bad_options_are_one_line_usage_errors(ip, capsys, line, words):
    r = ip.run_cell(f"%%fake {line}\nx = torch.ones(2)\n")
    err = r.error_in_exec
    assert isinstance(err, UsageError) and words in str(err) and "\n" not in str(err)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert "x" not in ip.user_ns or not fv.is_fake(ip.user_ns["x"])  # the cell did not run
    clean(ip)


def test_tensor_from_before_reset_is_a_clear_error(ip):
    assert ip.run_cell("%%fake --no-display\nold = torch.ones(3)\nmm = torch.nn.Linear(3, 3)\n").error_in_exec is None
    ip.run_line_magic("fake_reset", "")
    for code in ("q = old * 2", "q = mm(torch.ones(3))"):
        r = ip.run_cell(f"%%fake -o t\n{code}\n")
        err = r.error_in_exec
        assert isinstance(err, FakeCellError) and "%fake_reset" in str(err), err
        assert "q" not in ip.user_ns  # the cell did not run
    # a name the cell assigns before reading it is not the old one
    assert ip.run_cell("%%fake --no-display\nold = torch.zeros(2)\nq = old + 1\n").error_in_exec is None
    clean(ip)


def test_real_tensor_in_fake_cuda_cell_is_flagged(ip, capsys):
    ip.run_cell("r = torch.ones(3)")
    r = ip.run_cell("%%fake -d cuda:0 -o t --no-display\nz = r * 2\n")
    assert r.error_in_exec is None
    err = capsys.readouterr().err
    assert "`r` holds a real cpu tensor" in err and "cuda:0" in err
    assert ip.user_ns["t"].meta["real_inputs"]
    # not in a cpu cell, where it is what the user meant
    ip.run_cell("%%fake -o t --no-display\nz = r * 2\n")
    assert "real cpu tensor" not in capsys.readouterr().err
    clean(ip)


def test_syntax_error_records_nothing_and_leaves_no_mode(ip):
    r = ip.run_cell("%%fake -o t\nx = (\n")
    assert isinstance(r.error_in_exec, FakeCellError) and "did not run" in str(r.error_in_exec)
    clean(ip)


def test_usage_shows_the_cell_magic(ip, capsys):
    ip.run_cell("%%fake?")
    out = ANSI.sub("", capsys.readouterr().out)
    assert "%%fake [--device DEVICE]" in out and "%fake_trace" in out and "%fake_tb" in out


def test_progress_shows_while_a_long_cell_records_and_is_cleared(ip, monkeypatch):
    from fakeviz._frontends.magic import cells

    seen = []

    class Handle:
        def update(self, data, raw=True):
            seen.append(data.get("text/plain", ""))

    monkeypatch.setattr("IPython.display.display", lambda *a, **k: Handle() if k.get("display_id") else None)
    monkeypatch.setattr(ip, "kernel", object(), raising=False)
    magics = ip.magics_manager.registry["FakeMagics"]
    monkeypatch.setattr(magics, "progress_interval", 0.0)
    assert cells.Progress is not None
    r = ip.run_cell("%%fake -o t\nx = torch.ones(2)\nfor _ in range(3000):\n    x = x + 1\n")
    assert r.error_in_exec is None
    assert any("ops recorded" in s for s in seen) and seen[-1] == ""  # shown while running, cleared at the end
    seen.clear()
    r = ip.run_cell("%%fake -o t\nx = torch.ones(2)\nfor _ in range(3000):\n    x = x + 1\nraise ValueError('late')\n")
    assert isinstance(r.error_in_exec, ValueError) and seen and seen[-1] == ""  # cleared after an error too
    clean(ip)
