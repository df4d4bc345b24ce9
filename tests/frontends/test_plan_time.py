"""How long on the planning surfaces (issue 32): ``Plan``, ``Simulation`` and sweep rows carry ``step_s``,
``tokens_per_s`` and ``mfu``; ``fv.sweep`` and ``fv.compare`` rank the configurations that fit; the CLI prints a
time line. Checked against hand formulas: a plan's step is its own record's step time from the step's first op,
tokens are ``batch x seq`` over the step, MFU is 3 x the forward's matrix FLOPs (a tiny Llama's, written out
from its config) over ``step_s x GPUs x`` the dense peak; and the collectives of a real ``fully_shard`` record
(group size, wire bytes, FSDP2's copy-in on its own stream, the op that awaits each collective)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

import fakeviz as fv
from fakeviz._analysis import timing
from fakeviz._core.errors import ArgumentError
from fakeviz._core.gpu_specs import gpu_spec
from fakeviz._core.schema import PHASES
from fakeviz._frontends import steps
from fakeviz._frontends.cli import main

H, I, L, HEADS, KV, V = 128, 256, 2, 4, 2, 1000  # noqa: E741 - the config's names
D = H // HEADS
CFG = dict(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=HEADS,
           num_key_value_heads=KV, vocab_size=V, max_position_embeddings=4096, tie_word_embeddings=False)  # fmt: skip
BF16_PEAK = gpu_spec("H100").peak_flops("torch.bfloat16")


def _cfg() -> LlamaConfig:
    return LlamaConfig(**CFG)


def hand_forward_flops(batch: int, seq: int) -> int:
    """The tiny Llama's forward matrix FLOPs by hand: 2 x tokens x every projection's and the head's weights, and
    attention's two products ``4 x batch x heads x seq^2 x head_dim`` (unmasked, as torch's formula counts)."""
    tokens = batch * seq
    per_layer = H * H + 2 * H * KV * D + H * H + 3 * H * I  # q, k, v, o; gate, up, down
    return 2 * tokens * (L * per_layer + H * V) + L * 4 * batch * HEADS * seq * seq * D


@pytest.fixture(scope="module")
def train_plan() -> fv.Plan:
    return fv.plan(_cfg(), gpus="H100", batch=2, seq=64, train=True, dtype="bf16")


def test_a_plans_step_is_its_records_step_time_from_the_steps_first_op(train_plan: fv.Plan) -> None:
    p, trace = train_plan, train_plan.trace
    start = steps.step_start(trace)
    phase = trace.col("phase")
    assert PHASES[phase[start]] == "forward" and all(PHASES[x] == "init" for x in phase[:start])
    st = steps.window_time(trace, "H100", start)
    assert p.step_s == st.step_s and p.speed.step is not None
    # the record's own step time is the step's, field for field (Note: [one step]): never the set-up before it
    assert trace.step_time("H100") == st and st.start == start and st.timed.startswith("the training step (ops ")
    # the set-up before the step (the inputs) is all that differs from the whole record's time (from op 0)
    full = steps.window_time(trace, "H100", 0).step_s
    assert full == trace.step_time("H100", start=0).step_s > st.step_s
    t = trace.time("H100")
    setup = float(t.est_s.iloc[:start].sum()) + start * max(a.host_s for a in timing.ACHIEVED.values())
    assert 0 <= full - p.step_s <= setup + 1e-12
    assert p.tokens_per_s == pytest.approx(2 * 64 / p.step_s, rel=1e-12)
    model = 3 * hand_forward_flops(2, 64)
    assert p.speed.model_flops == model
    assert p.mfu == pytest.approx(model / (p.step_s * 1 * BF16_PEAK), rel=1e-12)
    assert p.speed.dtype == "torch.bfloat16" and p.speed.gpu == "H100"
    text = p.text
    assert text.startswith(p.fit_text) and "tokens/s" in text and f"MFU {p.mfu:.1%}" in text
    assert fv._core.fmt.format_seconds(p.step_s) in repr(p)


def test_inference_counts_the_forward_once_and_generation_its_new_tokens() -> None:
    fwd = fv.plan(_cfg(), gpus="H100", batch=2, seq=64, dtype="bf16")
    assert fwd.speed.model_flops == hand_forward_flops(2, 64)
    assert fwd.tokens_per_s == pytest.approx(2 * 64 / fwd.step_s, rel=1e-12)
    gen = fv.plan(_cfg(), gpus="H100", batch=2, seq=16, new_tokens=4, dtype="bf16")
    assert gen.tokens_per_s == pytest.approx(2 * 4 / gen.step_s, rel=1e-12)  # the tokens generated
    # the prefill (the head on its last position only), then one decode step per further token, each attending
    # to the prompt and what was generated before it (the KV cache)
    per_layer = H * H + 2 * H * KV * D + H * H + 3 * H * I
    prefill = 2 * 2 * 16 * L * per_layer + L * 4 * 2 * HEADS * 16 * 16 * D + 2 * 2 * H * V
    decode = sum(2 * 2 * (L * per_layer + H * V) + L * 4 * 2 * HEADS * (16 + k) * D for k in range(1, 4))
    assert gen.speed.model_flops == prefill + decode


def test_checkpointing_raises_hfu_not_mfu(train_plan: fv.Plan) -> None:
    ck = fv.plan(_cfg(), gpus="H100", batch=2, seq=64, train=True, dtype="bf16", checkpointing=True)
    no = train_plan
    assert ck.speed.model_flops == no.speed.model_flops == 3 * hand_forward_flops(2, 64)
    assert ck.speed.flops > no.speed.flops  # each block's forward again, inside backward
    assert ck.step_s > no.step_s
    assert ck.hfu * ck.step_s > no.hfu * no.step_s  # more hardware FLOPs per step ...
    assert ck.mfu * ck.step_s == pytest.approx(no.mfu * no.step_s, rel=1e-12)  # ... the same model FLOPs
    assert ck.mfu < no.mfu and ck.hfu > ck.mfu  # a longer step for the same work; more FLOPs than the model needs


def test_a_bigger_batch_has_more_tokens_per_second(train_plan: fv.Plan) -> None:
    big = fv.plan(_cfg(), gpus="H100", batch=16, seq=64, train=True, dtype="bf16")
    # a tiny model's step is bound by the host issuing its ops: 8x the batch costs no more time, it does 8x the work
    assert train_plan.speed.step.bound == "host" and big.step_s >= train_plan.step_s
    assert big.tokens_per_s == pytest.approx(8 * train_plan.tokens_per_s * train_plan.step_s / big.step_s)
    assert big.tokens_per_s > train_plan.tokens_per_s and big.mfu > train_plan.mfu
    bigger = fv.plan(_cfg(), gpus="H100", batch=256, seq=1024, train=True, dtype="bf16")  # GPU bound
    assert bigger.speed.step.bound == "gpu" and bigger.step_s > big.step_s
    assert bigger.tokens_per_s > big.tokens_per_s and bigger.mfu > big.mfu


def test_a_capacity_has_no_speed_and_says_why() -> None:
    p = fv.plan(_cfg(), gpus="80GB", batch=1, seq=32)
    assert p.step_s is None and p.tokens_per_s is None and p.mfu is None and p.hfu is None
    assert "'80GB' is a capacity, not a GPU kind" in p.speed.note and p.speed.note in p.text
    assert "no step time" in repr(p)
    mixed = fv.plan(_cfg(), gpus=["H100", "A100 40GB"], batch=1, seq=32)
    assert mixed.step_s is None and "different kinds" in mixed.text
    df = fv.sweep(_cfg(), gpus="80GB", batch=[2, 1], seq=32, progress=False)
    assert df.step_s.isna().all() and df.tokens_per_s.isna().all() and df.mfu.isna().all()
    assert list(df.batch) == [2, 1] and "rank" not in df and df.attrs["rank_by"] is None  # the grid's order
    with pytest.raises(ArgumentError, match="rank_by='step_s': a configuration has no step time"):
        fv.sweep(_cfg(), gpus="80GB", batch=1, seq=32, progress=False, rank_by="step_s")
    with pytest.raises(ArgumentError, match="rank_by='fast'"):
        fv.sweep(_cfg(), gpus="H100", batch=1, seq=32, progress=False, rank_by="fast")


def test_sweep_ranks_what_fits_by_estimated_time() -> None:
    # batch 512 x 2048 does not fit an H100 (a million tokens' fp32 logits over 1000 words are 4 GB, the hidden
    # states and their gradients more); batches 1 and 4 fit and are ranked, 512 follows unranked
    df = fv.sweep(_cfg(), gpus="H100", batch=[512, 1, 4], seq=2048, train=True, progress=False)
    assert list(df.batch) == [4, 1, 512] and list(df.fits) == [True, True, False]
    assert df.attrs["rank_by"] == "tokens_per_s"  # different tokens per step: time per token
    assert df["rank"].tolist()[:2] == [1, 2] and df["rank"].isna().tolist() == [False, False, True]
    assert [p.settings["batch"] for p in df.attrs["plans"]] == [4, 1, 512]  # the plans follow the rows
    for row, p in zip(df.itertuples(), df.attrs["plans"]):
        assert row.step_s == p.step_s and row.tokens_per_s == p.tokens_per_s and row.mfu == p.mfu
    by_step = fv.sweep(_cfg(), gpus="H100", batch=[4, 1], seq=2048, train=True, progress=False, rank_by="step_s")
    assert list(by_step.batch) == [1, 4]
    same = fv.sweep(_cfg(), gpus="H100", batch=2, seq=256, train=True, checkpointing=[True, False], progress=False)
    assert same.attrs["rank_by"] == "step_s" and list(same.checkpointing) == [False, True]
    assert same.step_s.is_monotonic_increasing
    kept = fv.sweep(_cfg(), gpus="H100", batch=[4, 1], seq=64, progress=False, rank_by=None)
    assert list(kept.batch) == [4, 1] and "rank" not in kept


def test_compare_ranks_plans_by_step_time(train_plan: fv.Plan) -> None:
    ck = fv.plan(_cfg(), gpus="H100", batch=2, seq=64, train=True, dtype="bf16", checkpointing=True)
    c = fv.compare([ck, train_plan], labels=["ckpt", "plain"])
    assert c.rank_by == "step_s" and c.items == [train_plan, ck] and c.labels == ["plain", "ckpt"]
    r = c.ranking
    assert list(r.run) == ["plain", "ckpt"] and r["rank"].tolist() == [1, 2]
    assert r.step_s.tolist() == [train_plan.step_s, ck.step_s]
    assert list(dict.fromkeys(c.table.run)) == ["plain", "ckpt"]  # the figures follow the ranking
    text = repr(c)
    assert "ranked by step_s" in text and text.index("1. plain") < text.index("2. ckpt")
    kept = fv.compare([ck, train_plan], rank_by=None)
    assert kept.items == [ck, train_plan] and kept.rank_by is None


# ------------------------------------------------------------------------------------------ simulations
@pytest.fixture(scope="module")
def fsdp() -> fv.Simulation:
    return fv.plan(_cfg(), gpus="2xH100", parallel={"dp_shard": 2}, batch=2, seq=64, train=True, dtype="bf16")


def test_a_simulations_step_is_its_slowest_rank_and_its_flops_every_ranks(fsdp: fv.Simulation) -> None:
    sim = fsdp
    times = [steps.window_time(sim.trace(r), "H100", steps.step_start(sim.trace(r)), gpus_per_node=2)
             for r in sim.covered]  # fmt: skip
    assert sim.step_s == max(t.step_s for t in times)
    assert sim.tokens_per_s == pytest.approx(2 * 64 * 2 / sim.step_s, rel=1e-12)  # both replicas' tokens
    model = 2 * 3 * hand_forward_flops(2, 64)
    assert sim.speed.model_flops == model
    assert sim.mfu == pytest.approx(model / (sim.step_s * 2 * BF16_PEAK), rel=1e-12)
    assert sim.classes.step_s.iat[0] == times[0].step_s
    assert "tokens/s" in sim.text and "MFU" in repr(sim)
    # the step starts at the forward: not the sharding, to_empty and the optimizer's state made before it
    start = steps.step_start(sim.trace(0))
    assert PHASES[sim.trace(0).col("phase")[start]] == "forward"
    assert "optimizer" in {PHASES[x] for x in sim.trace(0).col("phase")[:start]}


def test_tensor_parallel_counts_the_replicated_head_once() -> None:
    """tp=2 runs every projection split in two and the head whole on both ranks: the model FLOPs are one
    replica's, as a single GPU's plan of the same batch counts them; the hardware FLOPs hold the head twice."""
    sim = fv.plan(_cfg(), gpus="2xH100", parallel={"tp": 2}, batch=2, seq=64, train=True, dtype="bf16")
    assert "lm_head" in sim.settings["tp_replicated"]
    assert sim.speed.model_flops == 3 * hand_forward_flops(2, 64)
    assert sim.speed.flops > sim.speed.model_flops
    assert sim.tokens_per_s == pytest.approx(2 * 64 / sim.step_s, rel=1e-12)  # one replica


def test_a_step_of_your_own_has_a_time_and_mfu_but_no_tokens() -> None:
    """``fv.simulate`` of a user's FSDP2 step: the slowest rank's time; the model FLOPs of both ranks (the
    TinyLM's by hand: 2 x tokens x the blocks' and head's weights, times 3); tokens unknown."""
    from tiny_lm import TinyLM
    from torch.distributed.fsdp import fully_shard

    d, vocab, layers, batch, seq = 64, 1001, 2, 2, 16

    def step(rank: int, mesh: object) -> None:
        model = TinyLM(vocab, d, layers)
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randint(0, vocab, (batch, seq))).float().sum().backward()
        opt.step()

    sim = fv.simulate(step, 2, gpu="H100")
    assert sim.step_s == max(steps.window_time(sim.trace(r), "H100", steps.step_start(sim.trace(r)), gpus_per_node=2)
                             .step_s for r in sim.ranks)  # fmt: skip
    hand = 2 * batch * seq * (layers * 2 * d * 4 * d + d * vocab)
    assert sim.speed.model_flops == 2 * 3 * hand
    assert sim.mfu == pytest.approx(2 * 3 * hand / (sim.step_s * 2 * gpu_spec("H100").peak_flops("torch.float32")))
    assert sim.tokens_per_s is None and "tokens/s" not in sim.text and "MFU" in sim.text


