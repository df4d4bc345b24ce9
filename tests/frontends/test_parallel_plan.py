"""``fv.plan(..., parallel={...})`` (issue 19): torchtitan's FSDP2 / HSDP / tensor-parallel recipe on a model given
by config, simulated per rank in torch's fake process group; ranks found identical recorded once."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig

import fakeviz as fv

pytest.importorskip("torch.distributed.fsdp")

# widths chosen so that 3-way sharding is uneven (1001 vocabulary rows, 200 MLP rows) and 2-way TP is even
CFG = dict(hidden_size=96, intermediate_size=200, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
           vocab_size=1001, max_position_embeddings=256, tie_word_embeddings=False)  # fmt: skip
BYTES = 4  # float32: the config's dtype


def _cfg() -> LlamaConfig:
    return LlamaConfig(**CFG)


def _shapes() -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        from transformers import LlamaForCausalLM

        return {n: tuple(p.shape) for n, p in LlamaForCausalLM(_cfg()).named_parameters()}


def _tp_split(name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """The model's own TP plan: q/k/v/gate/up by column (dim 0 of the weight), o/down by row (dim 1)."""
    leaf = name.split(".")[-2]
    if tp > 1 and leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        return (shape[0] // tp, *shape[1:])
    if tp > 1 and leaf in ("o_proj", "down_proj"):
        return (shape[0], shape[1] // tp)
    return shape


def _hand_bytes(dp: int, tp: int) -> int:
    """One rank's parameter bytes: the TP-local shape, then FSDP2's padded dim-0 shard (ceil rows) over dp."""
    total = 0
    for name, shape in _shapes().items():
        local = _tp_split(name, shape, tp)
        rows = math.ceil(local[0] / dp)
        total += rows * math.prod(local[1:]) * BYTES
    return total


def _param_bytes_before_forward(trace: object) -> int:
    mem = trace.memory(allocator=False)  # type: ignore[attr-defined]
    mem = mem[mem.device.astype(str).str.startswith("cuda")]
    first = mem.index[mem.phase == "forward"][0]
    return int(mem.loc[:first].Parameter.iloc[-2])


@pytest.mark.parametrize(("parallel", "dp", "tp"), [({"dp_shard": 3}, 3, 1), ({"tp": 2}, 1, 2),
                                                    ({"dp_shard": 3, "tp": 2}, 3, 2)])  # fmt: skip
def test_each_rank_holds_the_hand_computed_shard(parallel: dict[str, int], dp: int, tp: int) -> None:
    sim = fv.plan(_cfg(), gpus="H100", parallel=parallel, batch=2, seq=32, train=True, ranks="all")
    assert isinstance(sim, fv.Simulation) and sim.complete and sim.fits
    assert sim.world_size == dp * tp and sim.ranks == list(range(dp * tp)) and not sim.stand_ins
    hand = _hand_bytes(dp, tp)
    for r in sim.ranks:
        assert _param_bytes_before_forward(sim.trace(r)) == hand, r
    kinds = set(sim.collectives(0).kind)
    if dp > 1:
        assert {"all_gather", "reduce_scatter"} <= {k.split("_into")[0].replace("_tensor", "") for k in kinds}, kinds
    if tp > 1:
        assert any("all_reduce" in k for k in kinds), kinds


def test_auto_records_one_rank_per_layout_and_agrees_with_all() -> None:
    """The ranks "auto" leaves out are exactly those a full simulation finds identical to a recorded one."""
    kw = dict(gpus="6xH100", parallel={"dp_shard": 3, "tp": 2}, batch=1, seq=16, train=True)
    full = fv.plan(_cfg(), ranks="all", **kw)
    auto = fv.plan(_cfg(), **kw)
    assert full.complete and auto.complete and len(auto.ranks) < 6 and auto.covered == list(range(6))
    # the uneven vocabulary split (334, 334, 333 rows) puts the last dp rank's two TP ranks in a class of their own
    assert len(full.classes) == len(auto.classes) == 2
    for r in range(6):
        assert auto.class_of(r) == full.class_of(r), r
        if r in auto.stand_ins:
            assert full.class_of(auto.stand_ins[r]) == full.class_of(r)
    cols = ["rank", "device", "weights", "gradients", "optimizer", "activations", "peak", "fits", "class"]
    assert auto.peaks[cols].equals(full.peaks[cols])
    assert not auto.peaks.set_index("rank").loc[sorted(auto.stand_ins), "recorded"].any()
    assert "found identical" in auto.text and auto.trace(5) is auto.trace(auto.stand_ins.get(5, 5))


def test_hsdp_replicas_are_identical_and_inference_has_no_optimizer() -> None:
    sim = fv.plan(_cfg(), gpus="4xA100", parallel={"dp_replicate": 2, "dp_shard": 2}, batch=1, seq=16)
    assert sim.mesh_dim_names == ("dp_replicate", "dp_shard") and sim.mesh_shape == (2, 2)
    # a replica's ranks hold what the other replica's hold: only two layouts (uneven 1001 rows over 2)
    assert len(sim.ranks) == 2 and sim.stand_ins == {2: 0, 3: 1}
    peaks = sim.peaks.set_index("rank")
    assert (peaks.optimizer == 0).all() and (peaks.gradients == 0).all()
    assert _param_bytes_before_forward(sim.trace(0)) == _hand_bytes(2, 1)


def test_bad_parallel_arguments() -> None:
    with pytest.raises(ValueError, match="(?s)unknown axis 'sp'.*fakeviz.simulate"):
        fv.plan(_cfg(), gpus="8xH100", parallel={"sp": 2, "dp_shard": 4})
    with pytest.raises(ValueError, match="holds 4 GPUs, but parallel=.* makes 8 ranks"):
        fv.plan(_cfg(), gpus="4xH100", parallel={"dp_shard": 4, "tp": 2})
    with pytest.raises(ValueError, match="tp=3 does not divide num_key_value_heads=2"):
        fv.plan(_cfg(), gpus="H100", parallel={"tp": 3})
    with pytest.raises(ValueError, match="a module cannot be rebuilt"):
        fv.plan(torch.nn.Linear(2, 2), gpus="H100", parallel={"dp_shard": 2})
    with pytest.raises(ValueError, match="give one of them"):
        fv.plan(_cfg(), gpus="H100", parallel={"dp_shard": 2}, device_map="auto")
    with pytest.raises(ValueError, match="ranks='auto' needs"):
        fv.simulate(lambda rank, mesh: None, 2, ranks="auto")
    assert not torch.distributed.is_initialized()
