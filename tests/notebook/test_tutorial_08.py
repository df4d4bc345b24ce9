"""Tutorial 08 (many GPUs): what it shows about FSDP2 and tensor parallel per rank is true.

The hand computations use the models' shapes from transformers alone (GPT-2's ``GPT2Config`` with 2 layers, built on
the meta device; Llama-3.2-1B's published widths), never fakeviz's record:

* FSDP2 over 8 ranks: each rank owns ``min(ceil(rows / 8), rows - rank * ceil(rows / 8))`` rows of every parameter
  and its storage holds ``ceil(rows / 8)`` (padded); the Parameter bytes after init are the padded shards, AdamW's
  state two copies of the *owned* rows, the single GPU's eight times as much; the collectives' bytes follow from
  each FSDP group's padded shard; rank 7 (the short embedding shard) is the only rank in its class;
* tensor parallel: colwise weights keep half their rows, rowwise half their columns, FSDP x TP a quarter; the
  forward all-reduces are batch x seq x hidden x 2 bytes, the init scatters half of the parallelized weights;
* the ``optimizer.step()`` failure of a TP-only step is real torch behaviour: a real (gloo, CPU) DTensor and a
  plain tensor in one foreach AdamW raise the same error, and AdamW picks foreach for DTensors on cuda.
"""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch
from nbrun import cell, execute, plain

NB = "08_many_gpus.ipynb"
WORLD, BATCH, SEQ, LAYERS = 8, 4, 512, 2  # the notebook's runs
MIB = 2**20

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def num(s: str) -> int:
    return int(float(s.replace(",", "")))


