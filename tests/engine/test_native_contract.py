"""Note: [the C core's contract]: every name the recorder's C core reaches Python by is declared once, in
``fakeviz/_engine/native_contract.py``; the C side is generated from it, the build refuses sources that
disagree with it, a core built for another declaration is not used, and the declared names exist on the
objects C reads them from."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from c_core import needs_core

from fakeviz._core.errors import FakeVizWarning
from fakeviz._engine import native, native_contract
from fakeviz._engine.recorder import ops, recording
from fakeviz._engine.recorder.storages import _StorageRef


def _texts() -> dict[str, str]:
    return {name: text.decode() for name, text in native._sources().items()}


def test_the_c_sources_agree_with_the_contract() -> None:
    """The checked-in C sources spell no name the declaration lacks, and use every one it declares."""
    assert native_contract.source_problems(_texts()) == []
    # the C sources spell no attribute name themselves any more: each comes from fv_names.h
    code = "\n".join(native_contract._code(t) for t in _texts().values())
    assert "PyUnicode_InternFromString" not in code and '"tensor_id"' not in code and '"tid_base"' not in code


def test_a_name_the_declaration_lacks_is_found() -> None:
    """Each way C and the declaration can disagree is reported, naming the file, line and name."""
    texts = _texts()
    part = "fvcore/record.c"
    # a new quoted attribute name
    lines = texts[part].split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("static "))  # the first function
    lines.insert(at + 1, '    PyObject *x = PyObject_GetAttrString(self->state, "new_field");')
    problems = native_contract.source_problems({**texts, part: "\n".join(lines)})
    assert problems == [f'{part}:{at + 2}: "new_field" is not in the contract: declare it in '
                        "fakeviz/_engine/native_contract.py and use its s_ name or macro"]  # fmt: skip
    # in a comment it is no use of a name
    commented = {**texts, part: texts[part] + '\n/* "new_field" */\n'}
    assert native_contract.source_problems(commented) == []
    # a declared name no C source uses any more
    dropped = {n: t.replace("s_seen_forward", "s_active") for n, t in texts.items()}
    assert native_contract.source_problems(dropped) == [
        "the contract declares 'seen_forward' but no C source uses s_seen_forward"
    ]
    # a Core argument C never reads, a keyword it never passes
    unread = {n: t.replace("->role_saved", "->tid_base") for n, t in texts.items()}
    assert native_contract.source_problems(unread) == [
        "the contract declares Core argument 'role_saved' but no C source reads ->role_saved"
    ]
    unpassed = {n: t.replace("FV_KW_DISPATCH_DEVICE", "NULL") for n, t in texts.items()}
    assert len(native_contract.source_problems(unpassed)) == 1


def test_the_generated_header_spells_each_name_once() -> None:
    """``fv_names.h``: one interned variable per declared name, interned with that text; Core's arguments
    by kind; the frame depth derived from the constant the Python recorder uses."""
    header = native_contract.names_header()
    interned = dict(re.findall(r'\((s_\w+) = PyUnicode_InternFromString\("([^"]+)"\)\)', header))
    assert sorted(interned.values()) == sorted(native_contract.NAMES)
    assert len(interned) == len(native_contract.NAMES) == len(set(native_contract.NAMES))
    assert interned["s_fakeviz_tid"] == "_fakeviz_tid" and interned["s_dict"] == "__dict__"
    objects = re.search(r"#define FV_CORE_OBJECTS\(X\) (.*)", header)[1]  # type: ignore[index]
    ints = re.search(r"#define FV_CORE_INTS\(X\) (.*)", header)[1]  # type: ignore[index]
    args = re.findall(r"X\((\w+)\)", objects + " " + ints)
    assert sorted([*args, "layout"]) == sorted(native_contract.CORE_ARGUMENTS)
    assert f"#define FV_CORE_NARGS {len(native_contract.CORE_ARGUMENTS)}" in header
    assert f"#define PARAM_NEW_FRAMES ({native_contract.PARAM_NEW_FRAMES_UP} + 1)" in header
    assert f'#define FV_CONTRACT "{native_contract.contract_hash()}"' in header
    # the Python recorder's walk uses the same constant, spelled nowhere else
    walk = inspect.getsource(ops._called_from_parameter_new)
    assert "range(PARAM_NEW_FRAMES_UP)" in walk and not re.search(r"range\(\d+\)", walk)


def test_the_contract_hash_follows_the_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another name, argument or depth is another contract (and another cached core)."""
    before = native_contract.contract_hash()
    monkeypatch.setattr(native_contract, "PARAM_NEW_FRAMES_UP", 25)
    assert native_contract.contract_hash() != before
    monkeypatch.setattr(native_contract, "PARAM_NEW_FRAMES_UP", 24)
    assert native_contract.contract_hash() == before
    monkeypatch.setattr(native_contract, "NAMES", (*native_contract.NAMES, "another"))
    assert native_contract.contract_hash() != before


