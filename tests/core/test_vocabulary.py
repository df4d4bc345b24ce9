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