@pytest.fixture(scope="module")
def gpt2():
    """GPT-2 small's widths with 2 blocks, as transformers defines it (meta device: shapes only)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        return GPT2LMHeadModel(GPT2Config(n_layer=LAYERS))


def padded(params, world: int = WORLD) -> int:
    return sum(math.ceil(p.shape[0] / world) * math.prod(p.shape[1:]) * p.element_size() for p in params)


def owned_rows(rows: int, rank: int, world: int = WORLD) -> int:
    chunk = math.ceil(rows / world)
    return max(0, min(chunk, rows - rank * chunk))


def owned(params, rank: int) -> int:
    return sum(owned_rows(p.shape[0], rank) * math.prod(p.shape[1:]) * p.element_size() for p in params)


def root_params(model) -> list:
    return [p for n, p in model.named_parameters() if not n.startswith("transformer.h.")]


# ---------------------------------------------------------------------------------------------- FSDP2
def test_every_rank_holds_padded_chunks(nb, gpt2) -> None:
    out = plain(cell(nb, 'wte, c_fc = "transformer.wte.weight"'))
    rows = re.findall(r"^\s*\d+\s+(\d)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", out, re.M)
    assert [int(r[0]) for r in rows] == list(range(WORLD)), out
    wte, c_fc = gpt2.transformer.wte.weight, gpt2.transformer.h[0].mlp.c_fc.weight
    for rank, wte_rows, wte_bytes, fc_rows, fc_bytes in (map(int, r) for r in rows):
        assert wte_rows == owned_rows(wte.shape[0], rank), rank
        assert wte_bytes == padded([wte]), rank  # every rank's storage: ceil(50257 / 8) rows
        assert fc_rows == owned_rows(c_fc.shape[0], rank) and fc_bytes == padded([c_fc]), rank
    assert [int(r[1]) for r in rows] == [6283] * 7 + [6276]  # 50,257 = 7 x 6,283 + 6,276


def test_sharded_parameters_and_optimizer_state(nb, gpt2) -> None:
    params = list(gpt2.parameters())
    out = plain(cell(nb, 'reference = models.build("gpt2"'))
    assert f"padded shards by hand: {padded(params):,} bytes per rank" in out
    for rank in (0, 7):
        m = re.search(rf"rank {rank}: Parameter after init ([\d,]+) bytes, AdamW state after the step ([\d,]+) bytes",
                      out)  # fmt: skip
        assert m, out
        assert num(m[1]) == padded(params)
        assert num(m[2]) == 2 * owned(params, rank)  # exp_avg and exp_avg_sq of the owned rows
    assert owned(params, 0) - owned(params, 7) == 7 * 768 * 4  # rank 7 owns 7 fewer embedding rows

    table = plain(cell(nb, 'with fv.record(device="cuda:0", gpu="H100") as single'))
    rows = {r[0]: tuple(map(int, r[1:])) for r in re.findall(r"^(\w[\w ]*?)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", table, re.M)}
    total = sum(p.numel() * p.element_size() for p in params)
    assert rows["Parameter"] == (total, padded(params), padded(params))
    assert rows["Gradient"] == (total, padded(params), padded(params))  # reduce-scattered into padded shards
    assert rows["Optimizer state"] == (2 * total, 2 * owned(params, 0), 2 * owned(params, 7))


def test_weights_at_the_peak_are_the_shards_and_the_gathered_root(nb, gpt2) -> None:
    out = plain(cell(nb, "def in_mib(peaks)"))
    rows = re.findall(r"^\s*\d+\s+(\d)\s+cuda:(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(True|False)"
                      r"\s+(\d)\s*$", out, re.M)  # fmt: skip
    assert len(rows) == WORLD, out
    gathered_root = WORLD * padded(root_params(gpt2))  # FSDP2 keeps the root's parameters gathered until backward
    for rank, device, weights, grads, opt, fits, _ in rows:
        assert rank == device and fits == "True"
        assert float(weights) == round((padded(list(gpt2.parameters())) + gathered_root) / MIB, 1)
        assert float(grads) == float(opt) == 0.0  # a first step: AdamW's state is made after the peak


def test_rank_classes(nb, gpt2) -> None:
    out = plain(cell(nb, "sim.classes"))
    rows = re.findall(r"^\s*\d+\s+(\d)\s+(\S+)\s+(\d+)\s", out, re.M)
    # the ranks whose owned shapes are all the same are one class: here, all but the one with the short shard
    shapes: dict[tuple, list[int]] = {}
    for rank in range(WORLD):
        key = tuple(owned_rows(p.shape[0], rank) for p in gpt2.parameters())
        shapes.setdefault(key, []).append(rank)
    assert sorted(shapes.values()) == [[0, 1, 2, 3, 4, 5, 6], [7]]
    assert [(r[1], int(r[2])) for r in rows] == [("0-6", 7), ("7", 1)], out


def test_collectives_bytes_follow_from_the_shards(nb, gpt2) -> None:
    out = plain(cell(nb, "col = sim.collectives(0)"))
    rows = re.findall(r"^\s*\d+\s+\d+\s+(all_gather|reduce_scatter)\s+(forward|backward)\s+(\S+)\s+(\d+)\s+(\S+)"
                      r"\s+(\d+)\s+(\d+)\s+([\d.]+)\s*$", out, re.M)  # fmt: skip
    assert rows, out
    block = padded(gpt2.transformer.h[0].parameters())
    root = padded(root_params(gpt2))
    forward = [r for r in rows if r[0] == "all_gather" and r[1] == "forward"]
    assert [(r[2], num(r[5])) for r in forward] == [
        ("FSDPGPT2LMHeadModel", root),
        *[(f"FSDPGPT2LMHeadModel.transformer.h.{i}", block) for i in range(LAYERS)],
    ]
    for kind, _, _, size, ranks, bytes_in, bytes_out, sent in rows:
        assert int(size) == WORLD and ranks == f"0-{WORLD - 1}"
        shard = num(bytes_in) if kind == "all_gather" else num(bytes_out)
        full = num(bytes_out) if kind == "all_gather" else num(bytes_in)
        assert shard in (block, root) and full == WORLD * shard
        assert num(sent) == (WORLD - 1) * shard  # ring: n - 1 chunks over each link
    scatters = sorted(num(r[6]) for r in rows if r[0] == "reduce_scatter")
    assert scatters == sorted([block] * LAYERS + [root])  # every group's gradients, once
    total = re.search(r"per step, rank 0 sends ([\d,]+) bytes", plain(cell(nb, "groups = {")))
    assert total and num(total[1]) == sum(num(r[7]) for r in rows)


# ------------------------------------------------------------------------------------- tensor parallel
COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def llama_shapes() -> dict[str, tuple[int, int]]:
    """Llama-3.2-1B's parallelized weights of one layer, (out, in), from its published widths."""
    h, i, kv = 2048, 8192, 8 * 64  # hidden, MLP, key/value heads x head_dim
    return {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}  # fmt: skip