@needs_core
def test_the_build_refuses_sources_that_disagree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A C source with a name the declaration lacks is not compiled: the build fails saying which."""
    monkeypatch.setenv("FAKEVIZ_CACHE_DIR", str(tmp_path))
    sources = native._sources()
    extra = sources["fvcore/pack.c"] + b'\nstatic const char *unused_name = "brand_new_attribute";\n'
    monkeypatch.setattr(native, "_sources", lambda: {**sources, "fvcore/pack.c": extra})
    with pytest.raises(RuntimeError, match=r'disagree: fvcore/pack\.c:\d+: "brand_new_attribute" is not in'):
        native._load()
    assert not list(tmp_path.glob("fvcore_*"))


@needs_core
def test_a_core_built_for_another_contract_is_not_used(c_core: str) -> None:
    """The loaded core carries the contract it was built with; one that differs from the declaration (a
    stale build) warns once and is refused, so the Python recorder records."""
    mod = native.core()
    assert mod is not None and mod.CONTRACT == native_contract.contract_hash()
    native.check_contract(mod)  # the one built now: no warning
    with pytest.warns(FakeVizWarning, match="was built for the contract") as caught:
        with pytest.raises(RuntimeError, match="the Python recorder records instead"):
            native.check_contract(mod, expected="0" * 16)
    assert len(caught) == 1


def _record_state() -> Any:
    rec = recording.record(device="cpu")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with rec:
        model(torch.ones(2, 8)).sum().backward()
    return rec._state


def test_every_state_name_exists_on_a_recording_state(recorder: str) -> None:
    """Every attribute and method C reads, sets or calls on the recording state is there, under both
    recorders (the C core replaces four methods with its own, same names)."""
    state = _record_state()
    missing = [n for n in native_contract.STATE_NAMES if not hasattr(state, n)]
    assert missing == []
    assert (state.core is not None) == (recorder == "c")
    if recorder == "c":
        assert state.record == state.core.record and state.run_op == state.core.run_op
        # every method the declaration says the core defines, it does
        assert all(callable(getattr(state.core, m)) for m in native_contract.CORE_METHODS)
    # the thread dict's keys are the ones the Python recorder uses too
    assert set(native_contract.LOCAL_KEYS) <= set(vars(state.local)), vars(state.local)


def test_the_other_names_exist_on_their_objects() -> None:
    """The names C reads on torch's objects and on fakeviz's own (other than the state) are theirs."""
    from torch._subclasses.fake_tensor import FakeTensorConfig, FakeTensorMode

    groups = native_contract.OTHER_NAMES
    with FakeTensorMode() as mode:
        t = torch.ones(2, 3, requires_grad=True)
        y = (t * 2).sum()
    for n in (*groups["Tensor"], *groups["FakeTensor"]):
        assert hasattr(t, n), n
    for n in groups["FakeTensorMode"]:
        assert hasattr(mode, n), n
    assert all(hasattr(FakeTensorConfig, n) for n in groups["FakeTensorConfig"])
    assert all(hasattr(y.grad_fn, n) for n in groups["autograd Node"])
    assert all(hasattr(torch.ops.aten.add.Tensor, n) for n in groups["OpOverload"])
    assert torch.ops.prim.layout.default._namespace in groups["op namespace (a value compared with, not an attribute)"]
    assert all(hasattr(torch.ones(1).untyped_storage(), n) for n in groups["UntypedStorage"])
    assert set(groups["_StorageRef slot"]) == set(_StorageRef.__slots__)
    # the keywords C passes to Tensor._make_subclass (in the fast fake detach) are ones it takes
    values = {"dispatch_device": True, "device_for_backend_keys": torch.device("cpu")}
    assert set(values) == set(native_contract.CALL_KEYWORDS)
    made = torch.Tensor._make_subclass(torch.Tensor, torch.ones(2), False, **values)
    assert made.shape == (2,)


def test_make_core_passes_exactly_the_declared_arguments() -> None:
    """``_State._make_core`` hands the core exactly :data:`CORE_ARGUMENTS`: the ones the C build takes."""
    state = _record_state()

    class Module:  # stands for the compiled module: only what _make_core calls on it
        @staticmethod
        def Core(**kwargs: Any) -> dict[str, Any]:  # noqa: N802 - the compiled module's name
            return kwargs

    passed = state._make_core(Module)
    assert set(passed) == set(native_contract.CORE_ARGUMENTS)
    ints = [a for a, kind in native_contract.CORE_ARGUMENTS.items() if kind == "int"]
    assert all(isinstance(passed[a], int) for a in ints)
    assert passed["layout"] == native.layout_signature()


@needs_core
def test_the_core_refuses_arguments_it_does_not_declare(c_core: str) -> None:
    """The compiled core takes exactly its declared arguments: one more or one less is refused."""
    state = _record_state()
    mod = native.core()
    assert mod is not None
    kwargs = state._make_core(type("M", (), {"Core": staticmethod(lambda **kw: kw)}))
    mod.Core(**kwargs)
    n = len(native_contract.CORE_ARGUMENTS)
    with pytest.raises(TypeError, match=rf"{n + 1} arguments where this build takes {n}"):
        mod.Core(**kwargs, extra=1)
    missing = dict(kwargs)
    missing.pop("module_by_seq_nr")
    missing["not_declared"] = 0
    with pytest.raises(TypeError, match="missing module_by_seq_nr"):
        mod.Core(**missing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mod.Core(**kwargs)
