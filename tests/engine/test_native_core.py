"""The recorder core in C records exactly what the Python implementation records.

Note: [recorder core in C] (``fakeviz/_engine/native.py``): ``csrc/fvcore.c`` (with the parts it
includes from ``csrc/fvcore/``) takes the common path of ``_State.record`` and ``_State.pack_saved``;
``FAKEVIZ_PURE_PYTHON=1`` makes the Python methods record instead. Every column and every string
table of the two traces must be equal, for fake and real runs of every zoo model, a Llama step
with the recorded op cache hot, and the uncommon paths (lift_fresh, symbolic sizes,
data-dependent errors, progress reports, unknown cuda devices). The fast dispatch-cache key (Note: [fast
dispatch-cache key] in ``recorder/fastpath.py``) gives the trace torch's own key gives, and its hits pass torch's
cross-check.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zoo
from c_core import needs_core

import fakeviz as fv
from fakeviz._engine import native as _native
from fakeviz._engine import native_contract

REPO = Path(__file__).resolve().parents[2]


def _record(fn: Any, *, pure: bool, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[fv.Trace, str]:
    if pure:
        monkeypatch.setenv("FAKEVIZ_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("FAKEVIZ_PURE_PYTHON", raising=False)
    gc.collect()
    gc.disable()  # storage free times must not depend on when the collector runs
    try:
        with fv.record(**kw) as trace:
            fn()
    finally:
        gc.enable()
        monkeypatch.delenv("FAKEVIZ_PURE_PYTHON", raising=False)
    return trace, trace.meta["recorder_core"]


def _assert_same_trace(c: fv.Trace, py: fv.Trace) -> None:
    assert c.num_ops == py.num_ops
    assert c.oplog_lines() == py.oplog_lines()
    for name in sorted(py.columns()):
        a, b = c.col(name), py.col(name)
        if not np.array_equal(a, b):
            i = int(np.flatnonzero(a != b)[0]) if a.shape == b.shape else -1
            pytest.fail(f"column {name} differs (first at row {i}): c={a[i] if i >= 0 else a.shape} "
                        f"python={b[i] if i >= 0 else b.shape}")  # fmt: skip
    for table in sorted(py.string_tables()):
        assert c.strings(table) == py.strings(table), table
    assert c.error == py.error


def test_core_is_built_and_used(c_core: str) -> None:
    assert c_core == _native.status() == "c"
    with fv.record() as trace:
        torch.ones(2).add(1)
    assert trace.meta["recorder_core"] == "c"


@needs_core
@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_core_gives_the_python_trace(name: str, fake: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    c, kind_c = _record(lambda: zoo.run(name), pure=False, monkeypatch=monkeypatch, fake=fake)
    py, kind_py = _record(lambda: zoo.run(name), pure=True, monkeypatch=monkeypatch, fake=fake)
    assert (kind_c, kind_py) == ("c", "python")
    _assert_same_trace(c, py)


def _llama_step() -> None:
    from fakeviz import models

    cfg = models.config("llama3-70b", num_hidden_layers=4, hidden_size=64, intermediate_size=96,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128)  # fmt: skip
    model = models.build(cfg, dtype=torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    model(ids, labels=ids).loss.backward()
    torch.optim.AdamW(model.parameters()).step()


@needs_core
def test_core_gives_the_python_trace_llama_on_fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layers 2 to 4 come from the recorded op cache; backward runs on autograd's cuda thread; over 1024 ops
    (a progress report) on every torch."""
    reports: dict[str, list[Any]] = {"c": [], "python": []}
    traces = {}
    for pure in (False, True):
        key = "python" if pure else "c"
        traces[key], _ = _record(_llama_step, pure=pure, monkeypatch=monkeypatch, device="cuda:0",
                                 progress=lambda *a, k=key: reports[k].append(a))  # fmt: skip
    _assert_same_trace(traces["c"], traces["python"])
    assert reports["c"] == reports["python"] and len(reports["c"]) >= 1, reports


