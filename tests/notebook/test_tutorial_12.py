"""Tutorial 12 (serving capacity): what it shows about vLLM's start-up budget is true.

The notebook runs once (``nbrun.execute``). Its figures are checked against computations that do not go through
fakeviz, from the published configs of Llama-3.1-8B (32 layers, 8 KV heads of 128, 8.03B parameters) and
Gemma-2-9B (42 layers alternating 4,096-token windows and full attention), and vLLM's arithmetic
(``vllm/v1/kv_cache_interface.py``, ``vllm/v1/core/kv_cache_utils.py``):

* one block of 16 tokens is ``2 x 32 x 8 x 128 x 16 x 2`` bytes = 2 MiB; an 8,192-token request needs 512; an fp8
  KV cache halves the block, so it holds twice the blocks (or one more);
* the weights are 8,030,261,248 bf16 parameters plus rotary's two float32 tables of 64;
* a sliding layer budgets ``cdiv(min(window - 1 + step, max_model_len), 16) + 1`` blocks: at a step of 8,192 that is
  513 (no saving), at 2,048 it is 385;
* ``gpu_memory_utilization`` moves the KV cache by ``utilization x 81,559 MiB`` (the weights and the profile peak
  stay); vLLM's error names 16 GiB for one 131,072-token request and the longest context in whole blocks;
* every claim of the prose against the outputs; the stored notebook's outputs equal this re-execution's.
"""

from __future__ import annotations

import math
import re

import nbformat
import pytest
from nbrun import NB_DIR, cell, execute, plain

