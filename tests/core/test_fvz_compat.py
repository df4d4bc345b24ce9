"""A ``.fvz`` written by the code before the layer restructure still loads, and every analysis and view reads the same.

``tests/fixtures/pre_move.fvz`` was written at commit d1f67a0 (the last commit before ``fakeviz/_core``
existed) by ``tests/fixtures/make_pre_move.py``, which also wrote ``pre_move.json``: digests of the op log,
every DataFrame, memory, peaks, verdicts, FLOPs, the plotly views and the explorer's payload, as that code
computed them. Today's code must compute the same from the same file.
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
