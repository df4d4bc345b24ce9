"""The GPU spec table (``fakeviz._core.gpu_specs``): one spec per catalog GPU, every figure sourced, the
relations between figures that hold on every GPU, lookups by every name the catalog accepts, and the
measured H100 of ``tests/fixtures/h100_time.json.gz`` under its peaks."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fakeviz._core.errors import ArgumentError
from fakeviz._core.gpu_specs import FLOP_KINDS, GPU_SPECS, GPUSpec, gpu_spec
from fakeviz._core.gpus import CAPABILITY, GPUS, MULTIPROCESSORS, PUBLISHED_GB, ROCM_ARCH, Capacity, read_gpus

SPECS = list(GPU_SPECS.values())
IDS = list(GPU_SPECS)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100_time.json.gz"
FIELDS = ("memory_bytes", "sms", "flops", "hbm_bytes_per_s", "nvlink_bytes_per_s", "pcie_bytes_per_s")


def test_every_catalog_gpu_has_a_spec_built_from_the_catalog() -> None:
    assert set(GPU_SPECS) == set(GPUS)
    for name, spec in GPU_SPECS.items():
        assert (spec.name, spec.memory_bytes, spec.sms) == (name, GPUS[name], MULTIPROCESSORS[name])


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_every_figure_has_a_source(spec: GPUSpec) -> None:
    allowed = set(FIELDS) | {f"flops.{k}" for k in spec.flops}
    assert set(spec.sources) <= allowed, f"a source for no figure: {set(spec.sources) - allowed}"
    for key in FIELDS:
        assert isinstance(spec.sources.get(key), str) and len(spec.sources[key]) > 20, key
    for key in ("flops", "hbm_bytes_per_s"):  # the compute and memory figures come from a vendor's document
        assert any(w in spec.sources[key] for w in ("datasheet", "data sheet", "whitepaper")), spec.sources[key]
    if spec.nvlink_bytes_per_s == 0:
        assert "none" in spec.sources["nvlink_bytes_per_s"]
    else:  # a bidirectional total was halved, and the source says so
        assert "halved" in spec.sources["nvlink_bytes_per_s"] or "each way" in spec.sources["nvlink_bytes_per_s"]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_flop_relations(spec: GPUSpec) -> None:
    f = spec.flops
    assert set(f) <= set(FLOP_KINDS) and "fp32" in f and "fp16" in f and "fp64" in f
    assert all(isinstance(v, float) and v > 0 for v in f.values())
    assert f["fp64"] <= f["fp32"]
    # tensor (matrix) cores: half precision at least twice FP32, and bf16 runs as fp16 wherever it exists
    assert f["fp16"] >= 1.9 * f["fp32"]
    if "bf16" in f:
        assert f["bf16"] == f["fp16"]
    if "tf32" in f:  # TF32 is half the bf16 rate on every GPU that has both, and never below FP32
        assert 0.45 <= f["tf32"] / f["bf16"] <= 0.55 and f["tf32"] >= f["fp32"]
    if "fp8" in f:  # fp8 doubles bf16 (a sparse figure left undivided would break these ratios)
        assert 1.95 <= f["fp8"] / f["bf16"] <= 2.05
    if "int8" in f:
        assert f["fp16"] <= f["int8"] <= 4 * f["fp16"]
    assert f["fp16"] / f["fp32"] <= 32


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_the_kinds_follow_the_architecture(spec: GPUSpec) -> None:
    """bf16 and tf32 from Ampere (sm80) on, fp8 from Ada/Hopper (sm89); AMD: CDNA 3 (MI300X) has tf32 and fp8."""
    cap = CAPABILITY.get(spec.name)
    if cap is not None:
        assert ("bf16" in spec.flops) == ("tf32" in spec.flops) == (cap >= (8, 0))
        assert ("fp8" in spec.flops) == (cap >= (8, 9))
    else:
        assert spec.name in ROCM_ARCH
        assert ("fp8" in spec.flops) == ("tf32" in spec.flops) == (ROCM_ARCH[spec.name][0] == "gfx942")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_bandwidths_are_plausible(spec: GPUSpec) -> None:
    assert 2.5e11 <= spec.hbm_bytes_per_s <= 1e13
    assert 50 <= spec.flops["fp16"] / spec.hbm_bytes_per_s <= 500  # FLOP per byte at the ridge point
    assert spec.pcie_bytes_per_s in (16e9, 32e9, 64e9)  # Gen3 / Gen4 / Gen5 x16, one direction
    assert spec.nvlink_bytes_per_s == 0 or spec.pcie_bytes_per_s < spec.nvlink_bytes_per_s <= 1e12
    assert spec.memory_bytes / spec.hbm_bytes_per_s < 0.1  # reading the whole memory takes well under 100 ms


def test_the_gpus_issue_32_names_are_in_the_table() -> None:
    named = ["H100", "H100 PCIe", "H200", "B200", "A100 40GB", "A100 80GB", "L4", "L40S", "A10G", "T4", "RTX 3090",
             "RTX 4090", "RTX 5090", "MI300X"]  # fmt: skip
    assert [n for n in named if n not in GPU_SPECS] == []
    assert GPU_SPECS["H100 PCIe"].flops["bf16"] == 756e12 and GPU_SPECS["H100 PCIe"].sms == 114
    assert GPU_SPECS["RTX 5090"].flops["bf16"] == 209.5e12 and CAPABILITY["RTX 5090"] == (12, 0)


def test_same_silicon_same_compute() -> None:
    h100, h200 = GPU_SPECS["H100"], GPU_SPECS["H200"]
    assert h200.flops == h100.flops and h200.hbm_bytes_per_s > h100.hbm_bytes_per_s
    assert h200.nvlink_bytes_per_s == h100.nvlink_bytes_per_s == 450e9  # 900 GB/s both directions
    assert GPU_SPECS["H100 80GB"] == replace(h100, name="H100 80GB")  # an alias: every figure the same
    assert GPU_SPECS["A100"] == replace(GPU_SPECS["A100 80GB"], name="A100")
    a80, a40 = GPU_SPECS["A100 80GB"], GPU_SPECS["A100 40GB"]
    assert a40.flops == a80.flops and a40.hbm_bytes_per_s < a80.hbm_bytes_per_s
    assert GPU_SPECS["V100 16GB"].flops == GPU_SPECS["V100 32GB"].flops
    assert GPU_SPECS["H100 NVL"].flops["bf16"] < h100.flops["bf16"]  # the NVL card runs at a lower clock
    assert GPU_SPECS["B200"].flops["bf16"] > 2 * h100.flops["bf16"]


def test_the_figures_the_issue_quotes() -> None:
    h100 = GPU_SPECS["H100"]
    assert h100.flops == {"fp64": 66.9e12, "fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12,
                          "fp16": 989.4e12, "fp8": 1978.9e12, "int8": 1978.9e12}  # fmt: skip
    assert (h100.hbm_bytes_per_s, GPU_SPECS["H200"].hbm_bytes_per_s) == (3.35e12, 4.8e12)
    a100 = GPU_SPECS["A100 80GB"]
    assert (a100.flops["bf16"], a100.flops["tf32"], a100.flops["fp32"]) == (312e12, 156e12, 19.5e12)
    assert (a100.hbm_bytes_per_s, GPU_SPECS["A100 40GB"].hbm_bytes_per_s) == (2.039e12, 1.555e12)
    # GeForce: the tensor figure with FP32 accumulate (PyTorch's), half the FP16-accumulate one
    assert GPU_SPECS["RTX 4090"].flops["bf16"] == 165.2e12 and GPU_SPECS["RTX 3090"].flops["bf16"] == 71e12


@pytest.mark.parametrize(
    ("gpu", "dtype", "tf32", "kind"),
    [
        ("H100", "torch.bfloat16", False, "bf16"),
        ("H100", torch.float16, False, "fp16"),
        ("H100", "torch.float32", False, "fp32"),
        ("H100", "torch.float32", True, "tf32"),
        ("H100", torch.float8_e4m3fn, False, "fp8"),
        ("H100", "torch.float8_e5m2", False, "fp8"),
        ("H100", "torch.int8", False, "int8"),
        ("H100", "torch.float64", True, "fp64"),
        ("H100", "torch.int64", False, "fp32"),  # integer and bool ops run on the CUDA cores
        ("H100", "bfloat16", False, "bf16"),
        ("MI300X", "torch.float8_e4m3fnuz", False, "fp8"),
        ("T4", "torch.bfloat16", False, "fp32"),  # no bf16 tensor path: CUDA cores, not the fp16 tensor cores
        ("T4", "torch.float32", True, "fp32"),
        ("T4", "torch.float16", False, "fp16"),
        ("V100 32GB", "torch.bfloat16", True, "fp32"),
        ("V100 32GB", "torch.int8", False, "fp16"),
        ("A100", "torch.float8_e4m3fn", False, "bf16"),  # no fp8 on Ampere: the nearest slower path
        ("RTX 3090", "torch.float8_e4m3fn", False, "bf16"),
        ("MI250X", "torch.float32", True, "fp32"),  # CDNA 2 has no TF32
    ],
)
def test_peak_flops_by_dtype(gpu, dtype, tf32, kind) -> None:
    spec = GPU_SPECS[gpu]
    assert spec.peak_flops(dtype, tf32=tf32) == spec.flops[kind]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_peak_flops_never_raises(spec: GPUSpec) -> None:
    dtypes = [v for v in vars(torch).values() if isinstance(v, torch.dtype)]
    assert len(dtypes) > 20
    for dtype in dtypes + ["torch.no_such_dtype", ""]:
        for tf32 in (False, True):
            assert spec.peak_flops(dtype, tf32=tf32) in spec.flops.values()
    assert spec.peak_flops("torch.float32", tf32=True) >= spec.peak_flops("torch.float32")


@pytest.mark.parametrize("name", IDS)
def test_lookup_by_every_name_the_catalog_accepts(name: str) -> None:
    for written in (name, name.lower(), name.replace(" ", "-"), name.replace(" ", "_"), f"  {name.lower()} "):
        assert Capacity.parse(written).gpu == name
        assert gpu_spec(written) is GPU_SPECS[name]
    spec = GPU_SPECS[name]
    assert gpu_spec(spec) is spec and gpu_spec(Capacity.parse(name)) is spec


@pytest.mark.parametrize(
    ("bad", "near"),
    [("H1000", "H100"), ("RTX 4080", "RTX 4090"), ("a100 80", "A100 80GB"), ("MI300", "MI300X"), ("H20", "H200")],
)
def test_an_unknown_gpu_is_refused_with_close_names(bad: str, near: str) -> None:
    with pytest.raises(ArgumentError) as info:
        gpu_spec(bad)
    err = info.value
    assert isinstance(err, ValueError) and err.argument == "gpu" and err.value == bad
    assert near in err.suggestions and repr(near) in str(err) and "H100" in str(err)


@pytest.mark.parametrize("bad", ["80GB", 8e10, 5, None, "", "potato"])
def test_a_size_or_a_non_name_is_refused(bad) -> None:
    with pytest.raises(ArgumentError) as info:
        gpu_spec(bad)
    if bad == "80GB":
        assert "memory size" in str(info.value) and not info.value.suggestions
    assert "The catalog's GPUs: H100" in str(info.value)


def test_the_measured_h100_stays_under_its_peaks() -> None:
    """tests/fixtures/h100_time.json.gz (a real H100 SXM, torch 2.11): no matmul beats its dtype's peak, the best
    reaches 70% of it (a peak twice too high, a sparse figure left undivided, would fail), and copies too big for
    L2 run between 80% and 100% of the HBM figure."""
    data = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    spec = gpu_spec(data["device"].replace("NVIDIA ", "").split(" HBM")[0])  # "NVIDIA H100 80GB HBM3"
    assert spec.name == "H100 80GB" and data["sm_count"] == spec.sms
    best: dict[tuple[str, bool], float] = {}
    for row in data["micro"]:
        if row["kind"] in ("gemm", "bmm"):
            peak = spec.peak_flops(row["dtype"], tf32=bool(row.get("tf32")))
            rate = row["flops"] / row["s"]
            assert rate <= peak, row
            key = (row["dtype"], bool(row.get("tf32")))
            best[key] = max(best.get(key, 0.0), rate / peak)
    assert set(best) == {("torch.bfloat16", False), ("torch.float16", False), ("torch.float32", False),
                         ("torch.float32", True)}  # fmt: skip
    assert min(best.values()) >= 0.7, best
    big = [r for r in data["micro"] if r["kind"] in ("copy", "add", "mul_") and r["bytes"] >= 2**28]
    assert len(big) >= 6
    for row in big:
        assert 0.8 <= row["bytes"] / row["s"] / spec.hbm_bytes_per_s <= 1.0, row


# Consumer and inference GPUs (issue 31): (name, published GB, driver MiB, capability, SMs, dense TFLOP/s
# fp32 / bf16 / fp16 / fp8 / int8 (None: no such tensor path), memory GB/s, NVLink GB/s one way, PCIe GB/s one way),
# as the vendors' datasheets and whitepapers print them (the sources are each spec's ``sources``).
CONSUMER = [
    ("RTX 3090", 24, 24576, (8, 6), 82, 35.6, 71.0, 71.0, None, 284.0, 936, 56.25, 32),
    ("RTX 4090", 24, 24564, (8, 9), 128, 82.6, 165.2, 165.2, 330.3, 660.6, 1008, 0, 32),
    ("RTX 5090", 32, 32607, (12, 0), 170, 104.8, 209.5, 209.5, 419.0, 838.0, 1792, 0, 64),
    ("L4", 24, 23034, (8, 9), 58, 30.3, 121.0, 121.0, 242.5, 242.5, 300, 0, 32),
    ("L40S", 48, 46068, (8, 9), 142, 91.6, 362.05, 362.05, 733.0, 733.0, 864, 0, 32),
    ("A10G", 24, 23028, (8, 6), 80, 31.2, 125.0, 125.0, None, 250.0, 600, 0, 32),
    ("A10", 24, 23028, (8, 6), 72, 31.2, 125.0, 125.0, None, 250.0, 600, 0, 32),
    ("T4", 16, 15360, (7, 5), 40, 8.1, None, 65.0, None, 130.0, 320, 0, 16),
    ("RTX A6000", 48, 49140, (8, 6), 84, 38.7, 154.8, 154.8, None, 309.7, 768, 56.25, 32),
]  # fmt: skip


@pytest.mark.parametrize("row", CONSUMER, ids=[r[0] for r in CONSUMER])
def test_consumer_and_inference_gpus_as_published(row) -> None:
    name, gb, mib, cap, sms, fp32, bf16, fp16, fp8, int8, mem, nvlink, pcie = row
    spec = GPU_SPECS[name]
    assert (PUBLISHED_GB[name], GPUS[name], CAPABILITY[name], MULTIPROCESSORS[name]) == (gb, mib * 2**20, cap, sms)
    want = {"fp32": fp32, "bf16": bf16, "fp16": fp16, "fp8": fp8, "int8": int8}
    assert {k: (spec.flops[k] / 1e12 if k in spec.flops else None) for k in want} == want
    assert (spec.hbm_bytes_per_s, spec.nvlink_bytes_per_s, spec.pcie_bytes_per_s) == (mem * 1e9, nvlink * 1e9,
                                                                                      pcie * 1e9)  # fmt: skip
    # a kind the card lacks runs on the next slower path it has: bf16 on a T4 on the CUDA cores, fp8 on Ampere as bf16
    assert spec.peak_flops("torch.bfloat16") == (bf16 or fp32) * 1e12
    assert spec.peak_flops(torch.float8_e4m3fn) == (fp8 or bf16 or fp16) * 1e12


@pytest.mark.parametrize("name", IDS)
def test_the_driver_reports_a_little_less_than_the_published_memory(name: str) -> None:
    """The vendor's "24GB" is 24 GiB of memory chips; the driver keeps a few MiB, and ECC on a GDDR card (T4, L4,
    L40S, A10, A10G) a sixteenth and a few MiB more: between 93.5% and 100% of the published figure in GiB."""
    ratio = GPUS[name] / (PUBLISHED_GB[name] * 2**30)
    assert 0.935 <= ratio <= 1.0, (name, ratio)


@pytest.mark.parametrize(
    ("written", "name"),
    [("4090", "RTX 4090"), ("RTX4090", "RTX 4090"), ("rtx 4090", "RTX 4090"), ("rtx-4090", "RTX 4090"),
     ("GeForce RTX 4090", "RTX 4090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("3090", "RTX 3090"),
     ("RTX3090", "RTX 3090"), ("5090", "RTX 5090"), ("l4", "L4"), ("L40S", "L40S"), ("l40s", "L40S"),
     ("A10G", "A10G"), ("NVIDIA A10G", "A10G"), ("a10", "A10"), ("T4", "T4"), ("Tesla T4", "T4"), ("A6000", "RTX A6000"),
     ("rtx a6000", "RTX A6000"), ("NVIDIA H100 80GB HBM3", "H100")],
)  # fmt: skip
def test_names_users_type(written: str, name: str) -> None:
    assert Capacity.parse(written).gpu == name and gpu_spec(written) is GPU_SPECS[name]
    assert Capacity.parse(written).bytes == GPUS[name]
    n, caps = read_gpus(f"2x{written}")
    assert n == 2 and [c.gpu for c in caps] == [name, name]
    assert read_gpus(written)[1][0].gpu == name  # "4090" alone is the GPU, not 4090 GPUs


def test_a_count_is_still_a_count() -> None:
    assert read_gpus("8") == (8, None) and read_gpus(8) == (8, None)
    with pytest.raises(ArgumentError) as info:
        read_gpus(4090)  # a number of GPUs, never a GPU: the message says how to name the card
    assert "4090 GPUs" in str(info.value) and "'4090' as a string" in str(info.value) and "RTX 4090" in str(info.value)
    with pytest.raises(ArgumentError, match="between 1 and 64"):
        read_gpus("4091")
