"""fakeviz.simulate with torch.distributed's own fake process group, FSDP2 and tensor parallel
(``fakeviz/_frontends/distributed.py``, Note: [ranks under the fake process group], Note: [collectives in the record]).

A tiny transformer (embedding, blocks of LayerNorm / Linear / ReLU / Linear, head) is sharded by torch's own
``fully_shard`` and ``parallelize_module`` at world sizes 2, 3 and 8; local shard bytes per rank are checked
against hand-computed values (FSDP2 pads every rank's shard to ``ceil(dim0 / world)`` rows; DTensor's local
shapes are uneven where the split is), the collectives and their bytes against the shard sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny_lm import Block, TinyLM
from torch import nn

import fakeviz as fv

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

D, VOCAB, BATCH, SEQ = 64, 1001, 2, 16


def Tiny(layers: int = 2) -> TinyLM:  # noqa: N802 - read as the model class it builds
    return TinyLM(VOCAB, D, layers)


def _train(model: nn.Module) -> None:
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    model(ids).float().sum().backward()
    opt.step()


def _fsdp_step(seen: dict[int, dict[str, tuple[tuple[int, ...], int]]], **kw: object):  # noqa: ANN202
    def step(rank: int, mesh: object) -> None:
        model = Tiny()
        for b in model.blocks:
            fully_shard(b, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
        # torch's own view of this rank's shards: local shape, bytes of the (padded) storage
        seen[rank] = {n: (tuple(p.to_local().shape), p.to_local().untyped_storage().nbytes())
                      for n, p in model.named_parameters()}  # fmt: skip
        _train(model)

    return step


def _hand_shard(shape: tuple[int, ...], rank: int, world: int) -> tuple[tuple[int, ...], int]:
    """FSDP2 on dim 0: every rank's storage holds ceil(d0 / world) rows (padded); its local tensor the rows it owns."""
    rows = math.ceil(shape[0] / world)
    rest = math.prod(shape[1:])
    owned = max(0, min(rows, shape[0] - rank * rows))
    return (owned, *shape[1:]), rows * rest * 4


def _param_bytes_before_forward(trace: object) -> int:
    """Parameter bytes live at the last op before the forward: the sharded (padded) parameters only (the
    unsharded ones are freed by ``fully_shard``; the first forward op already gathers the root's)."""
    mem = trace.memory(allocator=False)  # type: ignore[attr-defined]
    mem = mem[mem.device.astype(str).str.startswith("cuda")]
    first = mem.index[mem.phase == "forward"][0]
    return int(mem.loc[:first].Parameter.iloc[-2])


@pytest.mark.parametrize("world", [2, 3, 8])
def test_fsdp2_shards_per_rank_are_the_hand_computed_bytes(world: int) -> None:
    seen: dict[int, dict] = {}
    sim = fv.simulate(_fsdp_step(seen), world, gpu="H100")
    assert sim.ranks == list(range(world)) and sim.complete and sim.fits
    shapes = {n: tuple(p.shape) for n, p in Tiny().named_parameters()}
    for rank in range(world):
        hand = {n: _hand_shard(s, rank, world) for n, s in shapes.items()}
        assert seen[rank] == hand, rank  # torch's shards are what the hand formula says (padded storage)
        assert sim.trace(rank).meta["distributed"]["world_size"] == world
        assert _param_bytes_before_forward(sim.trace(rank)) == sum(b for _, b in hand.values()), rank
        assert sim.peaks.set_index("rank").loc[rank, "device"] == f"cuda:{rank}"
    even = all(s[0] % world == 0 for s in shapes.values())
    # an uneven split (1001 rows, 64 rows over 3) makes the ranks that own fewer rows a class of their own
    assert (len(sim.classes) == 1) == even
    assert sim.classes["count"].sum() == world


