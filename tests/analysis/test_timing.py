"""The time model (fakeviz._analysis.timing) against hand formulas, and its inputs against what a real H100 ran.

Hand formulas: a large bf16 GEMM is compute bound at peak times its achieved fraction; a large elementwise op is
bandwidth bound; views cost nothing; a misaligned GEMM and a causal mask scale as their tables say; a step is the
critical path of the host issuing ops and the GPU running them; a ring all-reduce of B bytes over N ranks sends
2(N-1)/N B and overlaps with compute until something reads its output.

Fixtures: ``tests/fixtures/h100_time*.json.gz`` (``benchmarks/gpu_time.py`` on an H100): the model's constants
are the ones ``benchmarks/fit_time.py`` derives from them, and a fake record of a measured step has the measured
step's GEMMs and attention ops with the same FLOPs and bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fakeviz as fv
from fakeviz._analysis import timing
from fakeviz._core.gpu_specs import gpu_spec

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import fit_time  # noqa: E402 - the benchmark's own derivation
import gpu_time  # noqa: E402 - the benchmark's own cases

H100 = gpu_spec("H100")
GAP = timing.KERNEL_GAP_S


def _one(trace: fv.Trace, name: str) -> dict:
    df = trace.time("H100")
    rows = df[df["op"].astype(str) == name]
    assert len(rows) == 1, rows
    return rows.iloc[0].to_dict()


def test_large_bf16_gemm_is_compute_bound_at_its_fraction_of_peak():
    with fv.record(device="cuda:0") as trace:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        a @ a
    row = _one(trace, "aten.mm.default")
    flops = 2 * 8192**3
    want = flops / (989.4e12 * timing.ACHIEVED["gemm"].compute) + timing.ACHIEVED["gemm"].launch_s + GAP
    assert row["flops"] == flops and row["bound"] == "compute"
    assert row["est_s"] == pytest.approx(want, rel=1e-9)
    # the H100 measured 1395 us for this product (tests/fixtures/h100_time.json.gz): within 2 %
    assert row["est_s"] == pytest.approx(1395e-6, rel=0.02)


def test_large_elementwise_is_bandwidth_bound_and_views_cost_nothing():
    n = 1 << 26
    with fv.record(device="cuda:0") as trace:
        x = torch.randn(n, device="cuda")
        y = x + x
        y.view(-1, 1024).t()
    add = _one(trace, "aten.add.Tensor")
    assert add["bytes"] == 3 * 4 * n and add["bound"] == "memory"
    want = 3 * 4 * n / (3.35e12 * timing.ACHIEVED["elementwise"].memory) + timing.ACHIEVED["elementwise"].launch_s
    assert add["est_s"] == pytest.approx(want + GAP, rel=1e-9)
    for view in ("aten.view.default", "aten.t.default"):
        assert _one(trace, view)["est_s"] == 0 and _one(trace, view)["bound"] == "none"


@pytest.mark.parametrize(
    ("m", "n", "k", "align"),
    [(8192, 50304, 1024, 16), (8192, 50257, 1024, 2), (8192, 1024, 50257, 2), (50257, 1024, 8192, 16),
     (4096, 4100, 4096, 8), (2048, 2730, 4096, 4)],
)  # fmt: skip
def test_gemm_alignment_is_the_leading_dimensions(m: int, n: int, k: int, align: int):
    """A row count of a non-transposed operand does not matter; N and K (the leading dimensions) do (H100: 50257
    columns ran at 129 TFLOP/s, 50304 at 721, 50257 rows at 799)."""
    with fv.record(device="cuda:0") as trace:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        a @ b
    f = timing.features(trace)
    seq = f.names.index("aten.mm.default")
    assert f.align[seq] == align
    row = _one(trace, "aten.mm.default")
    frac = timing.ACHIEVED["gemm"].compute * timing.MISALIGNED.get(align, 1.0)
    want = max(2 * m * n * k / (989.4e12 * frac), row["bytes"] / (3.35e12 * timing.ACHIEVED["gemm"].memory))
    assert row["est_s"] == pytest.approx(want + timing.ACHIEVED["gemm"].launch_s + GAP, rel=1e-9)


def test_transposed_operand_takes_its_rows_as_leading_dimension():
    with fv.record(device="cuda:0") as trace:
        a = torch.randn(8192, 50257, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
        a.t() @ b  # [50257, 8192] with strides [1, 50257]: the H100 ran this at 148 TFLOP/s
    f = timing.features(trace)
    assert f.align[f.names.index("aten.mm.default")] == 2


def test_a_bitsandbytes_4bit_matmul_is_a_gemm_on_its_dequantized_weight():
    """gemm_4bit multiplies a dequantized copy of its packed [n/2, 1] uint8 weight: a GEMM at its FLOPs, aligned as
    that copy is, and counted in the matrix FLOPs MFU reads (it was priced as an elementwise op by bytes)."""
    bnb = pytest.importorskip("bitsandbytes")
    with fv.record(device="cuda:0") as trace:
        layer = bnb.nn.Linear4bit(4096, 14336, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
        layer = layer.to("cuda")
        x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
        layer(x)
    assert timing.op_class("bitsandbytes.gemm_4bit.default") == "gemm"
    f = timing.features(trace)
    seq = f.names.index("bitsandbytes.gemm_4bit.default")
    assert f.align[seq] == 16
    row = _one(trace, "bitsandbytes.gemm_4bit.default")
    assert row["cls"] == "gemm" and row["flops"] == 2 * 2048 * 4096 * 14336
    assert row["bound"] == "compute"


def test_causal_attention_takes_its_measured_share_of_the_unmasked_time():
    def run(causal: bool) -> fv.Trace:
        with fv.record(device="cuda:0", gpu="H100") as trace:
            q = torch.randn(1, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
            F.scaled_dot_product_attention(q, q, q, is_causal=causal)
        return trace

    times = {}
    for causal in (True, False):
        trace = run(causal)
        f = timing.features(trace)
        seq = next(i for i, n in enumerate(f.names) if "attention" in n)
        assert "cudnn" in f.names[seq] and f.causal[seq] == causal
        times[causal] = trace.time("H100")["est_s"].iat[seq] - timing.ACHIEVED["attention"].launch_s - GAP
    assert times[True] / times[False] == pytest.approx(timing.ATTENTION_CAUSAL_TIME, rel=1e-9)
    flops = 4 * 32 * 4096 * 4096 * 128
    assert times[False] == pytest.approx(flops / (989.4e12 * timing.ATTENTION["cudnn"][0]), rel=1e-9)


def _features(cls: list[str], est: list[float], host: float) -> tuple[timing.OpFeatures, np.ndarray, np.ndarray]:
    n = len(cls)
    f = timing.OpFeatures(
        names=[f"aten.op{i}.default" for i in range(n)], cls=np.array([timing.CLASSES.index(c) for c in cls], np.int8),
        flops=np.zeros(n, np.int64), bytes_in=np.zeros(n, np.int64), bytes_out=np.zeros(n, np.int64), dtype=[""] * n,
    )  # fmt: skip
    f.waits_on = np.full(n, -1, np.int64)
    return f, np.array(est), np.full(n, host)


def test_a_step_is_the_critical_path_of_host_and_gpu():
    # GPU bound: the host runs ahead, the GPU runs back to back
    f, est, host = _features(["gemm"] * 4, [1e-3] * 4, 10e-6)
    step, end, _ = timing.critical_path(f, est, host, np.zeros(4))
    assert step == pytest.approx(10e-6 + 4e-3) and end[-1] == pytest.approx(step)
    # host bound: tiny kernels wait for the host to issue them
    f, est, host = _features(["elementwise"] * 100, [2e-6] * 100, 20e-6)
    step, _, _ = timing.critical_path(f, est, host, np.zeros(100))
    assert step == pytest.approx(100 * 20e-6 + 2e-6)
    # a sync (.item()) makes the host wait for the GPU: the ops after it cannot be issued early
    f, est, host = _features(["gemm", "sync", "gemm"], [1e-3, 5e-6, 1e-3], 10e-6)
    step, _, _ = timing.critical_path(f, est, host, np.zeros(3))
    assert step == pytest.approx(10e-6 + 1e-3 + 5e-6 + 10e-6 + 1e-3)


def test_ring_all_reduce_time_and_overlap_with_compute():
    b, n = 1 << 30, 8
    f, est, host = _features(["gemm", "collective", "gemm", "gemm", "elementwise"], [2e-3, 0, 2e-3, 2e-3, 1e-5], 0)
    f.coll_kind = ["", "all_reduce", "", "", ""]
    f.coll_ranks = np.array([1.0, n, 1, 1, 1])
    f.coll_wire = np.array([0, 2 * (n - 1) / n * b, 0, 0, 0])
    coll = timing.collective_seconds(f, H100)
    alpha = timing.COLLECTIVE_ALPHA_S["intra"] * 2 * (n - 1)
    want = alpha + 2 * (n - 1) / n * b / (H100.nvlink_bytes_per_s * timing.COLLECTIVE_BUS_FRACTION["intra"])
    assert coll[1] == pytest.approx(want)
    # nothing reads its output until op 4: it runs under ops 2 and 3, exposed only past them
    f.waits_on = np.array([-1, -1, -1, -1, 1])
    step, end, exposed = timing.critical_path(f, est, host, coll)
    assert end[1] == pytest.approx(2e-3 + want)
    assert exposed == pytest.approx(max(0.0, 2e-3 + want - 6e-3))
    assert step == pytest.approx(max(6e-3, 2e-3 + want) + 1e-5)
    # across nodes the network's bandwidth is used
    f.coll_ranks[1] = 16
    f.coll_wire[1] = 2 * 15 / 16 * b
    inter = timing.collective_seconds(f, H100, gpus_per_node=8, network_bytes_per_s=50e9)[1]
    assert inter == pytest.approx(timing.COLLECTIVE_ALPHA_S["inter"] * 30 + 2 * 15 / 16 * b / (50e9 * 0.8))


def test_the_constants_are_what_fit_time_derives_from_the_h100_fixtures():
    mis, att, causal = fit_time.derive_kernel_tables(fit_time.load(fit_time.EXTRA))
    assert mis == timing.MISALIGNED
    assert att == timing.ATTENTION
    assert causal == timing.ATTENTION_CAUSAL_TIME
    data = fit_time.load(fit_time.FIXTURE)
    rows = [r for r in data["steps"] if "error" not in r and not r.get("holdout")]
    gaps = [(r["median_s"] - r["busy_us"] * 1e-6) / sum(1 for o in r["op_rows"] if o["kernels"])
            for r in rows if r["busy_us"] * 1e-6 >= 0.5 * r["median_s"]]  # fmt: skip
    assert round(float(np.median(gaps)), 6) == pytest.approx(timing.KERNEL_GAP_S, abs=1e-6)


def test_a_fake_record_of_a_measured_step_has_its_gemms_and_attention():
    """The model's inputs from a fake record on this machine equal what the H100's real step dispatched, for the
    ops that carry the step's time (GEMMs and attention: FLOPs, bytes, alignment)."""
    row = next(r for r in fit_time.load(fit_time.FIXTURE)["steps"] if r["case"] == "llama8b_2l")
    session = fv.FakeSession()
    with fv.record(session=session, device="cuda:0"):
        case = gpu_time._hf_case("llama8b_2l", "cuda:0")
    with fv.record(session=session, device="cuda:0") as trace:
        case.step()
    f = timing.features(trace)
    measured, _ = fit_time.step_features(row)
    heavy = {timing.CLASSES.index(c) for c in ("gemm", "attention", "attention_backward")}

    def rows(x: timing.OpFeatures) -> list[tuple]:
        return [(x.names[i], int(x.flops[i]), int(x.bytes_in[i] + x.bytes_out[i]), int(x.align[i]))
                for i in range(len(x)) if x.cls[i] in heavy and x.flops[i] > 1e9]  # fmt: skip

    assert rows(f) == rows(measured)
    step = trace.step_time("H100")
    assert step.flops == pytest.approx(sum(max(o["flops"], 0) for o in row["op_rows"]), rel=0.01)
