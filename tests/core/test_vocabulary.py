"""The shared vocabulary in ``fakeviz._core``: capacities, devices, formatting, the palette, the record's memo."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fakeviz as fv
from fakeviz._core.devices import device_order, is_host, uses_caching_allocator
from fakeviz._core.fmt import format_bytes, format_count, format_flops
from fakeviz._core.gpus import GPUS, Capacity, capacity_of, gpu_capability, parse_capacity
from fakeviz._core.palette import CATEGORY_COLORS, PHASE_COLORS, palette
from fakeviz._core.record import Record
from fakeviz._core.schema import CATEGORIES, LAYOUT, PHASES, dtype_abbr


@pytest.mark.parametrize(
    ("spec", "nbytes", "gpu"),
    [
        ("H100", 81559 * 2**20, "H100"),
        ("h100-80gb", 81559 * 2**20, "H100 80GB"),
        ("A100_40GB", 40536 * 2**20, "A100 40GB"),
        ("80GB", 80 * 10**9, None),
        ("80 GiB", 80 * 2**30, None),
        ("24e9", 24 * 10**9, None),
        (8e10, 8 * 10**10, None),
        (1024, 1024, None),
    ],
)
def test_capacity_parse(spec, nbytes, gpu) -> None:
    cap = Capacity.parse(spec)
    assert (cap.bytes, cap.gpu, cap.spec) == (nbytes, gpu, spec)
    assert parse_capacity(spec) == nbytes and Capacity.parse(cap) is cap


def test_capacity_label_and_capability() -> None:
    assert Capacity.parse("H100").label == "H100 (79.6 GiB)"
    assert Capacity.parse("80GB").label == "74.5 GiB"
    assert Capacity.parse("a100 40gb").capability == (8, 0) == gpu_capability("A100-40GB")
    assert Capacity.parse("MI300X").capability is None and gpu_capability("80GB") is None


@pytest.mark.parametrize("bad", ["H1000", "80 parsecs", "", -1, 0, "-5GB"])
def test_capacity_errors_name_what_to_do(bad) -> None:
    with pytest.raises(ValueError) as info:
        Capacity.parse(bad)
    msg = str(info.value)
    assert ("80GB" in msg and "H100" in msg) or "positive" in msg


def test_capacity_of_reads_every_form_a_record_stored() -> None:
    """Records store what was asked: a GPU name (record(gpu=)), bytes (%%fake --capacity) or a size (the CLI)."""
    assert capacity_of({"capacity": "H100"}) == Capacity(GPUS["H100"], "H100", "H100")
    assert capacity_of({"capacity": 8 * 2**30}).bytes == 8 * 2**30
    assert capacity_of({"capacity": "80GB"}).bytes == 80 * 10**9
    assert capacity_of({}) is None and capacity_of({"capacity": None}) is None
    assert capacity_of({"capacity": "H100"}, "L4").gpu == "L4"


def test_devices() -> None:
    assert is_host("cpu") and is_host("meta") and is_host("cpu:0")
    assert not is_host("cuda:0") and not is_host("mps") and not is_host("cpuish")
    assert device_order(["cpu", "cuda:10", "meta", "cuda:2", "cuda:0"]) == [
        "cuda:0",
        "cuda:2",
        "cuda:10",
        "cpu",
        "meta",
    ]
    assert uses_caching_allocator("cuda:3") and not uses_caching_allocator("cpu")


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (81559 * 2**20, "79.6 GiB"), (-2048, "-2.0 KiB"), (None, "?"),
     (float("nan"), "?"), (2**60, "1024.0 PiB")],
)  # fmt: skip
def test_format_bytes(n, text) -> None:
    assert format_bytes(n) == text


def test_format_si() -> None:
    assert format_flops(512) == "512 FLOP" and format_flops(3.1e12) == "3.1 TFLOP"
    assert format_count(512) == "512" and format_count(7.0e6) == "7.0 M"


def test_palette_covers_the_vocabulary() -> None:
    assert tuple(CATEGORY_COLORS) == CATEGORIES and tuple(PHASE_COLORS) == PHASES
    p = palette()
    assert p["categories"] == [CATEGORY_COLORS[c] for c in CATEGORIES]
    assert len(set(p["categories"])) == len(CATEGORIES)


def test_layout_declares_every_row_table() -> None:
    b = Record().builder
    for _prefix, attr, cols in LAYOUT:
        assert hasattr(b, attr) and len(cols) == len(set(cols))
    assert dtype_abbr("torch.bfloat16") == "bf16"
    assert dtype_abbr("torch.float8_e4m3fnuz") == "torch.float8_e4m3fnuz"
    assert dtype_abbr("torch.float8_e4m3fnuz", strip=True) == "float8_e4m3fnuz"


def test_memo_is_emptied_when_the_record_grows() -> None:
    """Analyses read while recording see the ops recorded so far, not a stale memo."""
    with fv.record(device="cpu") as trace:
        x = torch.ones(4)
        first = trace.ops
        assert len(first) == len(trace) and trace.ops is first  # memoised while nothing changes
        y = x * 2
        second = trace.ops
        assert len(second) == len(trace) > len(first)
    del y
    assert isinstance(trace, Record) and not trace.recording
    calls = []
    assert trace.cached("k", lambda: calls.append(1) or 7) == 7 == trace.cached("k", lambda: calls.append(1) or 8)
    assert calls == [1]
    trace.clear_memo()
    assert trace.cached("k", lambda: 9) == 9
    assert np.array_equal(trace.col("phase"), trace.columns()["phase"])


# --- Words (issue 34): one name per concept, one parser per concept ------------------------------------------------

LAYERS = ("_core", "_engine", "_analysis", "_views", "_frontends")  # anything else in fakeviz/ is the facade

#: Public top-level names defined in more than one layer on purpose, and why (CONTRIBUTING.md, "Words").
SAME_NAME_ON_PURPOSE = {
    "record": "one thing: fv.record is the engine's record making a Trace (Note: [one source for record's signature])",
    "load_ipython_extension": "one thing: fakeviz's IPython hook forwards to the magics' own",
    "unload_ipython_extension": "one thing: fakeviz's IPython hook forwards to the magics' own",
    "apply": "a module's verb, always called through its module: adapters.apply (LoRA), _quant.apply (quantization)",
    "user_frame": "one concept: the innermost frame of the user's code, in an export error and in a %%fake cell",
}


def _top_level_names() -> dict[str, set[tuple[str, str]]]:
    import ast
    from pathlib import Path

    root = Path(fv.__file__).parent
    names: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        layer = next((part for part in rel.parts if part in LAYERS), "facade")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith(
                "_"
            ):
                names.setdefault(node.name, set()).add((layer, str(rel)))
    return names


def test_no_name_means_two_things_across_layers() -> None:
    """A function or class name defined in two layers is one concept there, or it gets a second name: the
    allocator replay is not ``simulate``, a figure is not ``memory_timeline`` (an allow-list for the deliberate)."""
    names = _top_level_names()
    twice = {name: sorted(where) for name, where in names.items() if len({layer for layer, _ in where}) > 1}
    assert {name: twice[name] for name in twice if name not in SAME_NAME_ON_PURPOSE} == {}
    assert sorted(set(SAME_NAME_ON_PURPOSE) - set(twice)) == []  # an allowed name no longer twice: drop it
    for name in ("simulate", "memory_timeline", "ops_table", "alias_graph", "parse_gpus", "advice", "transfers"):
        assert len(names.get(name, ())) <= 1, (name, names[name])  # issue 34's list, one definition each


def test_figures_end_in_figure_and_old_names_warn() -> None:
    """fakeviz.views: a function returning a plotly figure ends in ``_figure``, and only those; the names before
    the rule still work and warn FakeVizDeprecationWarning naming the new one."""
    import inspect
    import warnings

    from fakeviz import views

    funcs = {n: getattr(views, n) for n in views.__all__ if inspect.isfunction(getattr(views, n))}
    figures = {n for n, f in funcs.items() if inspect.signature(f).return_annotation in ("go.Figure", "Figure")}
    assert figures == {n for n in funcs if n.endswith("_figure")} and len(figures) == 5
    old = {"layer_tree": "layer_tree_figure", "memory_bars": "memory_bars_figure", "alias_graph": "alias_graph_figure",
           "memory_timeline": "memory_timeline_figure", "ops_table": "ops_table_data"}  # fmt: skip
    for name, new in old.items():
        assert name not in views.__all__ and name not in dir(views)
        with pytest.warns(
            views.FakeVizDeprecationWarning, match=rf"fakeviz\.views\.{name} is now fakeviz\.views\.{new}"
        ):
            assert getattr(views, name) is getattr(views, new)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert views.memory_timeline_figure is not None  # the new names do not warn
    with pytest.raises(AttributeError, match="no attribute 'memory_timelines'"):
        views.memory_timelines  # noqa: B018


#: Every dtype spelling, and the dtype it means, written out here (not read from the program's table).
SPELLINGS = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "f32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16, "f16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64, "f64": torch.float64,
    "fp8": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2, "fp8_e5m2": torch.float8_e5m2,
}  # fmt: skip


def test_one_dtype_parser_reads_every_spelling_everywhere() -> None:
    """Note: [dtype spellings]: the union of the old tables, read the same by record, build, plan, the CLI, the
    magic and the speed table; ``f64`` (refused everywhere before) and vLLM's ``fp8_e4m3`` now read everywhere."""
    from fakeviz._core.dtypes import DTYPE_NAMES, dtype_name
    from fakeviz._core.gpu_specs import gpu_spec
    from fakeviz._engine.arguments import as_dtype, default_dtype
    from fakeviz._frontends import cli
    from fakeviz._frontends.magic import _parse_dtype
    from fakeviz.models import as_dtype as models_as_dtype

    assert set(DTYPE_NAMES) == set(SPELLINGS)
    h100 = gpu_spec("H100")
    for spelled, dtype in SPELLINGS.items():
        name = str(dtype).removeprefix("torch.")
        for written in (spelled, spelled.upper(), f" torch.{spelled} "):
            assert dtype_name(written) == name and as_dtype(written) is dtype is models_as_dtype(written)
        assert cli._dtype(spelled) == name and h100.peak_flops(spelled) == h100.peak_flops(dtype)
        if dtype.itemsize >= 2:  # what torch.set_default_dtype takes: record(dtype=), %%fake --dtype
            assert default_dtype(spelled) is dtype is _parse_dtype(spelled)
        else:
            with pytest.raises(ValueError, match="cannot be the default dtype"):
                default_dtype(spelled)
    assert h100.peak_flops("f16") == 989.4e12 and h100.peak_flops("double") == 66.9e12  # "f16" was read as fp32
    for bad in ("bf17", "int4", 16, True, ""):
        with pytest.raises(ValueError, match="not a dtype fakeviz knows"):
            as_dtype(bad)