def test_fsdp2_collectives_and_their_bytes() -> None:
    world = 2
    sim = fv.simulate(_fsdp_step({}), world, gpu="H100")
    col = sim.collectives(0)
    ag, rs = col[col.kind == "all_gather"], col[col.kind == "reduce_scatter"]
    # forward: root (emb + out) then each block; backward: each block again (reshard after forward), root kept
    assert len(ag) >= 3 and len(rs) == 3
    assert (ag.group_size == world).all() and (ag.ranks == "0-1").all()
    assert (ag.bytes_out == world * ag.bytes_in).all()
    assert (ag.sent == (world - 1) * ag.bytes_in).all() and (ag.received == ag.sent).all()
    assert (rs.bytes_in == world * rs.bytes_out).all()
    block = sum(math.ceil(s[0] / world) * math.prod(s[1:]) * 4 for s in (p.shape for p in Block(D).parameters()))
    assert (ag.bytes_in == block).sum() >= 2  # each block's all-gather sends its padded shard
    assert set(ag.phase.astype(str)) == {"forward", "backward"} and set(rs.phase.astype(str)) == {"backward"}
    # the all-gather output buffers are storages of the record, alive at their time like any tensor
    ops = sim.trace(0).ops.set_index("seq")
    assert all(ops.loc[s, "nbytes"] == b for s, b in zip(ag.seq, ag.bytes_out))


def test_reshard_after_forward_trades_memory_for_all_gathers() -> None:
    runs = {}
    for reshard in (True, False):
        sim = fv.simulate(_fsdp_step({}, reshard_after_forward=reshard), 2, gpu="H100", ranks=[0])
        col = sim.collectives(0)
        runs[reshard] = (int((col.kind == "all_gather").sum()), int(sim.trace(0).peak_bytes()["cuda:0"]["bytes"]))
    assert runs[False][0] < runs[True][0]  # the blocks' parameters stay gathered for backward
    assert runs[False][1] >= runs[True][1]


def test_hsdp_on_a_2d_mesh() -> None:
    seen: dict[int, dict] = {}
    sim = fv.simulate(_fsdp_step(seen), 4, mesh_shape=(2, 2), mesh_dim_names=("replicate", "shard"), gpu="H100")
    assert sim.fits and len(sim.classes) == 2  # shard 0 and shard 1 of the uneven 1001-row tables
    w = Tiny().emb.weight.shape
    assert seen[0]["emb.weight"] == ((math.ceil(w[0] / 2), D), math.ceil(w[0] / 2) * D * 4)
    assert seen[2]["emb.weight"] == seen[0]["emb.weight"]  # replicas of shard 0
    col = sim.collectives(3)
    ag, ar = col[col.kind == "all_gather"], col[col.kind == "all_reduce"]
    # mesh [[0, 1], [2, 3]]: rank 3 shards with rank 2 (the last dim) and is a replica of rank 1
    assert (ag.group_size == 2).all() and set(ag.ranks) == {"2-3"}
    assert len(ar) >= 1 and (ar.group_size == 2).all() and set(ar.ranks) == {"1,3"}  # gradients across replicas
    assert (ar.phase.astype(str) == "backward").all()


