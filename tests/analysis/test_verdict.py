"""The verdict: fits / does not fit, and never "fits" for a record that an error stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fakeviz as fv


def _prefix() -> torch.Tensor:
    x = torch.randn(256, 256)
    return x @ x


def _stopped() -> fv.Trace:
    with pytest.raises(fv.DataDependentError):
        with fv.record(device="cuda:0", gpu="H100") as trace:
            y = _prefix()
            torch.nonzero(y > 0).sum().item()  # needs values: the run stops here
    return trace


def test_complete_run_fits() -> None:
    with fv.record(device="cuda:0", gpu="H100") as trace:
        _prefix()
    v = trace.verdict("H100")
    assert v["fits"] and not v["incomplete"] and v["text"].startswith("fits: cuda:0 peaks at")


def test_stopped_run_is_incomplete_never_fits(tmp_path: Path) -> None:
    with fv.record(device="cuda:0", gpu="H100") as complete:
        _prefix()
    trace = _stopped()
    v = trace.verdict("H100")
    assert v["incomplete"] and v["fits"] is False
    assert v["text"].startswith("incomplete: the run stopped at op ") and "aten.nonzero.default" in v["text"]
    assert "the rest is unknown" in v["text"]
    # what was recorded before the error is the complete run's memory, per device
    assert v["devices"]["cuda:0"]["raw"] >= complete.verdict("H100")["devices"]["cuda:0"]["raw"]
    assert "incomplete" in repr(trace) and "fv-over" in trace._repr_html_()
    assert fv.load(trace.save(tmp_path / "stopped.fvz")).verdict("H100") == v  # the error travels with the file


def test_stopped_run_over_capacity_says_both() -> None:
    v = _stopped().verdict(4096)
    assert not v["fits"] and v["incomplete"]
    assert v["text"].startswith("does not fit 4.0 KiB: cuda:0 over by") and "the run stopped at op" in v["text"]
