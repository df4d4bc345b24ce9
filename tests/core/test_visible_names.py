"""Control characters in names reach no person raw (issue 42; Note: [bidi controls in names] in fakeviz._core.fmt).

A module named with a right-to-left override (U+202E) and other controls, recorded fake: the text summary, the
command line's output and its error messages, and the HTML report show each control written out (``<U+202E>``)
and never raw; ordinary letters of any script are left as they are. The explorer's payload keeps the name as
recorded (a selection sent back must name the module); the explorer writes it out where it shows it
(``js/src/dom.js``, ``js/test/visible.test.js``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import fakeviz as fv
from fakeviz._core.fmt import visible
from fakeviz._frontends.cli import main
from fakeviz._views.payload import build_state, unpack
from fakeviz._views.report import report_html
from fakeviz._views.text import summary

RLO = "\u202e"
BAD = "a\u202eb"  # shown raw, "b" and everything after it on the line would be reversed
HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]")
ORDINARY = ("café", "注意力")


class Hostile(nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.add_module(BAD, nn.Linear(8, 8))
        self.add_module("x\x1b[2Jy", nn.Linear(8, 8))  # a terminal's clear-screen sequence
        for name in ORDINARY:
            self.add_module(name, nn.Linear(8, 8))
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.children():
            x = m(x)
        if self.fail:
            raise RuntimeError(f"stopped in {BAD}")
        return x


@pytest.fixture(scope="module")
def trace() -> fv.Trace:
    with fv.record(device="cuda:0", gpu="H100") as t:
        Hostile()(torch.randn(4, 8)).sum().backward()
    assert any(RLO in m for m in t.strings("modules"))
    return t


@pytest.fixture(scope="module")
def failed() -> fv.Trace:
    with pytest.raises(RuntimeError, match="stopped in"), fv.record(device="cuda:0") as t:
        Hostile(fail=True)(torch.randn(4, 8))
    assert t.error is not None and RLO in t.error["message"]
    return t


def _clean(text: str) -> None:
    raw = sorted({f"U+{ord(c):04X}" for c in HIDDEN.findall(text)})
    assert not raw, f"raw control characters shown: {raw}"


def test_visible_writes_out_controls_and_keeps_letters() -> None:
    for c in "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\x00\x1b\r\x7f\x85\x9f":
        assert visible(f"a{c}b") == f"a<U+{ord(c):04X}>b"
    assert visible("a\nb\tc") == "a<U+000A>b<U+0009>c"  # a name: line breaks written out too
    assert visible("a\nb\tc\r", lines=True) == "a\nb\tc<U+000D>"  # a text of several lines keeps them
    for ok in ("café.é", "注意力.层", "слой", "طبقة", "model.layers.0.mlp"):
        assert visible(ok) == ok


def test_the_text_summary(trace: fv.Trace) -> None:
    text = summary(trace)
    _clean(text.replace("\n", ""))
    assert "Hostile.a<U+202E>b" in text and "Hostile.x<U+001B>[2Jy" in text
    for name in ORDINARY:
        assert f"Hostile.{name}" in text


def test_the_summary_of_a_failed_run(failed: fv.Trace) -> None:
    text = summary(failed)
    _clean(text.replace("\n", ""))
    assert "stopped in a<U+202E>b" in text


def test_the_command_line(trace: fv.Trace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hostile.fvz"
    trace.save(path)
    assert main(["report", str(path), "--oplog", "50"]) == 0
    out, err = capsys.readouterr()
    _clean(out.replace("\n", "") + err.replace("\n", ""))
    assert "Hostile.a<U+202E>b" in out and "Hostile.café" in out and "Hostile.注意力" in out


def test_an_error_quoting_the_users_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / f"{BAD}.fvz"
    assert main(["report", str(missing)]) != 0
    out, err = capsys.readouterr()
    _clean(out.replace("\n", "") + err.replace("\n", ""))
    assert "a<U+202E>b.fvz" in err


def test_the_html_report(trace: fv.Trace, failed: fv.Trace, tmp_path: Path) -> None:
    page = report_html(trace, title=f"fakeviz: {BAD}")
    _clean(page.replace("\n", ""))
    assert "<title>fakeviz: a&lt;U+202E&gt;b</title>" in page
    _clean(report_html(failed).replace("\n", ""))
    assert "a&lt;U+202E&gt;b" in report_html(failed)  # the error message in the page's summary


def test_the_explorer_payload_keeps_the_name_the_explorer_writes_it_out(trace: fv.Trace) -> None:
    # A selection the explorer sends back names the module it was (selected_module): the payload keeps the
    # recorded name, and js/src/dom.js writes its controls out wherever it is shown (js/test/visible.test.js).
    _meta, _arrays, strings = unpack(build_state(trace)["tree"])
    assert "Hostile.a\u202eb" in strings["path"]
    assert "Hostile.café" in strings["path"] and "Hostile.注意力" in strings["path"]