def test_tensor_parallel_halves_the_weights_and_all_reduces() -> None:
    world = 2
    local: dict[int, dict[str, tuple[int, ...]]] = {}

    def step(rank: int, mesh: object) -> None:
        block = Block(D)
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        local[rank] = {n: tuple(getattr(p, "to_local", lambda p=p: p)().shape) for n, p in block.named_parameters()}
        x = torch.randn(BATCH, SEQ, D)
        block(x).sum().backward()

    sim = fv.simulate(step, world, gpu="H100")
    for rank in range(world):
        assert local[rank]["up.weight"] == (4 * D // world, D)
        assert local[rank]["down.weight"] == (D, 4 * D // world)
        assert local[rank]["norm.weight"] == (D,)  # not parallelized: replicated
    full = sum(p.numel() for p in Block(D).parameters()) * 4
    split = sum(p.numel() for n, p in Block(D).named_parameters() if n.startswith(("up", "down.weight"))) * 4
    assert _param_bytes_before_forward(sim.trace(0)) == full - split + split // world
    col = sim.collectives(0)
    ar = col[(col.kind == "all_reduce") & (col.phase.astype(str) == "forward")]
    assert len(ar) == 1 and ar.bytes_in.iloc[0] == BATCH * SEQ * D * 4  # RowwiseParallel's partial sums
    assert len(sim.classes) == 1


def test_tensor_parallel_flops_are_each_ranks_local_matmuls() -> None:
    """A DTensor op runs its local op, which the recorder sees too: only the local one is counted (the outer
    call at the global shape was counted as well before)."""
    d_in, d_hidden, rows = 64, 128, 8

    def step(rank: int, mesh: object) -> None:
        m = torch.nn.Sequential(
            torch.nn.Linear(d_in, d_hidden, bias=False), torch.nn.Linear(d_hidden, d_in, bias=False)
        )
        parallelize_module(m.cuda(), mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
        m(torch.randn(rows, d_in, device="cuda")).sum().backward()

    sim = fv.simulate(step, 2, gpu="H100")
    local = 2 * rows * d_in * (d_hidden // 2)  # each rank's half of either matmul
    flops = sim.trace(1).flops()
    assert flops["forward"] == 2 * local
    assert flops["backward"] == 3 * local  # both weight gradients, and the input gradient of the second layer


def test_sequence_parallel_gathers_the_sequence() -> None:
    world = 2

    def step(rank: int, mesh: object) -> None:
        block = Block(D)
        plan = {"norm": SequenceParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
        parallelize_module(block.norm, mesh, plan["norm"])
        parallelize_module(block, mesh, {"up": plan["up"], "down": plan["down"]})
        block.norm(torch.randn(BATCH, SEQ, D)).sum().backward()

    sim = fv.simulate(step, world, gpu="H100", ranks=[1])
    assert sim.ranks == [1] and sim.complete
    assert sim.trace(1).error is None


def test_ranks_subset_records_only_those() -> None:
    sim = fv.simulate(_fsdp_step({}), 8, gpu="H100", ranks=[0, 7])
    assert sim.ranks == [0, 7] and set(sim.peaks["rank"]) == {0, 7}
    assert sim.classes["count"].sum() == 2 and len(sim.classes) == 2  # rank 7 owns the short rows of 1001
    with pytest.raises(KeyError, match="rank 3 was not recorded"):
        sim.trace(3)


def test_a_collective_the_fake_group_cannot_serve_is_a_clean_error() -> None:
    def step(rank: int, mesh: object) -> None:
        model = Tiny()
        fully_shard(model, mesh=mesh)
        dist.monitored_barrier()  # only the gloo backend has it

    with pytest.raises(fv.SimulationError) as info:
        fv.simulate(step, 2, gpu="H100")
    e = info.value
    text = str(e)
    assert text.startswith("rank 0: ") and "test_distributed.py:" in text.splitlines()[0]
    assert "monitored_barrier" in text and "dist.barrier()" in text
    assert len(text.splitlines()) <= 25 and "Traceback" not in text
    assert e.rank == 0 and isinstance(e.__cause__, ValueError)
    sim = e.simulation
    assert sim is not None and not sim.complete and not sim.fits and "incomplete" in sim.text
    assert sim.trace(0).num_ops > 0  # the partial record is kept
    assert not dist.is_initialized()  # no process group left behind


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="holds 6 ranks"):
        fv.simulate(lambda r, m: None, 4, mesh_shape=(2, 3))
    with pytest.raises(ValueError, match="outside 0..3"):
        fv.simulate(lambda r, m: None, 4, ranks=[4])
    with pytest.raises(ValueError, match="one name per dimension"):
        fv.simulate(lambda r, m: None, 4, mesh_shape=(2, 2), mesh_dim_names=("dp",))


def test_explore_renders_a_rank_picker() -> None:
    pytest.importorskip("ipywidgets")
    sim = fv.simulate(_fsdp_step({}), 3, gpu="H100")
    w = sim.explore()
    hide, head, bars, picker, holder = w.children
    assert [v for _, v in picker.options] == [0, 1, 2]
    assert "class 1" in picker.options[2][0]
    before = holder.children[0]
    picker.value = 2
    assert holder.children[0] is not before  # the picked rank's explorer
    bars = sim.bars()
    assert len(bars.data[0].x[0]) == 3


def test_explore_shows_a_static_summary_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note: [static fallback]: the summary (classes table, rank 0's trace) is an output of its own before the
    live box, which hides it while it lives; the box's one bundle also carries it as text/html."""
    pytest.importorskip("ipywidgets")
    import IPython.display

    sim = fv.simulate(_fsdp_step({}), 3, gpu="H100")
    w = sim.explore()
    sid = w.static_html.split("data-fv-static='", 1)[1].split("'", 1)[0]
    assert sid in w.children[0].value and "display:none" in w.children[0].value
    assert "<table" in w.static_html and "3 ranks recorded" in w.static_html and "fakeviz trace" in w.static_html
    assert "<script" not in w.static_html
    for cls in sim.classes.itertuples():
        assert f"<td>{cls[1]}</td>" in w.static_html
    shown: list[dict] = []
    monkeypatch.setattr(IPython.display, "display", lambda data, raw=False: shown.append(data))
    w._ipython_display_()
    first, second = shown
    assert first["text/html"].endswith(w.static_html) and "widget-view" not in str(first)
    assert "application/vnd.jupyter.widget-view+json" in second
    bundle = w._repr_mimebundle_()
    assert bundle["text/html"] == w.static_html and "run the cell with a kernel" in bundle["text/plain"]


def test_a_value_after_a_collective_is_a_stated_assumption() -> None:
    """Note: [values after collectives]: a small tensor's values survive an all_reduce under the fake process
    group (it moves no data), which fidelity() states; a tensor without kept values needs no assumption."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with fv.record() as t:
            loss = torch.tensor([1.5, 2.5])
            dist.all_reduce(loss)
            local = loss.tolist()
            big = torch.zeros(1 << 17)
            dist.all_reduce(big)
    finally:
        dist.destroy_process_group()
    assert t.error is None and local == [1.5, 2.5]
    rows = t.fidelity()["assumptions"]
    assert list(rows.op) == ["c10d.allreduce_.default"]
    assert "this rank's own" in rows.assumption.iloc[0] and "fake process group" in rows.assumption.iloc[0]


def test_mfu_divides_by_the_peak_of_the_dtype_the_matmuls_ran_in() -> None:
    """A float32 model under FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)``: its matmuls run in bf16, so
    MFU divides by the bf16 peak (issue 41: the fp32 peak gave an MFU of 6.79); ``tokens=`` gives tokens/s."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from fakeviz._analysis import timing
    from fakeviz._core.errors import ArgumentError
    from fakeviz._core.gpu_specs import gpu_spec

    sim = fv.simulate(_fsdp_step({}, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)), 2, gpu="H100",
                      tokens=2 * BATCH * SEQ)  # fmt: skip
    sp = sim.speed
    rec = sim.trace(0)
    f = timing.features(rec).tail(timing.step_start(rec))
    gemms = [f.dtype[i] for i in range(len(f)) if timing.CLASSES[f.cls[i]] == "gemm"]
    assert gemms and set(gemms) == {"torch.bfloat16"}  # what the record says the matmuls ran in
    assert sp.dtype == "torch.bfloat16" and sp.peak_flops == gpu_spec("H100").peak_flops("torch.bfloat16")
    assert sp.peak_flops > gpu_spec("H100").peak_flops("torch.float32")
    assert sim.mfu == pytest.approx(sp.model_flops / (sim.step_s * 2 * sp.peak_flops), rel=1e-12)
    assert 0 < sim.mfu < 1
    assert sim.tokens_per_s == pytest.approx(2 * BATCH * SEQ / sim.step_s, rel=1e-12) and "tokens/s" in sim.text
    plain = fv.simulate(_fsdp_step({}), 2, gpu="H100", ranks=[0])  # float32 matmuls: the fp32 peak; no tokens
    assert plain.speed.dtype == "torch.float32" and plain.tokens_per_s is None and plain.mfu is not None
    for bad in (0, -3, 2.5, True, "4096"):
        with pytest.raises(ArgumentError, match=r"tokens=.*whole number of at least 1"):
            fv.simulate(lambda r, m: None, 2, tokens=bad)


def test_mixed_matmul_dtypes_divide_by_their_flop_weighted_peak() -> None:
    """Matmuls in bf16 and in float32 in one step: the peak is ``sum(flops) / sum(flops / peak)``, the rate at
    which those FLOPs run at each dtype's peak, and ``dtype`` says the mix."""
    from fakeviz._analysis import timing
    from fakeviz._core.gpu_specs import gpu_spec

    with fv.record(device="cuda:0", gpu="H100") as rec:
        a = torch.randn(256, 512, dtype=torch.bfloat16)
        (a @ torch.randn(512, 1024, dtype=torch.bfloat16)).sum()  # 2 x 256 x 512 x 1024 FLOPs in bf16
        x = torch.randn(256, 512)
        (x @ torch.randn(512, 256)).sum()  # a quarter of that in float32
    peak, dtype = timing.matmul_peak(rec, "H100")
    spec = gpu_spec("H100")
    big, small = 2 * 256 * 512 * 1024, 2 * 256 * 512 * 256
    bf16, fp32 = spec.peak_flops("torch.bfloat16"), spec.peak_flops("torch.float32")
    assert peak == pytest.approx((big + small) / (big / bf16 + small / fp32), rel=1e-12)
    assert fp32 < peak < bf16 and dtype == "torch.bfloat16 80%, torch.float32 20%"