@needs_core
def test_core_gives_the_python_trace_on_uncommon_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    def work() -> None:
        w = torch.nn.Parameter(torch.randn(4, 4))  # Note: [Parameter detach]
        x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # lift_fresh
        y = (x @ w).relu()
        z = torch.cat([y, y, x], 0).split(2)  # a list input, a tuple output
        (z[0].sum() + z[1].mean()).backward()
        torch.empty(3, device="cuda:5").fill_(1)  # a device seen only now

    c, _ = _record(work, pure=False, monkeypatch=monkeypatch, device="cuda:1")
    py, _ = _record(work, pure=True, monkeypatch=monkeypatch, device="cuda:1")
    _assert_same_trace(c, py)


@needs_core
def test_core_symbolic_and_data_dependent_like_python(monkeypatch: pytest.MonkeyPatch) -> None:
    def work() -> None:
        x = torch.empty(8, 4)  # values unknown (Note: [values under fake tensors])
        n = torch.nonzero(x > 0)  # data-dependent size: symbolic under a ShapeEnv
        n.float().sum()

    c, _ = _record(work, pure=False, monkeypatch=monkeypatch, symbolic=True)
    py, _ = _record(work, pure=True, monkeypatch=monkeypatch, symbolic=True)
    _assert_same_trace(c, py)

    def bad() -> None:
        x = torch.empty(8)
        if x.sum().item() > 0:  # a Python branch on an unknown value: a clear error
            x.add_(1)

    errs = []
    for pure in (False, True):
        with pytest.raises(fv.DataDependentError) as info:
            _record(bad, pure=pure, monkeypatch=monkeypatch)
        errs.append(info.value)
    _assert_same_trace(errs[0].trace, errs[1].trace)
    assert torch._guards.detect_fake_mode() is None


@needs_core
def test_core_device_range_error_names_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    def bad() -> None:
        torch.ones(2).mul(3)
        torch.empty(2, device="cuda:99")

    partial = []
    for pure in (False, True):
        with pytest.raises(fv.FakeVizError, match=r"cuda:99") as info:
            _record(bad, pure=pure, monkeypatch=monkeypatch)
        assert "raised by op aten.empty" in "\n".join(getattr(info.value, "__notes__", [])), info.value
        assert torch._guards.detect_fake_mode() is None  # no fake mode left active
        partial.append(info.value.fakeviz_trace.oplog_lines())  # the partial record is kept
    assert partial[0] == partial[1]
    assert [line.split(" = ")[1] for line in partial[0][:2]] == [
        "aten.ones.default([2], device=cpu, pin_memory=False)",
        "aten.mul.Tensor($0, 3)",
    ]


