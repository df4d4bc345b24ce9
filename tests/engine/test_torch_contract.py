"""Note: [the C core's torch contract]: the FakeTensorMode internals the C core calls are checked against the torch
in use; a torch that changed them records with the Python core, with one warning, and the same trace."""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv
from fakeviz import FakeVizWarning
from fakeviz._engine import native


def _record() -> fv.Trace:
    with fv.record(device="cuda:0") as trace:
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        m(torch.randn(3, 8)).sum().backward()
    return trace


def test_the_installed_torch_keeps_the_contract(c_core: str) -> None:
    assert native.contract_problems() == []
    assert _record().meta["recorder_core"] == "c"


def test_a_changed_internal_is_named() -> None:
    problems = native.contract_problems(
        {
            "FakeTensorMode._cache_key": ("self", "func", "state", "args", "kwargs"),
            "FakeTensorMode._no_such_method": ("self",),
            "_DispatchCacheValidEntry": ("output_infos",),
        }
    )
    assert problems[0] == (
        "FakeTensorMode._cache_key(self, state, func, args, kwargs) where the core expects "
        "(self, func, state, args, kwargs)"
    )
    assert problems[1] == "FakeTensorMode._no_such_method is missing"
    assert problems[2].startswith("_DispatchCacheValidEntry(output_infos, is_output_tuple)")


def test_a_torch_that_breaks_it_records_in_python_with_one_warning(
    c_core: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _record()
    broken = dict(native.TORCH_CONTRACT)
    broken["FakeTensorMode._output_from_cache_entry"] = ("self", "entry", "state", "key", "func", "args")
    monkeypatch.setattr(native, "TORCH_CONTRACT", broken)
    monkeypatch.setattr(native, "_state", {})
    with pytest.warns(FakeVizWarning, match=r"changed FakeTensorMode internals.*_output_from_cache_entry"):
        assert native.core() is None
    assert "Python recorder records instead" in native.status()
    trace = _record()  # no second warning: the status is kept
    assert trace.meta["recorder_core"] == "python"
    assert trace.oplog() == expected.oplog()
    assert trace.memory().equals(expected.memory())
