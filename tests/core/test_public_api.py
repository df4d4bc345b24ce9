"""Every name of ``fakeviz.__all__`` from before the layer restructure is still there and does what it did."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import fakeviz as fv

BEFORE = [
    "PHASES", "CATEGORIES", "ROLES", "DataDependentError", "FakeSession", "FakeVizError", "FakeVizWarning",
    "RecordError", "Recording", "Trace", "TraceFormatError", "explore", "fake_cuda_status", "fake_mode", "fakeify",
    "is_fake", "load", "meta_like", "record",
]  # fmt: skip
RECORD_PARAMS = ["device", "dtype", "fake", "symbolic", "exclude", "modules", "session", "progress", "attention", "gpu"]
RECORD_PARAMS += ["gpus"]  # appended by issue 14 (how many fake GPUs torch.cuda.device_count() reports)
RECORD_PARAMS += ["routing"]  # appended by issue 14 (what an unknown MoE routing is assumed to be)


def test_all_keeps_every_name() -> None:
    assert fv.__all__[: len(BEFORE)] == BEFORE  # new names are appended after these
    for name in BEFORE:
        assert getattr(fv, name) is not None
    assert callable(fv.load_ipython_extension) and callable(fv.unload_ipython_extension)


def test_record_signature_and_result(tmp_path: Path) -> None:
    assert list(inspect.signature(fv.record).parameters) == RECORD_PARAMS
    assert "``trace``, a\n        :class:`~fakeviz.Trace`" in fv.record.__doc__
    rec = fv.record(device="cuda:0")
    assert isinstance(rec, fv.Recording)
    with rec as trace:
        w = torch.nn.Linear(4, 4)
        w(torch.randn(2, 4)).sum().backward()
    assert isinstance(trace, fv.Trace) and fv.is_fake(w.weight)
    assert fv.meta_like(w.weight).device.type == "meta"
    assert fv.load(trace.save(tmp_path / "t.fvz")).oplog() == trace.oplog()
    assert fv.fake_cuda_status().mode in ("native", "shim", "unavailable")


def test_record_is_the_engine_s_record_declared_once() -> None:
    """Note: [one source for record's signature]: fv.record's parameters are the engine's less the two the facade
    fills, with the engine's defaults and annotations, each documented; a parameter it does not have is refused."""
    from fakeviz import _api
    from fakeviz._engine import recorder

    engine = inspect.signature(recorder.record).parameters
    facade = inspect.signature(fv.record).parameters
    assert set(_api.FILLED) == {"record_cls", "memory_stats"} and set(_api.FILLED) <= set(engine)
    assert list(facade) == [name for name in engine if name not in _api.FILLED]
    for name, param in facade.items():
        assert param == engine[name] and param.kind is inspect.Parameter.KEYWORD_ONLY
    doc = fv.record.__doc__
    assert doc.startswith(recorder.record.__doc__.rstrip()) and doc.rstrip().endswith(_api.RETURNS.rstrip())
    args = doc[doc.index("    Args:\n") : doc.index("\n\n", doc.index("    Args:\n"))]
    assert [name for name in facade if f"\n        {name}: " not in args] == []  # every parameter documented
    with pytest.raises(
        TypeError, match=r"record\(\) got an unexpected keyword argument 'devices'; did you mean 'device'"
    ):
        fv.record(devices="cpu")
    with pytest.raises(TypeError, match="positional"):
        fv.record("cpu")
    with pytest.raises(TypeError, match="record_cls"):
        fv.record(record_cls=object)  # filled by the facade: a Trace, always


def test_explore_a_model_without_running_it() -> None:
    with fv.fake_mode(device="cuda:0"):
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    widget = fv.explore(m)
    assert type(widget).__name__ == "Explorer" and widget.summary["n_ops"] == 0
    with pytest.raises(TypeError, match="fakeviz.Trace or a torch.nn.Module"):
        fv.explore(42)


def test_errors_keep_their_hierarchy() -> None:
    assert issubclass(fv.DataDependentError, fv.RecordError) and issubclass(fv.RecordError, fv.FakeVizError)
    assert issubclass(fv.TraceFormatError, ValueError) and issubclass(fv.FakeVizWarning, UserWarning)