def test_a_plan_on_two_gpus_counts_both(train_plan: fv.Plan) -> None:
    """A device map runs the layers one GPU after the other: the model FLOPs of one step, over two GPUs' peak."""
    two = fv.plan(_cfg(), gpus="2xH100", batch=2, seq=64, train=True, dtype="bf16")
    assert set(two.device_map.values()) == {"cuda:0", "cuda:1"}
    assert two.speed.model_flops == train_plan.speed.model_flops
    assert two.mfu == pytest.approx(two.speed.model_flops / (two.step_s * 2 * BF16_PEAK), rel=1e-12)
    assert "on 2x H100" in two.text and "per GPU" in two.text


def test_a_simulation_of_a_capacity_has_no_speed() -> None:
    sim = fv.plan(_cfg(), gpus="2x80GB", parallel={"dp_shard": 2}, batch=1, seq=32, train=True)
    assert sim.step_s is None and sim.mfu is None and "is a capacity" in sim.text
    assert sim.classes.step_s.isna().all()


def test_fsdp_collectives_in_the_time_model(fsdp: fv.Simulation) -> None:
    """On a real fully_shard record: every collective has its group's size and ring bytes; each all-gather follows
    FSDP2's copy-in on the communication stream and is awaited at the copy-out, never at a view; so with a host that
    issues for free (the GPU the bottleneck) the forward's all-gathers run under the compute issued before them."""
    trace = fsdp.trace(0)
    f = timing.features(trace)
    table = fsdp.collectives(0)
    seqs = table.seq.to_numpy()
    assert (table.group_size == 2).all() and (table.sent > 0).all()
    assert np.array_equal(f.coll_wire[seqs], table.sent.to_numpy()) and (f.coll_ranks[seqs] == 2).all()
    names = trace.ops.op.astype(str).to_numpy()
    readers = {int(f.waits_on[i]): names[i] for i in np.flatnonzero(f.waits_on >= 0)[::-1]}  # the first reader
    for row in table.itertuples():
        if row.kind == "all_gather":
            feeder = int(f.coll_after[row.seq])
            assert names[feeder].startswith("fsdp.all_gather_copy_in") and f.on_comm[feeder]
            assert readers[row.seq].startswith("fsdp.split_with_sizes_copy")
        else:
            assert names[int(f.coll_after[row.seq])].startswith("fsdp.chunk_cat")
            assert f.coll_after[int(f.coll_after[row.seq])] == timing.AFTER_COMPUTE  # after the block's gradients
    waiting = np.flatnonzero(f.waits_on >= 0)
    assert not (f.cls[waiting] == timing.CLASSES.index("none")).any()  # no view waits
    t = timing.op_times(trace, "H100", host_scale=0.0, gpus_per_node=2)
    compute = (f.cls != timing.CLASSES.index("none")) & ~f.on_comm & (f.cls != timing.CLASSES.index("collective"))
    fwd = table[(table.kind == "all_gather") & (table.phase == "forward")].seq.tolist()
    overlapped = 0
    for seq in fwd[1:]:
        copy_in = int(f.coll_after[seq])
        before = np.flatnonzero(compute[:copy_in])[-1]  # the last compute op issued before the copy-in
        assert t.start_s.iat[copy_in] <= t.end_s.iat[before]  # it does not wait for the compute stream
        overlapped += t.start_s.iat[seq] < t.end_s.iat[before]
    assert overlapped == len(fwd) - 1


