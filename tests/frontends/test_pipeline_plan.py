"""``fv.plan(..., parallel={"pp": P, ...}, microbatches=M, schedule=...)`` (issue 33): torchtitan's pipeline recipe on
``torch.distributed.pipelining`` per rank in torch's fake process group (Note: [pipeline plans]).

Checked by hand: each stage's parameter bytes from the layer shapes (torchtitan's split: the embedding counts as one
layer on the first stage, norm + head as one on the last), the activations sent between stages (microbatch x seq x
hidden x 4 bytes per microbatch, forward and backward), and the microbatches in flight per schedule: under GPipe
every stage holds all M microbatches' saved activations at the forward/backward turn, under 1F1B stage s holds
min(P - s, M) of them (the first stage the most).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

import fakeviz as fv
from fakeviz._engine import torch_compat

pytest.importorskip("torch.distributed.pipelining")

H, I, HEADS, KV, VOCAB = 64, 128, 4, 2, 512  # noqa: E741 - the config's names
F32 = 4


def _cfg(layers: int = 4) -> LlamaConfig:
    return LlamaConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=layers, num_attention_heads=HEADS,
                       num_key_value_heads=KV, vocab_size=VOCAB, max_position_embeddings=128,
                       tie_word_embeddings=False)  # fmt: skip


HEAD_DIM = H // HEADS
BLOCK = (H * H + 2 * H * KV * HEAD_DIM + H * H + 3 * H * I + 2 * H) * F32  # q, k, v, o, gate/up/down, 2 norms
EMB = VOCAB * H * F32
LAST = H * F32 + VOCAB * H * F32  # final norm, head (no bias)


def _param_bytes(sim: fv.Simulation, rank: int) -> int:
    st = sim.trace(rank).storages
    return int(st[(st.category == "Parameter") & (st.device.astype(str) == f"cuda:{rank}")].nbytes.sum())


def _activation_high_water(sim: fv.Simulation, rank: int) -> int:
    mem = sim.trace(rank).memory(allocator=False)
    return int(mem[mem.device.astype(str) == f"cuda:{rank}"].Activation.max())


def test_torchtitans_split_and_stage_weights() -> None:
    # 4 layers + embedding + head = 6 "layers" over 2 stages: 3 each
    sim = fv.plan(_cfg(4), gpus="2xH100", parallel={"pp": 2}, batch=4, seq=16, train=True, microbatches=2,
                  ranks="all")  # fmt: skip
    assert sim.complete and sim.fits and sim.ranks == [0, 1]
    assert sim.settings["stages"] == [["model.embed_tokens", "model.layers.0", "model.layers.1"],
                                      ["model.layers.2", "model.layers.3", "model.norm", "lm_head"]]  # fmt: skip
    assert _param_bytes(sim, 0) == EMB + 2 * BLOCK == 427_008
    assert _param_bytes(sim, 1) == 2 * BLOCK + LAST == 427_264
    pk = sim.peaks.set_index("rank")
    for r in (0, 1):  # the peak is in AdamW's step: both moments of the stage's parameters
        assert pk.loc[r, "optimizer"] == 2 * _param_bytes(sim, r), r
    # the boundary: one microbatch's hidden states forward, their gradient back, per microbatch
    act = (4 // 2) * 16 * H * F32
    for r in (0, 1):
        col = sim.collectives(r)
        p2p = col[col.bytes_in == act]
        assert (p2p.kind == "send").sum() == 2 and (p2p.kind == "recv").sum() == 2, r
        assert (p2p.group_size == 2).all()


def test_uneven_layers_give_the_first_stage_more() -> None:
    """5 layers + 2 = 7 over 2 stages: 4 and 3, so the embedding and 3 blocks, then 2 blocks, norm and head. Stage 0
    then holds what stage 0 of 6 layers holds (8 over 2: embedding + 3 blocks), stage 1 what stage 1 of 4 layers
    holds (6 over 2: 2 blocks, norm, head): an even split's figures would miss the first stage's extra block."""
    kw = dict(gpus="2xH100", parallel={"pp": 2}, batch=2, seq=16, train=True, ranks="all")
    sims = {n: fv.plan(_cfg(n), **kw) for n in (4, 5, 6)}
    sim = sims[5]
    assert sim.settings["microbatches"] == 2  # torchtitan's default: microbatches of one sequence
    assert sim.settings["stages"][0] == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2"]
    assert _param_bytes(sim, 0) == EMB + 3 * BLOCK and _param_bytes(sim, 1) == 2 * BLOCK + LAST
    act = {n: [_activation_high_water(s, r) for r in (0, 1)] for n, s in sims.items()}
    assert act[5][0] == act[6][0] > act[4][0]
    assert act[5][1] == act[4][1] < act[6][1]
    assert act[5][0] > act[5][1] * 1.3  # the first stage: one block and one microbatch more in flight


@pytest.mark.parametrize("microbatches", [4, 8])
def test_microbatches_in_flight_per_schedule(microbatches: int) -> None:
    P, M = 2, microbatches  # noqa: N806
    sims = {s: fv.plan(_cfg(4), gpus="2xH100", parallel={"pp": P}, batch=M, seq=16, train=True, microbatches=M,
                       schedule=s, ranks="all") for s in ("GPipe", "1F1B")}  # fmt: skip
    gpipe = _activation_high_water(sims["GPipe"], 0)
    assert gpipe % M == 0
    one = gpipe // M  # one microbatch's saved activations on stage 0
    # GPipe: all M alive at the turn; 1F1B: stage 0 holds P - 0 of them
    assert _activation_high_water(sims["1F1B"], 0) == min(P, M) * one
    # the last stage runs each microbatch's backward right after its forward under 1F1B
    assert _activation_high_water(sims["1F1B"], P - 1) < _activation_high_water(sims["GPipe"], P - 1)


def test_checkpointing_keeps_each_stage_block_inputs_only() -> None:
    """Full activation checkpointing in a pipeline: each block saves its input only (one microbatch's hidden states,
    mb x seq x hidden x 4 bytes), so stage 1 under GPipe holds M microbatches x 2 blocks of them at most, plus what
    its head and loss save (the last stage) or the embedding's indices (the first)."""
    kw = dict(gpus="2xH100", parallel={"pp": 2}, batch=4, seq=16, train=True, microbatches=4, schedule="GPipe")
    off, on = fv.plan(_cfg(4), ranks="all", **kw), fv.plan(_cfg(4), ranks="all", checkpointing=True, **kw)
    one = 1 * 16 * H * F32
    for r in (0, 1):
        assert _activation_high_water(on, r) < _activation_high_water(off, r), r
    # stage 0: per microbatch, 2 blocks' inputs saved (the embedding's output and block 0's), plus its int64 ids
    assert _activation_high_water(on, 0) >= 4 * 2 * one


