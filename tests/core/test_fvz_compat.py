"""A ``.fvz`` written by the code before the layer restructure still loads, and every analysis and view reads the same.

``tests/fixtures/pre_move.fvz`` was written at commit d1f67a0 (the last commit before ``fakeviz/_core``
existed) by ``tests/fixtures/make_pre_move.py``, which also wrote ``pre_move.json``: digests of the op log,
every DataFrame, memory, peaks, verdicts, FLOPs, the plotly views and the explorer's payload, as that code
computed them. Today's code must compute the same from the same file.

Re-pinned on purpose (issues 15 and 16 changed what these show; every other key is still the pre-move
value): ``memory`` gained the "KV cache" column (``test_memory_is_the_old_table_plus_kv_cache`` checks the
table without it is still the pre-move one), and the plotly views, the explorer's payload and
``repr_html`` changed with issue 15 (the one "reserved at peak", labelled alias graph, axes that fit the
data, the static summary) and issue 16 (the KV cache category in the payload); ``explorer_summary`` again with
issue 17 (each device of the verdict names its own capacity: GPUs of different sizes); ``modules``, ``folded``,
``summary``, ``repr_html``, ``explorer_tree`` and ``view_layer_tree`` with issue 31 (the precision of the weights: a ``precision`` column,
a "weights:" line, the tree pack's precisions; read from the file's parameter dtypes, since it predates them), and
``test_the_old_tables_and_texts_plus_the_weights_precision`` checks that without those additions they are still
the pre-move ones. Issue 41 (one verdict: the bytes it judged, in judged_text's words; one step) re-pinned
``summary``, ``repr_html``, ``explorer_summary``, ``verdict_1gb``, ``verdict_h100`` and ``view_memory_bars``
(and the summary's and repr_html's digests in that test).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import fakeviz as fv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
import make_pre_move  # noqa: E402

EXPECTED = json.loads((FIXTURES / "pre_move.json").read_text())


@pytest.fixture(scope="module")
def figures() -> dict:
    trace = fv.load(FIXTURES / "pre_move.fvz")
    return json.loads(json.dumps(make_pre_move.figures(trace), default=str))


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_same_as_before_the_move(figures: dict, key: str) -> None:
    assert figures[key] == EXPECTED[key]


def test_pre_move_file_loads_as_a_trace() -> None:
    trace = fv.load(FIXTURES / "pre_move.fvz")
    assert isinstance(trace, fv.Trace) and len(trace) == EXPECTED["num_ops"]
    assert trace.meta["gpu"] == "H100" and trace.error is None
    assert trace.verdict("H100")["fits"] and not trace.verdict("H100")["incomplete"]


def test_memory_is_the_old_table_plus_kv_cache() -> None:
    trace = fv.load(FIXTURES / "pre_move.fvz")
    memory = trace.memory()
    assert (memory["KV cache"] == 0).all()
    pre_move = "2aa1d24f85a758817ca5d6bde8b40975e1059bb54b374b065f4da44a3399a65c"  # the digest written at d1f67a0
    assert make_pre_move.digest(memory.drop(columns=["KV cache"])) == pre_move


def test_the_old_tables_and_texts_plus_the_weights_precision() -> None:
    """Issue 31 added the precision of the weights (Note: [weight precision]); the file predates it, so it is read
    from the parameter dtypes (GPT-2 in fp32), and without it every table and text is the one written at d1f67a0."""
    import re

    from fakeviz import views
    from fakeviz._views.text import summary

    trace = fv.load(FIXTURES / "pre_move.fvz")
    pre_move = {"modules": "93c719ec66bfe70a00d24c156895732edeab2148828303ea7cd33e40c579b17b",
                "folded": "031406f5fd1e22b52a7e12ed113156001e47f95206289c26b1cdc5b73aee2e50",
                "summary": "6cccf5350c6322a04d9044c0d3d3915c212b21fadb84eee5aadb9e638403d502",  # issue 41's verdict words
                "repr_html": "dce78026793df626b0ae3dfe494e82fbd1ce8e469289f8aaa3396e87138ab2ed",  # issue 41
                "view_layer_tree": "57b0ab52776895731c1aba399ab79b56307a87f10e815944b064f7ad9477fa80"}  # fmt: skip
    assert set(trace.modules["precision"]) == {"fp32", ""} and "weight_precision" not in trace.meta
    assert make_pre_move.digest(trace.modules.drop(columns=["precision"])) == pre_move["modules"]
    assert make_pre_move.digest(trace.folded_modules().drop(columns=["precision"])) == pre_move["folded"]
    lines = summary(trace).splitlines()
    assert "weights: fp32 (8 conv, 5 norm, 2 embedding, lm_head)" in lines
    assert make_pre_move.digest("\n".join(x for x in lines if not x.startswith("weights: "))) == pre_move["summary"]
    html, n = re.subn(r"<div class='fv-weights'><b>weights</b>: [^<]*</div>", "", trace._repr_html_())
    assert n == 1 and make_pre_move.digest(html) == pre_move["repr_html"]
    # the layer tree's hover names each module's weights ("<br>weights: fp32", escaped in the figure's JSON)
    figure, n = re.subn(r"\\u003cbr\\u003eweights: [^\\\"]*", "", views.layer_tree_figure(trace).to_json())
    assert n == 16 and make_pre_move.digest(figure) == pre_move["view_layer_tree"]
