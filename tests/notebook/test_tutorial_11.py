"""Tutorial 11 (pipeline, context and expert parallel): what it shows per rank is true.

The notebook runs once (``nbrun.execute``). Its figures are checked against computations from the models' published
widths, not from fakeviz's record:

* context parallel over 4 ranks at 32,768 tokens: each rank's hidden states are ``[1, 8192, 4096]`` bf16 (64 MiB);
  one attention's forward all-gather sends the local K and V, ``2 x 8 kv heads x 8192 x 128 x 2`` bytes, and gets 4x
  back; the backward's K/V gradients travel as float32, once per ring step (4); the weights are FSDP-sharded the
  same as ``dp_shard=4``; the activations shrink about 4x; four classes (the ring's work differs by cp rank);
* expert parallel over 8 ranks on Qwen3-30B-A3B (128 experts, top-8, hidden 2,048): the dispatch all-to-all moves
  ``4096 x 8 x 2048 x 2`` bytes each way, the count exchange ``128 x 8`` bytes; the routing assumption is stated;
  one rank recorded, seven standing in;
* pipeline parallel: the stages' weights are the embedding and one layer, two layers, two layers, one layer and the
  head (plus the two rotary tables of 64 float32), Llama-3.1-8B's layer being 218,112,000 parameters;
* the stored notebook's outputs equal this re-execution's (on the pinned torch).
"""

from __future__ import annotations

import re

import nbformat
import pytest
from nbrun import NB_DIR, ROOT, cell, code_cells, execute, plain

NB = "11_pipeline_expert_parallel.ipynb"
GiB, MiB = 2**30, 2**20
H, KV, HEAD_DIM, VOCAB, INTER = 4096, 8, 128, 128256, 14336  # Llama-3.1-8B
LAYER = 2 * H * H + 2 * KV * HEAD_DIM * H + 3 * H * INTER + 2 * H  # q, o, k, v, gate/up/down, two norms
ROTARY = 2 * 64 * 4  # inv_freq and original_inv_freq, float32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()[1:]]


def _pairs(out: str) -> dict[str, tuple[float, float]]:
    """A printed two-column DataFrame (``name  a  b`` lines) as name -> (a, b)."""
    rows = [r for r in map(str.split, out.splitlines()) if len(r) == 3 and re.fullmatch(r"[\d.]+", r[1])]
    return {r[0]: (float(r[1]), float(r[2])) for r in rows}


def test_context_parallel_by_hand(nb) -> None:
    assert LAYER == 218_112_000
    out = plain(cell(nb, "ops = cp4.trace(0).ops"))
    assert "embedding output on rank 0: [1, 8192, 4096], 64 MiB" in out and 1 * 8192 * H * 2 == 64 * MiB
    kv = 2 * KV * (32768 // 4) * HEAD_DIM  # K and V of rank 0's shard, elements
    rows = _rows(plain(cell(nb, "coll = cp4.collectives(0)")))
    got = [(r[1], r[2], int(r[3]), int(r[4]), int(r[5])) for r in rows]
    assert got == [("all_gather", "forward", 4, kv * 2, 4 * kv * 2), ("all_gather", "backward", 4, kv * 2, 4 * kv * 2)]\
        + [("all_to_all", "backward", 4, kv * 4, kv * 4)] * 4  # fmt: skip
    table = _pairs(plain(cell(nb, "dense = fv.models.config(")))
    assert table["weights"][0] == table["weights"][1] and table["optimizer"][0] == table["optimizer"][1]
    assert 3.5 < table["activations"][0] / table["activations"][1] <= 4.0
    assert table["peak"][1] < table["peak"][0] / 3
    classes = _rows(plain(cell(nb, "cp4.classes")))
    assert [r[2] for r in classes] == ["0", "1", "2", "3"] and all(r[3] == "1" for r in classes)


def test_expert_parallel_by_hand(nb) -> None:
    tokens, top_k, hidden, experts = 4096, 8, 2048, 128
    out = plain(cell(nb, "moe = fv.models.config("))
    assert "1 of 8 ranks recorded (7 more found identical to one of them), 1 class" in out
    rows = _rows(plain(cell(nb, "coll = ep8.collectives(0)")))
    got = [(r[1], r[2], int(r[3]), int(r[4]), int(r[5])) for r in rows]
    move = tokens * top_k * hidden * 2
    assert got == [("c10d.alltoall_base_.default", "all_to_all", 8, experts * 8, experts * 8),
                   ("_c10d_functional.all_to_all_single.default", "all_to_all", 8, move, move),
                   ("_c10d_functional.all_to_all_single.default", "all_to_all", 8, move, move)]  # fmt: skip
    traffic = _pairs(plain(cell(nb, "pd.DataFrame({name: s.collectives")))
    assert traffic["all_to_all"][0] == 0 and traffic["all_gather"][1] < traffic["all_gather"][0]
    said = plain(cell(nb, 'for op, text in ep8.trace(0).fidelity()["assumptions"]'))
    assert "assumed balanced, token t takes experts (t*8 + j) mod 128: each 256 of 4096 tokens per expert" in said
    assert "receives from each of the 8 ranks of its ep group what it sends" in said


def test_pipeline_stage_weights_by_hand(nb) -> None:
    out = plain(cell(nb, "deep = fv.models.config("))
    rows = {int(r[0]): float(r[1]) for r in map(str.split, out.splitlines()) if len(r) == 7 and r[0].isdigit()}
    embed = VOCAB * H
    hand = {0: embed + LAYER, 1: 2 * LAYER, 2: 2 * LAYER, 3: LAYER + H + embed}
    for rank, params in hand.items():
        assert rows[rank] == round((params * 2 + ROTARY) / GiB, 2), rank


def test_stored_outputs_equal_a_reexecution(nb) -> None:
    import torch

    pinned = re.search(r"^torch==([\d.]+)", (ROOT / "binder" / "requirements.txt").read_text(), re.M).group(1)
    if torch.__version__.split("+")[0] != pinned:  # scripts/test_torch.sh runs this file on another torch
        pytest.skip(f"the stored outputs are made with the pinned torch {pinned} (binder/requirements.txt)")
    stored = nbformat.read(NB_DIR / NB, as_version=4)
    ran, kept = code_cells(nb)[1:], code_cells(stored)[1:]
    assert [c.source for c in ran] == [c.source for c in kept]
    for new, old in zip(ran, kept):
        assert plain(new) == plain(old), f"the stored output differs from a re-execution:\n{new.source}"
