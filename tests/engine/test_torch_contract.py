"""Note: [the C core's torch contract] and Note: [private torch signatures]: the FakeTensorMode internals fakeviz
overrides and calls are bound to the signature the torch in use has (adapted by name, or stepped aside to torch's
own path with one warning); the C core needs only the dispatch protocol. Each test that moves a signature does so in
its own scope, on the torch in use, and compares the record with the normal one."""

from __future__ import annotations

import inspect
import re
import textwrap
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._subclasses.fake_tensor as ft

import fakeviz as fv
from fakeviz import FakeVizError, FakeVizWarning
from fakeviz._engine import native
from fakeviz._engine.recorder import modes, signatures
from fakeviz._engine.torch_compat import TorchInternalsWarning


def _record() -> fv.Trace:
    with fv.record(device="cuda:0") as trace:
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x = torch.randn(3, 8)
        m(x).sum().backward()
        m(x[:2].t().contiguous().t()).sum().backward()  # a view, a cache hit of each op of the first step
    return trace


def _same(trace: fv.Trace, expected: fv.Trace) -> None:
    assert trace.oplog() == expected.oplog()
    assert trace.memory().equals(expected.memory())


@pytest.fixture
def moved() -> Iterator[pytest.MonkeyPatch]:
    """Moves torch's signatures in the test's scope; undone after it, then the recording mode is bound again."""
    patch = pytest.MonkeyPatch()
    yield patch
    patch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torch in use, restored: nothing steps aside
        assert modes.adapt() == []


def test_the_installed_torch_keeps_the_contract(c_core: str, moved: pytest.MonkeyPatch) -> None:
    assert native.contract_problems({path: native.TORCH_CONTRACT[path] for path in native.CORE_NEEDS}) == []
    assert modes._REFUSED == "" and modes._CACHE
    # every override is bound (adapted where this torch moved its signature, as 2.15 did), none steps aside
    for name in modes._OVERRIDES:
        assert name in modes._FakeRecordingMode.__dict__, name
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
        "FakeTensorMode._cache_key(self, state, func, args, kwargs) where fakeviz expects "
        "(self, func, state, args, kwargs)"
    )
    assert problems[1] == "FakeTensorMode._no_such_method is missing"
    assert problems[2].startswith("_DispatchCacheValidEntry(output_infos, is_output_tuple)")