def test_no_compiler_falls_back_to_python(tmp_path: Path) -> None:
    """Without a compiler (CC and CXX point at a failing program, PATH has none) the Python
    implementation records the same ops, and status() says why."""
    code = textwrap.dedent(
        """
        import torch, fakeviz as fv
        from fakeviz._engine import native as _native
        with fv.record() as t:
            torch.ones(3).mul(2)
        print(t.meta["recorder_core"], "|", _native.status())
        print(t.oplog())
        """
    )
    env = dict(os.environ, FAKEVIZ_CACHE_DIR=str(tmp_path), CC="/bin/false", CXX="/bin/false")
    env.pop("FAKEVIZ_PURE_PYTHON", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # the fake-cuda shim is built first (from a copy in the fresh cache dir it cannot compile either)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, *log = proc.stdout.splitlines()
    assert first.startswith(
        "python | python (RuntimeError: compiling the recorder core failed (/bin/false exited with 1)"
    ), first
    assert [line.split(" = ")[1] for line in log] == [
        "aten.ones.default([3], device=cpu, pin_memory=False)",
        "aten.mul.Tensor($0, 2)",
    ]


@needs_core
def test_core_makes_the_saved_tensor_aliases_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note: [fast fake detach] in C: no detach of a fake run takes the Python path, and the
    Python wrap runs once per (mode, device) to make the prototype __dict__."""
    from fakeviz._engine.recorder import autograd, fastpath, modes, state

    calls = {"_fake_detach": 0, "_wrap_fake": 0}
    for name in calls:
        orig = getattr(fastpath, name)

        def counted(*args: Any, _orig: Any = orig, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _orig(*args, **kwargs)

        # every module of the recorder that calls it or hands it to the C core
        users = [m for m in (fastpath, modes, autograd, state) if getattr(m, name, None) is orig]
        assert fastpath in users and len(users) >= 2, (name, users)
        for m in users:
            monkeypatch.setattr(m, name, counted)
    # cache hits wrap in Python (Note: [light cache-hit outputs])
    monkeypatch.setattr(fastpath, "_LIGHT_OUTPUTS", False)
    trace, kind = _record(_llama_step, pure=False, monkeypatch=monkeypatch, device="cuda:0")
    assert kind == "c"
    assert calls == {"_fake_detach": 0, "_wrap_fake": 1}, calls
    detaches = sum(
        line.endswith("aten.detach.default") or "aten.detach.default(" in line for line in trace.oplog_lines()
    )
    assert detaches > 0


@needs_core
@pytest.mark.parametrize("misfit", ["columns", "progress"])
def test_core_that_does_not_fit_falls_back_to_python(misfit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core whose init refuses this build (here: a trace layout it was not written for: columns in
    another order than its header's, or a progress interval that is not whole op rows) leaves the
    recording to Python, says why in the trace, and records the same ops."""
    from fakeviz._core import schema
    from fakeviz._engine.recorder import state

    def work() -> None:
        torch.ones(3).mul(2).sum()

    c, kind = _record(work, pure=False, monkeypatch=monkeypatch)  # the core is built (for the real layout)
    assert kind == "c"
    if misfit == "columns":  # what Python hands the core: storage columns in another order
        (st,) = (cols for prefix, _, cols in schema.LAYOUT if prefix == "ST")
        swapped = {k: st[k] for k in ("st_nbytes", "st_device", *list(st)[2:])}
        layout = tuple((p, a, swapped if p == "ST" else cols) for p, a, cols in schema.LAYOUT)
        monkeypatch.setattr(schema, "LAYOUT", layout)
    else:
        monkeypatch.setattr(state, "_PROGRESS_EVERY", 0)  # the core checks its layout constants
    with fv.record() as py:
        work()
    assert py.meta["recorder_core"] == "python"
    assert "trace layout differs" in py.meta["recorder_core_error"]
    assert py.oplog_lines() == c.oplog_lines()


# ------------------------------------------------------------ the row layout the core is built for
def _header_defines(header: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"^#define (FV_\w+) (.+)$", header, re.M)}