def test_looped_and_v_schedules_hold_their_stages() -> None:
    kw = dict(gpus="2xH100", batch=4, seq=16, train=True, microbatches=4, ranks="all")
    inter = fv.plan(_cfg(4), parallel={"pp": 2}, schedule="Interleaved1F1B", **kw)
    assert inter.settings["stage_of"] == {0: [0, 2], 1: [1, 3]}  # looped: r, r + pp
    assert _param_bytes(inter, 0) == EMB + 2 * BLOCK  # stages 0 (embedding + 1 block) and 2 (1 block)
    # pp 4: rank 0's second stage (4) receives from rank 3, recorded after it (its shapes are given: Note: [pipeline
    # plans]); the vote it assumed from rank 3 is checked once rank 3 is recorded
    four = fv.plan(_cfg(6), parallel={"pp": 4}, schedule="Interleaved1F1B", **{**kw, "gpus": "H100"})
    assert four.complete and four.settings["stage_of"] == {0: [0, 4], 1: [1, 5], 2: [2, 6], 3: [3, 7]}
    assert not four.trace(0).fidelity()["assumptions"].assumption.str.contains("not recorded yet").any()
    if hasattr(torch.distributed.pipelining, "ScheduleZBVZeroBubble"):
        zbv = fv.plan(_cfg(4), parallel={"pp": 2}, schedule="ZBVZeroBubble", **kw)
        assert zbv.settings["stage_of"] == {0: [0, 3], 1: [1, 2]}  # the V
        # 6 over 4 stages: 2, 2, 1, 1: rank 0 holds the embedding + 1 block (stage 0) and norm + head (stage 3)
        assert _param_bytes(zbv, 0) == EMB + BLOCK + LAST


def test_rank_classes_agree_with_recording_every_rank() -> None:
    kw = dict(gpus="4xH100", parallel={"pp": 2, "dp_shard": 2}, batch=2, seq=16, train=True, microbatches=2)
    full = fv.plan(_cfg(4), ranks="all", **kw)
    auto = fv.plan(_cfg(4), **kw)
    assert full.ranks == [0, 1, 2, 3] and auto.ranks == [0, 2] and auto.stand_ins == {1: 0, 3: 2}
    assert [full.class_of(r) for r in range(4)] == [0, 0, 1, 1]
    fp, ap = full.peaks.set_index("rank").peak, auto.peaks.set_index("rank").peak
    assert all(fp[r] == ap[r] for r in range(4))
    # FSDP2 halves each stage's parameters over dp_shard (every dim 0 here is even): what is alive before the forward
    for r, whole in ((0, EMB + 2 * BLOCK), (2, 2 * BLOCK + LAST)):
        mem = full.trace(r).memory(allocator=False)
        mem = mem[mem.device.astype(str) == f"cuda:{r}"]
        first = mem.index[mem.phase == "forward"][0]
        assert int(mem.loc[:first].Parameter.iloc[-2]) == whole // 2, r


def test_first_rank_alone_rests_on_stated_assumptions() -> None:
    """``ranks=[0]``: the values rank 1 would send back (the vote's result, its gradients' metadata) are assumed as
    torch's own inference derives them, and said in fidelity(); they were right: the same record as with rank 1."""
    kw = dict(gpus="2xH100", parallel={"pp": 2}, batch=2, seq=16, train=True)
    alone, both = fv.plan(_cfg(4), ranks=[0], **kw), fv.plan(_cfg(4), ranks="all", **kw)
    assert alone.ranks == [0]
    said = alone.trace(0).fidelity()["assumptions"].assumption
    # torch >= 2.14 agrees no shapes over a fake group: the plan gives them, nothing is received, nothing assumed
    exchanged = torch_compat.pipeline_shapes_over_fake_group()
    assert said.str.contains("not recorded before this rank").sum() == (2 if exchanged else 0)
    assert not both.trace(0).fidelity()["assumptions"].assumption.str.contains("not recorded before").any()
    assert alone.peaks.peak[0] == both.peaks.set_index("rank").peak[0]
    with pytest.raises(ValueError, match=r"ranks=\[0, 1\]"):
        fv.plan(_cfg(4), ranks=[1], **kw)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(parallel={"pp": 8}), "more stages than the model's 4 layers"),
        (dict(parallel={"pp": 2}, schedule="Zigzag"), "use one of 'GPipe', '1F1B'"),
        (dict(parallel={"pp": 4}, microbatches=2, batch=2), "1F1B needs at least as many microbatches"),
        (dict(parallel={"pp": 2}, microbatches=3, batch=4), "does not split into 3"),
        (dict(parallel={"pp": 2}, stages=[["model.embed_tokens"], ["lm_head"]]), "exactly one stage"),
        (dict(parallel={"pp": 2}, schedule="GPipe", stages_per_rank=2), "one stage per rank"),
        (dict(parallel={"pp": 2}, train=False), "training step"),
        (dict(parallel={"dp_shard": 2}, microbatches=2), "for a pipeline"),
        (dict(microbatches=2), "for a pipeline"),
    ],
)
def test_refusals(kw: dict, match: str) -> None:
    args = dict(gpus="H100", batch=4, seq=16, train=True) | kw
    with pytest.raises(ValueError, match=match):
        fv.plan(_cfg(4), **args)