def test_one_device_parser_for_record_and_the_magic() -> None:
    """``%%fake --device mps`` is refused as ``fv.record(device="mps")`` is (it was accepted, then failed later)."""
    from IPython.core.error import UsageError

    from fakeviz._frontends.magic import _parse_device

    assert [_parse_device(d) for d in ("cuda:3", "cuda", "cpu", "meta")] == ["cuda:3", "cuda", "cpu", "meta"]
    with pytest.raises(ValueError, match="fakeviz does not fake mps devices"):
        fv.record(device="mps")
    for bad, why in (("mps", "fakeviz does not fake mps devices"), ("gpu", "not a device"), ("cuda:64", "cuda:63")):
        with pytest.raises(UsageError, match=f"--device '{bad}': .*{why}"):
            _parse_device(bad)


def test_one_gpus_and_capacity_parser() -> None:
    """gpus= / --gpus / --capacity / %%fake --gpu are read by _core.gpus alone: the same spec, the same GPUs."""
    from fakeviz._core.gpus import parse_gpus, read_gpus
    from fakeviz._frontends.cli import gpus_option
    from fakeviz._frontends.magic import _parse_capacity

    assert gpus_option("2xA100-40GB") == (2, "A100-40GB")
    caps = parse_gpus("2xA100-40GB")
    assert [c.bytes for c in caps] == [40536 * 2**20] * 2 and read_gpus("2xA100-40GB")[0] == 2
    assert _parse_capacity("a100 40gb", "--gpu").bytes == 40536 * 2**20 == Capacity.parse("A100_40GB").bytes
    assert _parse_capacity("80GB", "--capacity").bytes == 80 * 10**9