def test_schema_header_defines_every_column() -> None:
    """Note: [recorder core in C]: the C core takes its row widths and column positions from a header
    generated from ``fakeviz._core.schema.LAYOUT``: a width per row table, a define per column with its
    position, the phase codes, and the layout signature the core compares with what Python hands it."""
    from fakeviz._core.schema import LAYOUT, OP_COLS, OUT_COLS, PHASES, ST_COLS, field

    defs = _header_defines(_native.schema_header())
    expected = {}
    for prefix, _, cols in LAYOUT:
        expected[f"FV_{prefix}_WIDTH"] = len(cols)
        for i, name in enumerate(cols):
            expected[_native.column_macro(prefix, name)] = i
    assert len(expected) == sum(len(cols) + 1 for _, _, cols in LAYOUT)  # one name per column, none shared
    expected.update({f"FV_PHASE_{phase.upper()}": i for i, phase in enumerate(PHASES)})
    assert {k: int(v) for k, v in defs.items() if k != "FV_LAYOUT"} == expected
    assert defs["FV_LAYOUT"] == f'"{_native.layout_signature()}"'
    # the names as the C core spells them
    assert int(defs["FV_OP_PHASE"]) == field(OP_COLS, "phase") and int(defs["FV_OP_IN_END"]) == field(OP_COLS, "in_end")
    assert int(defs["FV_OUT_NBYTES"]) == field(OUT_COLS, "out_nbytes")
    assert int(defs["FV_ST_FREE"]) == field(ST_COLS, "st_free") and int(defs["FV_ST_WIDTH"]) == len(ST_COLS)
    # every FV_ name the C source uses (fvcore.c and every part it includes) is one a generated header
    # (this one or the contract's, Note: [the C core's contract]) or the source itself defines
    source = b"\n".join(_native._sources().values()).decode()
    assert "FV_OP_PHASE" in source and "FV_ST_FREE" in source
    used = set(re.findall(r"\bFV_[A-Z0-9_]*[A-Z0-9]\b", source))
    names = re.findall(r"^#define (FV_\w+)", native_contract.names_header(), re.M)
    own = re.findall(r"^\s*#\s*define (FV_\w+)", source, re.M)
    assert set(names).isdisjoint(defs) and "FV_CONTRACT" in names
    assert used - {"FV_SCHEMA_H"} <= set(defs) | set(names) | set(own), sorted(used - set(defs) - set(names))


def test_core_cache_key_follows_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached core is named by a hash of its source *and* the generated header: another layout is
    another file, so a layout change builds a new core instead of loading one that writes the old rows."""
    from fakeviz._core import schema

    header = _native.schema_header()
    assert _native._library_path(header) == _native._library_path(_native.schema_header())
    (st,) = (cols for prefix, _, cols in schema.LAYOUT if prefix == "ST")
    swapped = {k: st[k] for k in ("st_nbytes", "st_device", *list(st)[2:])}
    monkeypatch.setattr(schema, "LAYOUT", tuple((p, a, swapped if p == "ST" else c) for p, a, c in schema.LAYOUT))
    other = _native.schema_header()
    assert other != header and "#define FV_ST_NBYTES 0" in other
    assert _native._library_path(other) != _native._library_path(header)


def _included(csrc: Path, name: str) -> list[str]:
    """``name`` and every file it includes with quotes, followed through the parts, in include order."""
    found = [name]
    for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', (csrc / name).read_text(), re.M):
        path = ((csrc / name).parent / inc).resolve().relative_to(csrc.resolve()).as_posix()
        found += [f for f in _included(csrc, path) if f not in found]
    return found


def test_core_cache_key_follows_every_source_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C core is one translation unit in several files (``fvcore.c`` includes its parts from
    ``csrc/fvcore/``): the cached core's name hashes every one of them, so an edit to any part builds
    a new core instead of loading the one built from the old text."""
    csrc = REPO / "fakeviz/_engine/csrc"
    sources = _native._sources()
    included = _included(csrc, "fvcore.c")
    # every file the build includes is hashed, and every file hashed is one the build includes
    assert list(sources)[0] == "fvcore.c" and len(included) > 2, included
    assert sorted(sources) == sorted(included)
    assert list(_native._sources().items()) == list(sources.items())  # a fixed order
    header = _native.schema_header()
    key = _native._cache_key(sources, header)
    assert _native._cache_key(dict(sources), header) == key
    path = _native._library_path(header)
    assert path.name.startswith(f"fvcore_{key}")
    for name, text in sources.items():
        edited = {**sources, name: text.replace(b"\n", b"\n ", 1)}
        assert edited[name] != text, name
        assert _native._cache_key(edited, header) != key, name
        monkeypatch.setattr(_native, "_sources", lambda edited=edited: edited)  # as _load reads them
        assert _native._library_path(header) != path, name
    # the same text cut between two parts at another place, or a part renamed, is another core
    (a, ta), (b, tb) = list(sources.items())[1:3]
    moved = {**sources, a: ta[:-1], b: ta[-1:] + tb}
    assert _native._cache_key(moved, header) != key
    renamed = {(k + ".old" if k == b else k): v for k, v in sources.items()}
    assert _native._cache_key(renamed, header) != key