def test_collective_streams_by_hand() -> None:
    """A copy-in on the communication stream waits only for what it reads; the collective it feeds starts after it;
    a collective issued from the compute stream waits for that stream; a reader waits for what it reads."""
    cls = ["gemm", "copy", "collective", "gemm", "elementwise", "collective", "elementwise"]
    n = len(cls)
    f = timing.OpFeatures(
        names=[f"aten.op{i}.default" for i in range(n)], cls=np.array([timing.CLASSES.index(c) for c in cls], np.int8),
        flops=np.zeros(n, np.int64), bytes_in=np.zeros(n, np.int64), bytes_out=np.zeros(n, np.int64), dtype=[""] * n,
    )  # fmt: skip
    f.waits_on = np.array([-1, -1, -1, -1, 2, -1, 5])
    f.on_comm = np.array([False, True, False, False, False, False, False])
    f.coll_after = np.array([-1, timing.AFTER_NOTHING, 1, -1, -1, timing.AFTER_COMPUTE, -1])
    est = np.array([5e-3, 1e-4, 0, 5e-3, 1e-5, 0, 1e-5])
    coll = np.array([0, 0, 2e-3, 0, 0, 1e-3, 0])
    step, end, exposed = timing.critical_path(f, est, np.zeros(n), coll)
    assert end[1] == pytest.approx(1e-4)  # the copy-in runs at once, beside the first GEMM
    assert end[2] == pytest.approx(1e-4 + 2e-3)  # then its collective, still under the GEMM
    assert end[4] == pytest.approx(1e-2 + 1e-5)  # the reader waits for nothing more than the GEMMs
    assert end[5] == pytest.approx(1e-2 + 1e-5 + 1e-3)  # issued from the compute stream: after it
    assert end[6] == pytest.approx(end[5] + 1e-5) and exposed == pytest.approx(1e-3)
    assert step == pytest.approx(end[6])
    # the window of a step: indices shift, a wait on an op before the window waits for nothing
    w = f.tail(2)
    assert w.waits_on.tolist() == [-1, -1, 0, -1, 3]
    assert w.coll_after.tolist() == [timing.AFTER_NOTHING, -1, -1, timing.AFTER_COMPUTE, -1]


