"""The ``%%fake`` tour (tests/notebook/magic_tour.py: every option, the progress line, the error display) executed
headlessly with nbclient in this interpreter's kernel; the tutorials themselves are tests/notebook/test_tutorials.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
import magic_tour  # noqa: E402  (tests/notebook is on sys.path under pytest)
from nbrun import text as _text  # noqa: E402  (tests/notebook is on sys.path under pytest)

nbclient = pytest.importorskip("nbclient")


class _RecordingClient(nbclient.NotebookClient):
    """Keeps every update_display_data message (progress lines are only visible there)."""

    updates: list = []

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") == "update_display_data":
            self.updates.append((cell_index, msg["content"].get("data", {})))
        return super().process_message(msg, cell, cell_index)


def _execute(name: str, tmp_path: Path):
    magic_tour.write(tmp_path / name)
    nb = nbformat.read(tmp_path / name, as_version=4)
    client = _RecordingClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.updates = []
    client.execute()
    nb.metadata["_updates"] = client.updates
    return nb


def test_magic_tour(tmp_path):
    nb = _execute("magic_tour.ipynb", tmp_path)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    by_src = {c.source.splitlines()[0]: c for c in cells}
    first = by_src["%%fake --device cuda:0 --dtype bfloat16 --gpu L4 -o trace"]
    html = _text(first)
    assert "fakeviz trace" in html and "cuda:0" in html and ("fits" in html or "does not fit" in html)
    check = _text(
        by_src["print(type(model.model.embed_tokens.weight).__name__, model.model.embed_tokens.weight.device)"]
    )
    assert "FakeTensor cuda:0" in check or "Parameter cuda:0" in check
    assert "backward" in check and "forward" in check
    assert _text(by_src["%%fake --device cuda:0"]) == ""  # trailing ';' hides the trace
    assert "optimizer" in _text(by_src["_fake.ops.phase.value_counts()"])
    assert "does not fit" in _text(
        by_src["%%fake --device cuda:0 --capacity 8GiB --attention math -o t_math"]
    ) or "fits" in _text(by_src["%%fake --device cuda:0 --capacity 8GiB --attention math -o t_math"])
    assert _text(by_src["%%fake --no-display -o quiet"]) == ""
    assert "6.0" in _text(by_src["%%fake --real -o real_trace"])
    broken = _text(by_src["%%fake --device cuda:0 -o broken"])
    # a draw on the GPU's generator is unknown to the fake run (a CPU draw from the seeded generator would be known)
    assert (
        "needs the value of a tensor the fake run does not know" in broken and "Stopped by DataDependentError" in broken
    )
    # what the notebook shows for the error: the magic's short text (the cell named as IPython names it)
    shown = "\n".join(
        re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(o.traceback))
        for o in by_src["%%fake --device cuda:0 -o broken"].outputs
        if o.output_type == "error"
    )
    assert shown.startswith("DataDependentError in Cell In[") and "is in `broken`" in shown
    assert "symbolic=True" not in shown and "ipykernel" not in shown and len(shown.splitlines()) <= 25
    after = _text(by_src["print(broken.error['op'], '| partial ops:', broken.num_ops)"])
    assert (
        "aten._local_scalar_dense.default" in after and "still active? False" in after and "tensor([2., 2.])" in after
    )
    assert "reset" in _text(by_src["%fake_reset"])
    assert "cuda:3" in _text(by_src["%%fake -o t_cfg"])
    long_cell = by_src["%%fake -o t_long"]
    # the progress display was shown (its output is there) and emptied when the cell ended
    progress = [
        o for o in long_cell.outputs if o.get("output_type") == "display_data" and o.get("data") == {"text/plain": ""}
    ]
    assert len(progress) == 1, long_cell.outputs
    assert "ops recorded," not in _text(long_cell) and "1,501 ops" in _text(long_cell)
    assert "IPython.core.display" not in "".join(_text(c) for c in cells)
    long_index = nb.cells.index(long_cell)
    shown = [d.get("text/plain", "") for i, d in nb.metadata["_updates"] if i == long_index]
    assert any(
        "ops recorded, forward" in t or "ops recorded, other" in t or "ops recorded, init" in t for t in shown
    ), shown
    assert shown[-1] == ""
    for c in cells:  # no progress line was left behind anywhere
        assert "ops recorded," not in _text(c)