def tp_half(name: str, shape: tuple[int, int], tp: int = 2) -> tuple[int, int]:
    out, inp = shape
    return (out // tp, inp) if name.endswith(COLWISE) else (out, inp // tp)


def test_published_widths(nb) -> None:
    from fakeviz import models

    cfg = models.config("meta-llama/Llama-3.2-1B")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * cfg.head_dim) == (2048, 8192, 512)


def shape_table(text: str) -> dict[str, list[tuple[int, ...]]]:
    rows = re.findall(r"^model\.layers\.0\.(\S+)\.weight\s+(.*)$", text, re.M)
    return {
        name: [tuple(map(int, s.split(","))) for s in re.findall(r"\(([\d, ]+)\)", shapes)] for name, shapes in rows
    }


def test_tensor_parallel_halves_the_weights(nb) -> None:
    table = shape_table(plain(cell(nb, 'reference_tp = models.build("meta-llama/Llama-3.2-1B"')))
    assert set(table) == set(llama_shapes())
    for name, shape in llama_shapes().items():
        full, rank0, rank1 = table[name]
        assert full == shape and rank0 == rank1 == tp_half(name, shape), name


def test_fsdp_on_top_of_tp_quarters_them(nb) -> None:
    table = shape_table(plain(cell(nb, "def fsdp_tp_step")))
    for name, shape in llama_shapes().items():
        full, tp_only, both = table[name]
        half = tp_half(name, shape)
        assert (full, tp_only) == (shape, half), name
        assert both == (math.ceil(half[0] / 2), half[1]), name  # FSDP splits the TP slice's rows over dp=2


def test_tensor_parallel_collectives(nb) -> None:
    out = plain(cell(nb, "tcol = tp.collectives(0)"))
    rows = {(k, p): tuple(map(int, v)) for k, p, *v in
            re.findall(r"^(all_reduce|scatter)?\s*(forward|backward|init)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", out, re.M)}  # fmt: skip
    rows = {("scatter" if p == "init" else "all_reduce", p): v for (k, p), v in rows.items()}
    hidden = BATCH * SEQ * 2048 * 2  # RowwiseParallel's partial sums: bf16 hidden states
    assert rows[("all_reduce", "forward")] == (2 * LAYERS, 2 * LAYERS * hidden, hidden)  # o_proj, down_proj
    assert rows[("all_reduce", "backward")] == (5 * LAYERS, 5 * LAYERS * hidden, hidden)  # q, k, v, gate, up
    halves = sum(math.prod(tp_half(n, s)) * 2 for n, s in llama_shapes().items())
    assert rows[("scatter", "init")][:2] == (7 * LAYERS, LAYERS * halves)  # each rank's slice of every weight

    groups = plain(cell(nb, "dcol = twod.collectives(0)"))
    found = re.findall(r"^(all_gather|all_reduce|reduce_scatter|scatter)\s+(\S+)\s+\d+\s+\d+\s*$", groups, re.M)
    assert dict(found) == {"all_gather": "0,2", "reduce_scatter": "0,2", "all_reduce": "0-1", "scatter": "0-1"}


def test_tp_only_optimizer_failure_is_real_torch_behaviour(nb) -> None:
    out = plain(cell(nb, "try:\n    fv.simulate(tp_step"))
    assert out.startswith("rank 0: ") and "got mixed torch.Tensor and DTensor" in out, out
    m = re.search(r"rank 0 recorded ([\d,]+) ops before it failed", out)
    assert m and num(m[1]) > 500  # the build, forward and backward ran first
    assert "fits: True" in plain(cell(nb, "def tp_step(rank, mesh):\n    train(rank, build_parallel(mesh), foreach"))

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from torch.optim import optimizer as optim_module
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    # AdamW's default on a GPU: foreach, DTensors included
    assert DTensor in optim_module._foreach_supported_types and "cuda" in _get_foreach_kernels_supported_devices()
    # real tensors, a real (gloo) process group: a DTensor and a plain parameter in one foreach AdamW
    hook = sys.excepthook
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        lin, other = torch.nn.Linear(4, 4), torch.nn.Parameter(torch.zeros(3))
        parallelize_module(lin, init_device_mesh("cpu", (1,)), ColwiseParallel())
        params = [*lin.parameters(), other]
        for p in params:
            p.grad = torch.zeros_like(p)
        with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
            torch.optim.AdamW(params, foreach=True).step()
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook
