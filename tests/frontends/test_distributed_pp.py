"""fakeviz.simulate with torch's own pipeline parallelism (``torch.distributed.pipelining``): a tiny transformer
(embedding, blocks, final norm, head) is split into stages by ``pipeline()`` and run by ``ScheduleGPipe`` /
``Schedule1F1B`` in torch's fake process group, one stage per rank, at world sizes 2 and 4.

Each rank's weights are checked against hand sums of the parameters its stage holds (the embedding on the first
stage, the final norm and head on the last), the stage boundaries against the send/recv collectives of the
schedule (one activation of ``microbatch x seq x hidden x 4`` bytes per microbatch forward, one gradient of the
same size backward), and the ranks against their classes and peaks.

The traced frontend (``pipeline()`` + ``Pipe.build_stage``) is used: its stages get their shapes from the traced
graph and warm up their neighbours with a 4-byte send/recv, so nothing another rank sent is ever read. The
manual frontend (``PipelineStage``) reads values other ranks sent (its warm-up vote, its metadata exchange),
which the fake group cannot give: ``test_manual_pipeline_stage`` is a strict xfail for that.
"""

from __future__ import annotations

import pytest
import torch
from tiny_lm import TinyLM
from torch import nn

import fakeviz as fv
from fakeviz._engine import torch_compat

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
from torch.distributed.pipelining import (  # noqa: E402
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    SplitPoint,
    pipeline,
)

D, VOCAB, BATCH, SEQ, LAYERS = 256, 16384, 8, 32, 4
F32 = 4


def Tiny(layers: int = LAYERS) -> TinyLM:  # noqa: N802 - read as the model class it builds
    return TinyLM(VOCAB, D, layers, final_norm=True)


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def _stage_blocks(world: int) -> list[list[int]]:
    """The blocks of each stage: LAYERS blocks split evenly (stage 0 also holds the embedding, the last stage the
    final norm and head)."""
    per = LAYERS // world
    return [list(range(s * per, (s + 1) * per)) for s in range(world)]


def _hand_weights(world: int) -> list[int]:
    """Bytes of the parameters each stage holds, summed by hand from the layer shapes."""
    block = (2 * D + (4 * D * D + 4 * D) + (4 * D * D + D)) * F32  # norm, up, down (weights and biases)
    emb = VOCAB * D * F32
    head = (2 * D + D * VOCAB) * F32  # final norm, head (no bias)
    out = [len(bs) * block for bs in _stage_blocks(world)]
    out[0] += emb
    out[-1] += head
    return out


def _materialize(module: nn.Module, device: torch.device) -> None:
    """Give a stage built on the meta device its parameters on ``device``: what ``module.to_empty(device=device)``
    does in a real run (under fake tensors that call fails: a meta parameter the traced program holds a weakref
    to cannot be swapped for a fake cuda one), then initialize them."""
    for name, p in list(module.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        new = torch.empty(p.shape, dtype=p.dtype, device=device)
        nn.init.normal_(new, std=0.02)
        setattr(module.get_submodule(owner), leaf, nn.Parameter(new))


def _pp_step(schedule: type, microbatches: int, held: dict[int, list[str]]):  # noqa: ANN202
    def step(rank: int, mesh: object) -> None:
        world = dist.get_world_size()
        dev = torch.device("cuda", torch.cuda.current_device())
        with torch.device("meta"):
            model = Tiny()
        starts = [bs[0] for bs in _stage_blocks(world)[1:]]
        mb = torch.randint(0, VOCAB, (BATCH // microbatches, SEQ), device="meta")
        pipe = pipeline(model, mb_args=(mb,), split_spec={f"blocks.{b}": SplitPoint.BEGINNING for b in starts})
        stage = pipe.build_stage(rank, dev)
        del model, pipe
        _materialize(stage.submod, dev)
        held[rank] = [n for n, _ in stage.submod.named_parameters()]
        opt = torch.optim.AdamW(stage.submod.parameters())
        sched = schedule(stage, n_microbatches=microbatches, loss_fn=_loss)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)
        if rank == 0:
            sched.step(ids)
        elif rank == world - 1:
            sched.step(target=torch.randint(0, VOCAB, (BATCH, SEQ), device=dev))
        else:
            sched.step()
        opt.step()

    return step


def _check_stages(sim: fv.Simulation, world: int, microbatches: int, held: dict[int, list[str]]) -> None:
    assert sim.ranks == list(range(world)) and sim.complete and sim.fits
    # torch's split put the embedding on the first stage, the head on the last
    assert any(".emb." in n or n.startswith("emb.") for n in held[0])
    assert any(n.endswith("out.weight") for n in held[world - 1])
    for r in range(1, world):
        assert not any("emb" in n for n in held[r]), r
    for r in range(world - 1):
        assert not any(n.endswith("out.weight") for n in held[r]), r

    hand = _hand_weights(world)
    pk = sim.peaks.set_index("rank")
    act = (BATCH // microbatches) * SEQ * D * F32  # one microbatch's hidden states at a stage boundary
    for r in range(world):
        assert pk.loc[r, "device"] == f"cuda:{r}"
        assert pk.loc[r, "weights"] == hand[r], r
        # the peak is in AdamW's step: every gradient and both moments of the stage's parameters are alive
        assert pk.loc[r, "gradients"] == hand[r] and pk.loc[r, "optimizer"] == 2 * hand[r], r
        st = sim.trace(r).storages
        params = st[(st.category == "Parameter") & (st.device.astype(str) == f"cuda:{r}")]
        assert params.nbytes.sum() == hand[r], r  # every cuda parameter of the record is the stage's

        col = sim.collectives(r)
        assert set(col.kind) == {"send", "recv"}, r
        assert (col.group_size == world).all() and (col.ranks == f"0-{world - 1}").all()
        assert col.user_line.str.contains("test_distributed_pp.py").all()
        # the neighbours' warm-up (_get_init_p2p_neighbors_ops: one float32 each way per neighbour)
        neighbours = (r > 0) + (r < world - 1)
        warm = col[col.bytes_in == F32]
        assert len(warm) == 2 * neighbours and (warm.kind == "send").sum() == neighbours, r
        p2p = col[col.bytes_in != F32]
        assert (p2p.bytes_in == act).all() and (p2p.bytes_out == act).all(), r
        sends, recvs = p2p[p2p.kind == "send"], p2p[p2p.kind == "recv"]
        # forward: activations to the next stage; backward: their gradients to the previous one
        assert len(sends) == microbatches * neighbours and len(recvs) == microbatches * neighbours, r
        assert (sends.sent == act).all() and (sends.received == 0).all()
        assert (recvs.received == act).all() and (recvs.sent == 0).all()


def test_gpipe_two_stages() -> None:
    world, microbatches = 2, 2
    held: dict[int, list[str]] = {}
    sim = fv.simulate(_pp_step(ScheduleGPipe, microbatches, held), world, gpu="H100")
    _check_stages(sim, world, microbatches, held)
    assert _hand_weights(world) == [20_985_856, 20_987_904]
    # different layers: different records, different peaks
    assert len(sim.classes) == 2 and sim.class_of(0) != sim.class_of(1)
    pk = sim.peaks.set_index("rank").peak
    assert pk[0] != pk[1]
    # GPipe: every microbatch forward (rank 0 sends) before any backward (rank 0 receives the gradients)
    c0, c1 = sim.collectives(0), sim.collectives(1)
    act = (BATCH // microbatches) * SEQ * D * F32
    s0, r0 = c0[(c0.kind == "send") & (c0.bytes_in == act)], c0[(c0.kind == "recv") & (c0.bytes_in == act)]
    assert s0.seq.max() < r0.seq.min()
    r1, s1 = c1[(c1.kind == "recv") & (c1.bytes_in == act)], c1[(c1.kind == "send") & (c1.bytes_in == act)]
    assert r1.seq.max() < s1.seq.min()


def _activation_high_water(sim: fv.Simulation, rank: int) -> int:
    """The most activation bytes alive at once on ``rank``'s GPU (no allocator rounding)."""
    mem = sim.trace(rank).memory(allocator=False)
    return int(mem[mem.device.astype(str) == f"cuda:{rank}"].Activation.max())


def test_four_stages_gpipe_and_1f1b() -> None:
    world, microbatches = 4, 8
    hand = _hand_weights(world)
    assert hand == [18_881_536, 2_104_320, 2_104_320, 18_883_584]
    sims = {}
    for schedule in (ScheduleGPipe, Schedule1F1B):
        held: dict[int, list[str]] = {}
        sim = sims[schedule] = fv.simulate(_pp_step(schedule, microbatches, held), world, gpu="H100")
        _check_stages(sim, world, microbatches, held)
        pk = sim.peaks.set_index("rank").peak
        assert pk[0] > pk[1] and pk[3] > pk[1] and pk[0] != pk[3]  # the embedding / the head and its logits
        assert len({sim.class_of(0), sim.class_of(1), sim.class_of(3)}) == 3

    gpipe, f1b = sims[ScheduleGPipe], sims[Schedule1F1B]
    # GPipe: the two middle stages hold one block each and run the same ops: one class, up to rank numbering
    assert [gpipe.class_of(r) for r in range(world)] == [0, 1, 1, 2]
    assert list(gpipe.classes["count"]) == [1, 2, 1]
    pk = gpipe.peaks.set_index("rank").peak
    assert pk[1] == pk[2]
    # 1F1B: stage s runs world - s forwards before its first backward, so the middle stages differ
    assert len(f1b.classes) == world
    # ... and holds the activations of at most world - s microbatches where GPipe holds all of them
    for s in range(world - 1):  # (the last stage also holds its loss: one microbatch, not an exact fraction)
        assert _activation_high_water(f1b, s) * microbatches == _activation_high_water(gpipe, s) * (world - s), s
    assert _activation_high_water(f1b, world - 1) < _activation_high_water(gpipe, world - 1)


@pytest.mark.parametrize("shapes", ["given", "inferred"])
def test_manual_pipeline_stage(shapes: str) -> None:
    """A hand-built ``PipelineStage`` per rank: with every shape given (torch's warm-up vote, read from the value
    the previous rank sent, picks STATIC) or none (DYNAMIC: the stages agree shapes by ``send_object_list`` /
    ``recv_object_list``, the first stage's forward metadata to the second, the second's gradient metadata back)."""
    world, microbatches = 2, 2
    mb = BATCH // microbatches

    def step(rank: int, mesh: object) -> None:
        dev = torch.device("cuda", torch.cuda.current_device())
        with torch.device("meta"):
            model = Tiny(2)
        first, last = rank == 0, rank == world - 1
        part = (
            nn.Sequential(model.emb, model.blocks[0])
            if first
            else nn.Sequential(model.blocks[1], model.norm, model.out)
        )
        _materialize(part, dev)  # only this stage's layers on the rank's GPU
        shape = {}
        if shapes == "given":  # a stage's input and output that carry gradients say so (requires_grad)
            x = torch.randint(0, VOCAB, (mb, SEQ), device=dev) if first else torch.empty(mb, SEQ, D, device=dev)
            y = torch.empty(mb, SEQ, VOCAB if last else D, device=dev, requires_grad=not last)
            shape = {"input_args": x if first else x.requires_grad_(), "output_args": y}
        stage = PipelineStage(part, rank, world, dev, **shape)
        sched = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=_loss)
        if first:
            sched.step(torch.randint(0, VOCAB, (BATCH, SEQ), device=dev))
        else:
            sched.step(target=torch.randint(0, VOCAB, (BATCH, SEQ), device=dev))

    exchanged = torch_compat.pipeline_shapes_over_fake_group()
    if shapes == "inferred" and not exchanged:  # torch >= 2.14 refuses dynamic shapes under a fake group itself
        with pytest.raises(fv.SimulationError, match="requires dynamic shape inference"):
            fv.simulate(step, world, gpu="H100")
        return
    sim = fv.simulate(step, world, gpu="H100")
    assert sim.complete and len(sim.classes) == 2
    block = (2 * D + (4 * D * D + 4 * D) + (4 * D * D + D)) * F32
    hand = [VOCAB * D * F32 + block, block + (2 * D + D * VOCAB) * F32]
    act = mb * SEQ * D * F32  # one microbatch's hidden states at the stage boundary
    for r in range(world):
        pk = sim.peaks.set_index("rank")
        assert pk.loc[r, "weights"] == hand[r] and pk.loc[r, "gradients"] == hand[r], r
        col = sim.collectives(r)
        p2p = col[col.bytes_in == act]
        # forward: each microbatch's activations to stage 1; backward: their gradients back to stage 0
        assert (p2p.kind == "send").sum() == microbatches and (p2p.kind == "recv").sum() == microbatches, r
        # the warm-up vote: one int32 forward, the result back
        vote = col[col.bytes_in == 4]  # (torch >= 2.14 decides locally under a fake group: no vote sent)
        assert sorted(vote.kind) == (["recv", "send"] if exchanged else []), r
        meta = col[(col.bytes_in != act) & (col.bytes_in != 4)]
        if shapes == "given":
            assert meta.empty, r
        else:  # the metadata: an int64 size, then the pickle, forward (0 -> 1) and backward (1 -> 0)
            assert sorted(meta.kind) == ["recv", "recv", "send", "send"], r
            assert (meta.bytes_in == 8).sum() == 2, r
        # nothing left assumed: rank 0's guesses (the vote's result, rank 1's gradient metadata) were checked
        # against what rank 1 really sent
        assert not sim.trace(r).fidelity()["assumptions"].assumption.str.contains("not recorded before").any(), r