def test_a_torch_that_breaks_the_core_records_in_python_with_one_warning(
    c_core: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _record()
    broken = dict(native.TORCH_CONTRACT)
    broken["FakeTensorMode.__torch_dispatch__"] = ("self", "types", "func", "args", "kwargs")
    monkeypatch.setattr(native, "TORCH_CONTRACT", broken)
    monkeypatch.setattr(native, "_state", {})
    with pytest.warns(TorchInternalsWarning, match=r"changed FakeTensorMode internals.*__torch_dispatch__"):
        assert native.core() is None
    assert "Python recorder records instead" in native.status()
    trace = _record()  # no second warning: the status is kept
    assert trace.meta["recorder_core"] == "python"
    _same(trace, expected)


def _renamed(fn: Any, old: str, new: str) -> Any:
    """``fn`` (torch's own method) with parameter ``old`` renamed ``new``: torch's callers, which pass it by position,
    still reach it; fakeviz, which reads it by name, no longer finds it."""
    names = [new if n == old else n for n in inspect.signature(fn).parameters]
    ns: dict[str, Any] = {"fn": fn}
    exec(f"def moved({', '.join(names)}):\n    return fn({', '.join(names)})", ns)
    return ns["moved"]


def _offered(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ops whose dispatch-cache entries the Python hooks hand to the recorder, in order."""
    funcs: list[Any] = []
    offer = modes._FakeRecordingMode._fv_entry

    def spy(self: Any, func: Any, entry: Any) -> None:
        funcs.append(func)
        offer(self, func, entry)

    monkeypatch.setattr(modes._FakeRecordingMode, "_fv_entry", spy)
    return funcs


def _torch_215_move(moved: pytest.MonkeyPatch) -> None:
    """torch 2.15's move, made on the torch in use: ``_output_from_cache_entry`` without ``func``, its two callers
    (torch's own source, recompiled) calling it so."""
    original = ft.FakeTensorMode._output_from_cache_entry

    def _output_from_cache_entry(self: Any, state: Any, entry: Any, key: Any, args: Any) -> Any:
        # this torch's own helpers still want the op: the first item of torch's key, the second of fakeviz's
        func = key.key[1] if key.key[0] is signatures._values.FAST_KEY else key.key[0]
        return original(self, state, entry, key, func, args)

    for name in ("_cached_dispatch_impl", "_get_output_info_for_cache_entry"):
        src = textwrap.dedent(inspect.getsource(getattr(ft.FakeTensorMode, name)))
        src, n = re.subn(r"(self\._output_from_cache_entry\(\s*state,\s*\w+,\s*key,\s*)func,\s*", r"\1", src)
        assert n == 1, name
        ns: dict[str, Any] = {}
        exec(compile(src, ft.__file__, "exec"), ft.__dict__, ns)
        moved.setattr(ft.FakeTensorMode, name, ns[name])
    moved.setattr(ft.FakeTensorMode, "_output_from_cache_entry", _output_from_cache_entry)


@pytest.mark.parametrize("recorder_core", ["c", "python"])
def test_torch_215s_move_is_adapted_without_a_warning(
    recorder_core: str, monkeypatch: pytest.MonkeyPatch, moved: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if "func" not in native.torch_parameters("FakeTensorMode._output_from_cache_entry"):  # type: ignore[operator]
        pytest.skip("this torch made the move itself (test_the_installed_torch_keeps_the_contract records on it)")
    if recorder_core == "c":
        request.getfixturevalue("c_core")
    else:
        monkeypatch.setenv("FAKEVIZ_PURE_PYTHON", "1")
    _record()  # the dispatch cache warm, as for the record under the move
    funcs = _offered(monkeypatch)
    monkeypatch.setenv("FAKEVIZ_PURE_PYTHON", "1")  # Python hooks, so the spy sees what each is offered
    expected = _record()
    expected_funcs = list(funcs)
    funcs.clear()
    if recorder_core == "c":
        monkeypatch.delenv("FAKEVIZ_PURE_PYTHON")
    _torch_215_move(moved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert modes.adapt() == []  # adapted: nothing steps aside, no warning
    hook = modes._FakeRecordingMode.__dict__["_output_from_cache_entry"]
    assert hook is not modes._OWN_HOOKS["_output_from_cache_entry"]  # the adapter (the C core's hook steps aside)
    trace = _record()
    assert trace.meta["recorder_core"] == recorder_core
    _same(trace, expected)
    if recorder_core == "python":  # (the C core offers the entries it makes itself, where the spy does not see)
        # the op each entry is for is found from the cache key: the same ops as torch's func gave
        assert funcs == expected_funcs and expected_funcs


_STEPS_ASIDE = [name for name, (_, cost) in modes._OVERRIDES.items() if cost is not None]


@pytest.mark.parametrize("name", _STEPS_ASIDE)
def test_an_override_that_cannot_adapt_steps_aside_with_one_warning(name: str, moved: pytest.MonkeyPatch) -> None:
    expected = _record()
    read = modes._OVERRIDES[name][0][0]
    moved.setattr(ft.FakeTensorMode, name, _renamed(getattr(ft.FakeTensorMode, name), read, f"{read}_"))
    with pytest.warns(TorchInternalsWarning) as caught:
        stepped = modes.adapt()
    assert len(caught) == 1 and len(stepped) == 1
    message = str(caught[0].message)
    assert f"FakeTensorMode.{name}(" in message and modes._OVERRIDES[name][1] in message  # type: ignore[operator]
    assert name not in modes._FakeRecordingMode.__dict__  # torch's own method
    assert issubclass(TorchInternalsWarning, FakeVizWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning: none while recording
        trace = _record()
    _same(trace, expected)


def test_a_torch_without_the_dispatch_fakeviz_needs_is_refused_clearly(moved: pytest.MonkeyPatch) -> None:
    moved.setattr(ft.FakeTensorMode, "_dispatch_impl",
                        _renamed(ft.FakeTensorMode._dispatch_impl, "func", "op"))  # fmt: skip
    modes.adapt()
    with pytest.raises(FakeVizError, match=r"_dispatch_impl\(self, op, types, args, kwargs\) where fakeviz expects"):
        _record()
