"""How an export check shows: the notebook table with devices coloured, text, and the explorer on its trace."""

from __future__ import annotations

import html
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fakeviz as fv
from fakeviz._core.palette import PALETTE
from fakeviz._export import check_export
from fakeviz._views.export import device_colors, export_html, export_text
from fakeviz._views.payload import build_state

needs_fake_cuda = pytest.mark.skipif(
    not fv.fake_cuda_status().cuda_ok, reason="no fake cuda in this process (no C++ compiler for the shim)"
)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        if x.shape[0] > 0 and h.mean() > 100:  # data-dependent when asked for below
            h = h * 0
        return self.fc2(h.to(self.fc2.weight.device))


class Plain(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)).to(self.fc2.weight.device))


@pytest.fixture(scope="module")
def hybrid() -> object:
    if not fv.fake_cuda_status().cuda_ok:
        pytest.skip("no fake cuda in this process")
    with fv.fake_mode():
        model = Plain()
        model.fc1.to("cuda:0")
        x = torch.randn(4, 12, device="cuda:0")
    return check_export(model, (x,))


def test_device_colours_follow_the_display_order() -> None:
    assert device_colors(["cpu", "cuda:1", "cuda:0"]) == {"cuda:0": PALETTE[0], "cuda:1": PALETTE[1], "cpu": PALETTE[2]}


@needs_fake_cuda
def test_the_notebook_table_colours_each_device(hybrid: object) -> None:
    out = hybrid._repr_html_()
    assert "export ok" in out and "fv-fits" in out
    colours = {"cuda:0": PALETTE[0], "cpu": PALETTE[1]}
    nodes = hybrid.nodes
    for dev, colour in colours.items():
        cells = re.findall(rf"background:{colour};[^>]*></span>{re.escape(dev)}</span>", out)
        # one per node on that device, plus the legend
        assert len(cells) == int((nodes["device"] == dev).sum()) + 1, dev
    # a node without a tensor (device "") gets an empty cell, no device and no colour
    assert (nodes["device"] == "").any()
    assert out.count("class='fv-device'") == int((nodes["device"] != "").sum()) + len(colours)
    # every shown node is a row, its user line shortened to the file's name
    assert out.count("<tr>") == len(nodes) + 1
    assert "test_export_view.py:" in out


@needs_fake_cuda
def test_text_and_repr(hybrid: object) -> None:
    assert repr(hybrid) == "<fakeviz.ExportCheck ok: 11 nodes, 5 ops on cuda:0, cpu>"
    text = str(hybrid)
    assert text.splitlines()[0] == "export ok: 11 nodes, 5 ops on cuda:0, cpu"
    row = next(line for line in text.splitlines() if line.startswith("gelu "))
    assert "aten.gelu.default" in row and "[4, 32]" in row and "cuda:0" in row
    assert re.search(r"^to\s+aten\.to\.dtype_layout\s+\[4, 32\]\s+float32\s+cpu", text, re.M)


@needs_fake_cuda
def test_the_explorer_shows_both_devices(hybrid: object) -> None:
    state = build_state(hybrid.trace)
    summary = state["summary"]
    assert summary["devices"] == ["cuda:0", "cpu"]
    assert set(summary["peaks"]) == {"cuda:0", "cpu"} and summary["error"] is None
    pytest.importorskip("anywidget")
    widget = hybrid.explore()
    assert type(widget).__name__ == "Explorer"


def test_a_failed_export_shows_the_reason() -> None:
    with fv.fake_mode():
        model, x = MLP(), torch.randn(4, 12)
    check = check_export(model, (x,))
    assert not check.ok
    out = check._repr_html_()
    assert "export failed" in out and "fv-over" in out and "data-dependent" in out
    assert html.escape(check.reason) in out and "<table" not in out
    assert repr(check) == "<fakeviz.ExportCheck failed (data-dependent)>"
    assert str(check).startswith("export failed (data-dependent)\n\nexport failed:")


def test_long_tables_are_cut_with_a_note() -> None:
    ep = torch.export.export(Plain(), (torch.randn(2, 12),))
    from fakeviz._analysis.export_nodes import export_nodes

    nodes = export_nodes(ep)
    out = export_html(True, None, nodes, max_rows=3)
    assert out.count("<tr>") == 4 and f"{len(nodes) - 3} more nodes" in out
    assert f"{len(nodes) - 2} more nodes" in export_text(True, None, nodes, max_rows=2)