NB = "12_serving_capacity.ipynb"
GiB = 2**30
MiB = 2**20
CAPACITY = 81559 * MiB  # H100 80GB HBM3 as its driver reports it
N_PARAMS = 8_030_261_248  # Llama-3.1-8B
PER_BLOCK = 2 * 32 * 8 * 128 * 16 * 2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def _table(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


def _num(pattern: str, s: str) -> float:
    m = re.search(pattern, s)
    assert m, f"{pattern!r} not in:\n{s[:3000]}"
    return float(m.group(1).replace(",", ""))


def test_budget_by_hand(nb) -> None:
    out = plain(cell(nb, "base = fv.serve("))
    weights = N_PARAMS * 2 + 2 * 64 * 4
    assert _num(r"weights GiB\s+([\d.]+)", out) == round(weights / GiB, 2)
    blocks = int(_num(r"KV blocks\s+(\d+)", out))
    kv = _num(r"KV cache GiB\s+([\d.]+)", out)
    assert blocks == int(kv * GiB // PER_BLOCK) or abs(blocks - kv * GiB / PER_BLOCK) < 0.01 * GiB / PER_BLOCK
    assert _num(r"KV tokens\s+(\d+)", out) == blocks * 16
    assert _num(r"8k requests at once\s+([\d.]+)", out) == round(blocks / 512, 2)
    # requested - weights - peak = KV cache: the profile peak printed is what closes the budget
    peak = _num(r"profile peak GiB\s+([\d.]+)", out)
    assert abs(math.ceil(CAPACITY * 0.9) / GiB - weights / GiB - peak - kv) < 0.011
    hand = plain(cell(nb, "per_block = "))
    assert f"KV bytes per block: {PER_BLOCK:,} by hand, {PER_BLOCK:,} from fv.serve" in hand
    assert f"blocks: {blocks:,} by hand, {blocks:,} from fv.serve" in hand


def test_profile_run_peak_is_the_sampler(nb) -> None:
    out = plain(cell(nb, "peak = base.trace.peak()"))
    assert "(the sampler)" in out and "profile run shape: 1024 x 8" in out
    assert f"{1024 * 128256 * 4 / GiB:.2f} GiB" in out
    # float32 logits, probabilities and exponential draws of 1,024 requests are alive together
    assert _num(r"the peak over the weights: ([\d.]+) GiB", out) >= round(3 * 1024 * 128256 * 4 / GiB, 2)


def test_quantized_weights_and_fp8_kv(nb) -> None:
    rows = {" ".join(r[:-6]): [float(x) for x in r[-6:]] for r in _table(plain(cell(nb, 'rows = {"bf16"')))[1:]}
    bf16, int8, nf4, kv8 = rows["bf16"], rows["int8 weights"], rows["nf4 weights"], rows["bf16, fp8 KV cache"]
    assert bf16[0] - int8[0] == pytest.approx(6.5, abs=0.02) and bf16[0] - nf4[0] == pytest.approx(9.35, abs=0.02)
    assert round(int8[5]) == 62 and round(nf4[5]) == 64 and round(bf16[5]) == 55  # the prose: 55 -> 62 and 64
    assert kv8[3] in (2 * bf16[3], 2 * bf16[3] + 1)  # half-size blocks in the same bytes
    assert kv8[5] == pytest.approx(2 * bf16[5], abs=0.02)
    for r in (bf16, int8, nf4):  # blocks = KV cache bytes over 2 MiB; the KV tokens 16 a block
        assert abs(r[3] - r[2] * GiB / PER_BLOCK) < 0.006 * GiB / PER_BLOCK and r[4] == 16 * r[3]


def test_sliding_windows_by_hand(nb) -> None:
    out = plain(cell(nb, "gemma = fv.models.config"))
    lines = [line.split() for line in out.strip().splitlines()[2:]]
    # rows: (8192, hybrid), (full), (2048, hybrid), (full); the last four fields are the figures
    got = [[float(x) for x in line[-4:]] for line in lines]
    full_blocks = 8192 // 16
    for step, hybrid, full in ((8192, got[0], got[1]), (2048, got[2], got[3])):
        sliding = math.ceil(min(4096 - 1 + step, 8192) / 16) + 1
        assert hybrid[:3] == [2, 2 * full[1], full_blocks + sliding]  # two groups of 21 layers: half-size blocks
        assert full[:3] == [1, full[1], full_blocks]
        assert hybrid[3] == round(hybrid[1] / (full_blocks + sliding), 2)
    assert got[0][2] == 1025 and got[2][2] == 897  # the prose: 513 at 8,192, 385 at 2,048
    assert got[2][3] / got[3][3] == pytest.approx(1.14, abs=0.01)  # "about 14 % more"
    assert abs(got[0][3] - got[1][3]) < 0.05  # "the two layouts serve the same"


def test_utilization_and_vllms_error(nb) -> None:
    rows = {float(r[0]): [float(x) for x in r[1:]] for r in _table(plain(cell(nb, "rows = {}\nfor util")))[2:]}
    for u in (0.95, 0.7, 0.5, 0.3):  # the KV cache moves by the utilization's share of the GPU, nothing else
        delta = (math.ceil(CAPACITY * 0.9) - math.ceil(CAPACITY * u)) / GiB
        assert rows[0.9][0] - rows[u][0] == pytest.approx(delta, abs=0.011)
        assert rows[u][2] == round(rows[u][1] / 512, 2)
    assert rows[0.3][3] == rows[0.3][1] * 16  # the longest context: whole blocks
    err = plain(cell(nb, 's = fv.serve(NAME, gpus="1xH100", max_model_len=131072'))
    assert "fits: False" in err
    assert f"({131072 // 16 * PER_BLOCK / GiB:.2f} GiB KV cache is needed" in err  # 16.00 GiB
    assert f"estimated maximum model length is {int(rows[0.3][3])}." in err
    refused = plain(cell(nb, "try:\n    fv.serve(NAME"))
    assert refused.startswith("ArgumentError: max_model_len=200000") and "131,072" in refused


def test_assumptions_are_listed(nb) -> None:
    out = plain(cell(nb, "for row in base.trace.fidelity()"))
    for op in ("vllm profile run", "vllm non-torch memory", "vllm cuda graphs", "vllm sampler"):
        assert f"- {op}: " in out


def test_stored_outputs_are_this_execution(nb) -> None:
    stored = nbformat.read(NB_DIR / NB, as_version=4)
    ran = [c for c in nb.cells if c.cell_type == "code"]
    kept = [c for c in stored.cells if c.cell_type == "code"]
    assert len(ran) == len(kept)
    for a, b in zip(ran[1:], kept[1:]):
        assert plain(a) == plain(b), a.source[:80]