@needs_core
def test_core_is_rebuilt_when_the_header_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core is compiled once per (source, header, Python) and loaded from the cache after; a changed
    header text builds (and loads) a new one next to it, and a row wider than the C core fills fails."""
    from fakeviz._core import schema

    monkeypatch.setenv("FAKEVIZ_CACHE_DIR", str(tmp_path))
    schema_header = _native.schema_header
    header = schema_header()
    assert hasattr(_native._load(), "Core")
    built = sorted(tmp_path.glob("fvcore_*"))
    assert len(built) == 1
    _native._load()  # cached: nothing new is built
    assert sorted(tmp_path.glob("fvcore_*")) == built
    monkeypatch.setattr(_native, "schema_header", lambda: header + "/* another layout */\n")
    assert hasattr(_native._load(), "Core")
    rebuilt = sorted(tmp_path.glob("fvcore_*"))
    assert len(rebuilt) == 2 and set(built) < set(rebuilt)
    # a column the C core does not fill fails its build (and Python records) instead of leaving it unwritten
    monkeypatch.setattr(_native, "schema_header", schema_header)
    wider = tuple((p, a, {**c, "st_new": "q"} if p == "ST" else c) for p, a, c in schema.LAYOUT)
    monkeypatch.setattr(schema, "LAYOUT", wider)
    with pytest.raises(RuntimeError, match="fill the new ones in new_storage"):
        _native._load()


# ------------------------------------------------ Note: [fast dispatch-cache key], [light cache-hit outputs]
def _fast_keys(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    from fakeviz._engine.recorder import fastpath

    monkeypatch.setattr(fastpath, "_FAST_KEYS", on)
    monkeypatch.setattr(fastpath, "_LIGHT_OUTPUTS", on)


@pytest.mark.parametrize("name", ["llama", "bert", "t5", "views_inplace", "convnet_channels_last"])
def test_fast_cache_keys_give_torchs_trace(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast keys and light cache-hit outputs against torch's own key and outputs. FakeTensorMode's cache is
    emptied before each run, so each run makes its own entries under its own keys."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    traces = []
    for on in (False, True):
        _fast_keys(monkeypatch, on)
        FakeTensorMode.cache.clear()
        traces.append(_record(lambda: zoo.run(name), pure=False, monkeypatch=monkeypatch)[0])
    _assert_same_trace(traces[1], traces[0])


def _adamw_steps() -> None:
    """Three AdamW steps: the bias corrections (the floats of its in-place foreach ops) change at every step."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    buf = torch.zeros(300, 300)  # above the values layer's limit: its in-place ops go through the dispatch cache
    for i in range(3):
        model(torch.ones(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        buf.mul_(0.5 + i).add_(buf, alpha=0.25 * (i + 1))  # in-place ops that return a tensor, other floats


def test_float_blind_keys_give_each_steps_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note: [float-blind in-place keys]: one dispatch-cache entry serves the three steps' ScalarList ops, and the
    op log still shows each step's own floats, as with torch's keys and as in a real run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    traces = []
    for on in (False, True):
        _fast_keys(monkeypatch, on)
        FakeTensorMode.cache.clear()
        traces.append(_record(_adamw_steps, pure=False, monkeypatch=monkeypatch, device="cuda:0")[0])
    _assert_same_trace(traces[1], traces[0])
    real, _ = _record(_adamw_steps, pure=False, monkeypatch=monkeypatch, fake=False)
    lines = [x for x in real.oplog_lines() if "ScalarList" in x]
    assert len(lines) == 6 and len(set(x.split("] = ", 1)[-1] for x in lines)) == 6  # other floats each step
    fake_lines = [x for x in traces[1].oplog_lines() if "ScalarList" in x]
    assert [x.split("aten.", 1)[1].split("(")[0] for x in fake_lines] == [
        x.split("aten.", 1)[1].split("(")[0] for x in lines
    ]
    floats = [x[x.index("[", x.index("(")) :] for x in fake_lines]
    assert floats == [x[x.index("[", x.index("(")) :] for x in lines]
    scaled = [x.split(" = ", 1)[1] for x in traces[1].oplog_lines() if "aten.mul_" in x or "aten.add_.Tensor" in x]
    assert scaled == [x.split(" = ", 1)[1] for x in real.oplog_lines() if "aten.mul_" in x or "aten.add_.Tensor" in x]
    assert "alpha=0.75" in scaled[-1] and "2.5" in scaled[-2]


def test_fast_cache_key_hits_equal_a_fresh_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own cross-check (``fake_tensor_cache_crosscheck_enabled``) re-runs every cache hit without the
    cache and raises if the two outputs differ (sizes, strides, dtype, device, storage, offset); a Llama step hits
    the fast keys, and makes light outputs, thousands of times."""
    import torch._dynamo.config as dynamo_config
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fakeviz._engine.recorder import fastpath

    _fast_keys(monkeypatch, True)
    FakeTensorMode.cache.clear()
    hits = FakeTensorMode.cache_hits
    with dynamo_config.patch(fake_tensor_cache_crosscheck_enabled=True):  # a hidden flag: patch() only
        trace, _ = _record(_llama_step, pure=False, monkeypatch=monkeypatch, device="cuda:0")
    assert trace.error is None
    fast = [k for k in FakeTensorMode.cache if k.key[0] is fastpath._FAST]
    assert len(fast) > 50 and FakeTensorMode.cache_hits - hits > 500


def test_fast_cache_key_tells_apart_what_torchs_key_does() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fakeviz._engine.recorder.fastpath import _fast_key
    from fakeviz._engine.recorder.modes import _FakeRecordingMode

    mode, other = _FakeRecordingMode(), FakeTensorMode()
    add = torch.ops.aten.add.Tensor
    with mode:
        a = torch.empty(4, 6)
        variants = {
            "base": (a, a),
            "dtype": (a, a.to(torch.float16)),
            "shape": (a, torch.empty(6, 4)),
            "stride": (a, torch.empty(6, 4).t()),
            "offset": (a, torch.empty(5, 6)[1:]),
            "storage bytes": (a, torch.empty(30)[:24].view(4, 6)),
            "device": (a, torch.empty(4, 6, device="cuda:1")),
            "requires_grad": (a, torch.empty(4, 6, requires_grad=True)),
            "conj": (torch.empty(4, 6, dtype=torch.complex64), torch.empty(4, 6, dtype=torch.complex64).conj()),
        }
        keys = {k: _fast_key(mode, add, v, {}) for k, v in variants.items()}
        assert None not in keys.values()
        assert len(set(keys.values())) == len(keys), keys
        assert _fast_key(mode, add, (a, torch.empty(4, 6)), {}) == keys["base"]  # same metadata, same key
        scalars = [_fast_key(mode, add, (a, s), {}) for s in (1, 1.0, True)]
        assert len(set(scalars)) == 3  # 1, 1.0 and True hash alike but give other dtypes
        assert _fast_key(mode, add, (a, a), {"alpha": 2}) != _fast_key(mode, add, (a, a), {"alpha": 2.0})
        # torch's own key decides on what the fast key does not know
        sym_free = _fast_key(mode, add, (a, torch.ones(4, 6)), {})  # a small tensor with a kept value
        assert sym_free is None or sym_free == keys["base"]
    with other:
        foreign = torch.empty(4, 6)
    assert _fast_key(mode, add, (a, foreign), {}) is None
    assert _fast_key(mode, add, (a, torch.empty(4, 6, device="meta")), {}) is None
    assert _fast_key(mode, torch.ops.aten.sum.dim_IntList, (a, [0]), {"dtype": None}) is not None
    assert _fast_key(mode, add, (a, {"x": 1}), {}) is None