# ------------------------------------------------------------------------------------------------- CLI
def test_the_cli_prints_and_writes_the_time(tmp_path, capsys) -> None:
    out, saved = tmp_path / "r.json", tmp_path / "r.fvz"
    argv = ["report", "meta-llama/Llama-3.1-8B", "--set", "num_hidden_layers=1", "--set", "vocab_size=1000",
            "--seq", "64", "--batch", "2", "--train", "--gpus", "H100"]  # fmt: skip
    assert main([*argv, "--json", str(out), "--save", str(saved)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())["speed"]
    trace = fv.load(saved)
    st = steps.window_time(trace, "H100", steps.step_start(trace))  # the second (steady-state) step of two
    assert PHASES[trace.col("phase")[steps.step_start(trace)]] == "forward"
    assert (trace.col("phase")[: steps.step_start(trace)] == PHASES.index("optimizer")).any()
    assert data["step_s"] == pytest.approx(st.step_s, rel=1e-12) and data["gpu"] == "H100"
    assert data["tokens_per_s"] == pytest.approx(2 * 64 / st.step_s, rel=1e-9)
    assert data["mfu"] == pytest.approx(data["model_flops"] / (st.step_s * BF16_PEAK), rel=1e-9)
    line = next(x for x in text.splitlines() if x.startswith("time: "))
    assert fv._core.fmt.format_seconds(st.step_s) in line and "tokens/s" in line and f"MFU {data['mfu']:.1%}" in line
    assert f"timed: {st.timed}" in line and st.timed.startswith("the last of 2 training steps (ops ")
    assert main(["report", "meta-llama/Llama-3.1-8B", "--set", "num_hidden_layers=1", "--seq", "16",
                 "--capacity", "80GB", "--json", str(out)]) == 0  # fmt: skip
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("time: "))
    assert "no step time: --capacity 80GB gives memory only" in line
    assert json.loads(out.read_text())["speed"]["step_s"] is None
    assert main(["report", str(saved), "--gpus", "H100"]) == 0  # a saved trace: the time without tokens
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("time: "))
    assert fv._core.fmt.format_seconds(st.step_s) in line and "tokens/s" not in line
