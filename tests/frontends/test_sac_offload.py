"""Selective activation checkpointing and offload (issue 33): ``checkpointing="selective"`` / an int / a policy
function (Note: [selective checkpointing] in ``fakeviz/_frontends/steps.py``) and ``offload=`` (Note: [offload] in
``fakeviz/_frontends/offload.py``).

A tiny Llama (2 blocks, hidden 64) runs one training step. Where the step runs on a CPU, the fake record is compared
with the real one op by op (``fv.record(fake=False)``); the bytes are compared with sums computed here by hand from
the shapes: torchtitan's op policy saves, per block, the 1st, 3rd, 5th and 7th of its seven ``mm`` (q, v, gate,
down projections) and both attention ``bmm`` (eager attention on a CPU), and recomputes everything else.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fakeviz as fv
from fakeviz._core.errors import ArgumentError
from fakeviz._frontends import steps

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oplog_diff import first_diff, window_diff  # noqa: E402

L, H, INTER, HEADS, KV, VOCAB, B, S = 2, 64, 128, 4, 2, 96, 2, 8
HD = H // HEADS
F32 = 4
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # the order a block runs them


def _config() -> Any:
    cfg = transformers.LlamaConfig(num_hidden_layers=L, hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS,
                                   num_key_value_heads=KV, vocab_size=VOCAB, max_position_embeddings=32,
                                   tie_word_embeddings=False, use_cache=False)  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


def _step(form: Any) -> None:
    """Seed, build, forward with labels, backward: on the record's device (cpu)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).train()
    ids = torch.randint(0, VOCAB, (B, S))
    with steps.checkpointing(model, form):
        model(input_ids=ids, labels=ids).loss.backward()


_RECORDS: dict[tuple[str, bool], Any] = {}


def _record(form: Any, fake: bool = True) -> Any:
    key = (repr(form), fake)
    if key not in _RECORDS:
        gc.collect()
        gc.disable()  # storages freed by the collector would free at different ops in two runs
        try:
            with fv.record(fake=fake) as t:
                _step(form)
        finally:
            gc.enable()
        assert t.error is None, t.error
        _RECORDS[key] = t
    return _RECORDS[key]


def _block_saved(t: Any, category: str | None = None) -> int:
    """Bytes the blocks keep from the forward for the backward: storages made by ops inside ``model.layers`` that
    are alive after the forward's last op (the checkpointed blocks' inputs, their saved activations); ``category``:
    of that category only."""
    ops, st = t.ops, t.storages
    fwd = ops.seq.to_numpy()[np.flatnonzero(ops.phase.to_numpy() == "forward")]
    end = int(fwd[-1])
    alive = (st.alloc_seq >= int(fwd[0])) & (st.alloc_seq <= end) & ((st.free_seq > end) | (st.free_seq < 0))
    kept = st[alive & st.module.astype(str).str.contains(r"\.layers\.\d+", regex=True)]
    return int(kept[kept.category == category].nbytes.sum() if category else kept.nbytes.sum())


def _backward_mm(t: Any, block: int, proj: str) -> int:
    o = t.ops
    where = (o.phase == "backward") & (o.op == "aten.mm.default")
    part = "mlp" if proj in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return int((where & o.module.astype(str).str.endswith(f"layers.{block}.{part}.{proj}")).sum())


# ------------------------------------------------------------------------------ selective checkpointing
def test_selective_fake_record_equals_the_real_cpu_record() -> None:
    real, fake = _record("selective", fake=False), _record("selective", fake=True)
    a, b = real.oplog_lines(), fake.oplog_lines()
    i = first_diff(a, b)
    assert i is None, f"op logs differ first at op {i}:\n" + window_diff(a, b, i)
    assert sorted(real.live_bytes()) == sorted(fake.live_bytes())
    for dev, curve in real.live_bytes().items():
        assert np.array_equal(curve, fake.live_bytes()[dev]), dev
    cols = ["storage", "device", "nbytes", "category", "roles", "alloc_seq", "free_seq"]
    assert real.storages[cols].equals(fake.storages[cols])


def test_selective_saves_the_hand_sum_of_its_saved_matmul_outputs() -> None:
    none, full, sel = (_block_saved(_record(f)) for f in (False, True, "selective"))
    assert full < sel < none
    # beyond full checkpointing's block inputs, each block keeps the outputs torchtitan's policy saves: the 1st, 3rd,
    # 5th and 7th mm (q: B*S x H, v: B*S x KV*HD, gate: B*S x INTER, down: B*S x H) and both attention bmm
    # (scores: B*HEADS x S x S, probabilities @ values: B*HEADS x S x HD)
    per_block = B * S * H + B * S * KV * HD + B * S * INTER + B * S * H + B * HEADS * S * S + B * HEADS * S * HD
    assert sel - full == L * per_block * F32
    # and the record counts them as activations (Note: [selective checkpointing in a record]), fake and real alike
    for fake in (True, False):
        assert _block_saved(_record("selective", fake), "Activation") == sel


def test_every_second_block_saves_what_half_the_blocks_save() -> None:
    none, full, every2 = (_block_saved(_record(f)) for f in (False, True, 2))
    # block 1 (the 2nd) is checkpointed and keeps only its input; block 0 keeps all it keeps without checkpointing
    assert 2 * (every2 - full) == none - full
    t = _record(2)
    assert all(_backward_mm(t, 0, p) == 2 for p in PROJ)  # block 0: the two gradient mms of each projection only
    assert [_backward_mm(t, 1, p) for p in PROJ] == [3, 3, 3, 3, 3, 3, 2]  # block 1: its forward's mm again


def test_recomputed_ops_appear_again_in_the_backward() -> None:
    """Each projection's backward has two mm (the gradients); a recomputed projection has its forward mm once more.
    torch's non-reentrant checkpoint stops recomputing once every saved tensor is back (``down_proj``'s output is not
    one: the residual add saves nothing), so full checkpointing recomputes six of the seven."""
    counts = {f: [[_backward_mm(_record(f), b, p) for p in PROJ] for b in range(L)] for f in (False, True, "selective")}
    assert counts[False] == [[2] * 7] * L
    assert counts[True] == [[3, 3, 3, 3, 3, 3, 2]] * L
    # selective: the 2nd, 4th and 6th mm (k, o, up) are recomputed; q, v, gate, down were saved
    assert counts["selective"] == [[2, 3, 2, 3, 2, 3, 2]] * L


def save_every_mm(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def test_a_user_policy_is_applied_to_every_block() -> None:
    full, mine = _block_saved(_record(True)), _block_saved(_record(save_every_mm))
    # all seven projections' outputs kept (q, k, v, o, gate, up, down), attention recomputed
    per_block = B * S * (H + KV * HD + KV * HD + H + INTER + INTER + H)
    assert mine - full == L * per_block * F32
    assert steps.check_checkpointing(save_every_mm) == "policy save_every_mm"


@pytest.mark.parametrize(("value", "label"), [(False, False), (None, False), ("none", False), (True, True),
                                              ("full", True), ("Selective", "selective"), (2, 2), ("3", 3)])  # fmt: skip
def test_checkpointing_labels(value: Any, label: Any) -> None:
    assert steps.check_checkpointing(value) == label and type(steps.check_checkpointing(value)) is type(label)


@pytest.mark.parametrize("value", ["half", 0, -2, 1.5, "op", [True]])
def test_other_checkpointing_values_are_refused_in_one_line(value: Any) -> None:
    with pytest.raises(ArgumentError) as exc:
        fv.plan(_config(), gpus="H100", train=True, checkpointing=value)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"checkpointing={value!r}: not a checkpointing form")
    assert "'selective'" in msg and "every n-th block" in msg and "CheckpointPolicy" in msg


def test_plans_and_sweeps_carry_the_label() -> None:
    df = fv.sweep(_config(), gpus="1x80GB", batch=2, seq=16, train=True, checkpointing=[False, "selective", 2, "full"],
                  progress=False, rank_by=None)  # fmt: skip
    assert df.checkpointing.tolist() == [False, "selective", 2, True]
    plans = df.attrs["plans"]
    assert [p.settings["checkpointing"] for p in plans] == [False, "selective", 2, True]
    assert all(p.trace.error is None for p in plans)
    assert [p.label.split(" train")[1].strip() for p in plans] == ["", "sac", "ckpt/2", "ckpt"]
    kept = [_block_saved(p.trace) for p in plans]
    assert kept[0] > kept[2] > kept[3] and kept[0] > kept[1] > kept[3]


def test_parallel_plans_take_the_forms() -> None:
    pytest.importorskip("torch.distributed.fsdp")
    sims = {f: fv.plan(_config(), gpus="2xH100", parallel={"dp_shard": 2}, batch=2, seq=16, train=True,
                       checkpointing=f) for f in (False, "selective", True)}  # fmt: skip
    assert all(s.complete for s in sims.values())
    assert [s.settings["checkpointing"] for s in sims.values()] == [False, "selective", True]
    mm = {f: int(((s.trace(0).ops.phase == "backward") & (s.trace(0).ops.op == "aten.mm.default")).sum())
          for f, s in sims.items()}  # fmt: skip
    assert mm[False] < mm["selective"] < mm[True]


def test_the_command_line_takes_the_forms(capsys: Any) -> None:
    from fakeviz._frontends.cli import main

    argv = ["report", "gpt2", "--set", "n_layer=2", "--seq", "16", "--train", "--steps", "1"]
    assert main([*argv, "--checkpointing", "selective"]) == 0
    assert "activation checkpointing (sac)" in capsys.readouterr().out
    assert main([*argv, "--checkpointing", "half"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--checkpointing half: not a checkpointing form" in err[0]


# ------------------------------------------------------------------------------------------------ offload
def _mlp_step() -> None:
    """A two-layer MLP's step with saved activations on the host; the input needs no gradient."""
    from fakeviz._frontends import offload

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    x = torch.randn(4, 64)
    with offload.saved_on_host({"offload": "activations"}):
        m(x).square().mean().backward()


def test_activation_offload_fake_record_equals_the_real_cpu_record_and_the_hand_bytes() -> None:
    recs = {}
    for fake in (False, True):
        gc.collect()
        gc.disable()
        try:
            with fv.record(fake=fake) as recs[fake]:
                _mlp_step()
        finally:
            gc.enable()
    a, b = recs[False].oplog_lines(), recs[True].oplog_lines()
    assert first_diff(a, b) is None, window_diff(a, b, first_diff(a, b) or 0)
    for t in recs.values():
        st = t.storages
        # each tensor autograd saves is copied to a host tensor once (empty + copy_) and that copy is the activation:
        # x (the first addmm's, for its weight's gradient: 4 x 64), the ReLU's output twice (saved by relu and by the
        # second addmm: 4 x 128 each), the second weight (128 x 64, for the ReLU output's gradient), the output (saved
        # by square: 4 x 64); the first weight is not saved (x needs no gradient)
        assert int(st[st.category == "Activation"].nbytes.sum()) == (4 * 64 + 2 * 4 * 128 + 128 * 64 + 4 * 64) * F32
        assert sum(line.split(" = ")[1].startswith("aten.copy_") for line in t.oplog_lines()) == 5


def test_activation_offload_on_a_device_map_plan() -> None:
    kw = dict(gpus="1x80GB", batch=2, seq=16, train=True)
    base, off = fv.plan(_config(), **kw), fv.plan(_config(), offload="activations", **kw)
    assert off.settings["offload"] == "activations" and off.trace.error is None
    assert list(base.peaks.device) == ["cuda:0"] and list(off.peaks.device) == ["cuda:0", "cpu"]
    mem = off.trace.memory(allocator=False)
    assert int(mem[mem.device.astype(str) == "cuda:0"].Activation.max()) == 0  # nothing saved stays on the GPU
    host = off.peaks.set_index("device").loc["cpu"]
    tr = off.transfers.set_index(["src", "dst"])
    down, up = int(tr.loc[("cuda:0", "cpu"), "bytes"]), int(tr.loc[("cpu", "cuda:0"), "bytes"])
    assert 0 < down <= host.activations and up >= down  # every saved GPU tensor goes to the host and comes back
    assert base.transfers.empty

    # at the end of the forward the GPU holds fewer bytes: the saved activations are on the host
    def at_forward_end(t: Any) -> int:
        last = np.flatnonzero(t.ops.phase.to_numpy() == "forward")[-1]
        return int(t.live_bytes()["cuda:0"][last])

    assert at_forward_end(off.trace) < at_forward_end(base.trace)


def _shard_bytes(dp: int) -> tuple[int, int, int]:
    """One rank's FSDP2 shard of every parameter (dim 0 split in ceil(rows / dp)), of the blocks' only, and the
    number of parameter tensors."""
    import math

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(_config())
    sizes = {n: math.ceil(p.shape[0] / dp) * math.prod(p.shape[1:]) * F32 for n, p in model.named_parameters()}
    blocks = sum(v for n, v in sizes.items() if ".layers." in n)
    return sum(sizes.values()), blocks, len(sizes)


def test_cpu_offload_puts_the_sharded_state_on_the_host() -> None:
    pytest.importorskip("torch.distributed.fsdp")
    kw = dict(gpus="2xH100", parallel={"dp_shard": 2}, batch=2, seq=16, train=True)
    base, off = fv.plan(_config(), **kw), fv.plan(_config(), offload="cpu", **kw)
    assert base.complete and off.complete and off.settings["offload"] == "cpu"
    shard, blocks, tensors = _shard_bytes(2)
    pk = off.peaks
    assert list(pk.device) == ["cuda:0", "cpu", "cuda:1", "cpu"] and list(pk["rank"]) == [0, 0, 1, 1]
    host = pk[pk.device == "cpu"].iloc[0]
    # parameters, gradients and AdamW's two moments of the rank's shard, and AdamW's step (a float32 per parameter)
    assert (host.weights, host.gradients, host.optimizer) == (shard, shard, 2 * shard + tensors * F32)
    gpu = pk[pk.device != "cpu"].iloc[0]
    assert gpu.optimizer == 0 and gpu.gradients == 0

    # before the forward, the GPU holds the shard and AdamW's moments without offload, none of them with it
    def before_forward(t: Any, device: str) -> Any:
        mem = t.memory(allocator=False)
        mem = mem[mem.device.astype(str) == device]
        return mem.loc[: mem.index[mem.phase == "forward"][0]].iloc[-2]

    on, gone = before_forward(base.trace(0), "cuda:0"), before_forward(off.trace(0), "cuda:0")
    assert (on.Parameter, on["Optimizer state"]) == (shard, 2 * shard)
    assert (gone.Parameter, gone["Optimizer state"]) == (0, 0)
    assert before_forward(off.trace(0), "cpu").Parameter == shard
    assert off.trace(0).peak_bytes()["cuda:0"]["bytes"] < base.trace(0).peak_bytes()["cuda:0"]["bytes"]
    tr = off.transfers(0).set_index(["src", "dst"]).bytes
    assert tr[("cuda:0", "cpu")] == shard  # the reduce-scattered gradients, once
    with torch.device("meta"):
        buffers = sum(b.numel() * b.element_size() for b in transformers.LlamaForCausalLM(_config()).buffers())
    # every shard before the forward's all-gathers, the blocks' again before the backward's (the root stays
    # unsharded), the input ids and labels (made on the host, beside the parameters; FSDP moves them), and at set-up
    # the buffers (on the GPU: torchtitan's buffer_device)
    assert tr[("cpu", "cuda:0")] == shard + blocks + 2 * B * 16 * 8 + buffers
    assert off.fits and "cpu" not in set(off.classes.columns)


@pytest.mark.parametrize(("kw", "says"), [
    (dict(offload="disk", train=True), "offload='disk': not an offload fakeviz knows\nGive None, 'cpu'"),
    (dict(offload="cpu", train=True), "has none\nGive parallel={'dp_shard': N, ...}, or keep a device map and put "
                                      "modules on the host with a 'cpu' entry"),
    (dict(offload="cpu", train=True, parallel={"tp": 2}), "FSDP2's CPU offload shards over dp_shard"),
    (dict(offload="activations", train=False), "saves no activations"),
    (dict(offload="cpu", train=True, parallel={"pp": 2, "dp_shard": 2}), "pipeline plans (pp) take no offload"),
])  # fmt: skip
def test_offloads_fakeviz_cannot_honour_are_refused(kw: dict[str, Any], says: str) -> None:
    with pytest.raises(ArgumentError) as exc:
        fv.plan(_config(), gpus="4xH100", **kw)
    assert says in str(exc.value)


def test_a_sweep_takes_offload_as_an_axis() -> None:
    df = fv.sweep(_config(), gpus="1x80GB", batch=2, seq=16, train=True, offload=[None, "activations"], progress=False,
                  rank_by=None, executor=False)  # fmt: skip
    assert df.offload.isna().tolist() == [True, False] and df.offload[1] == "activations"
    assert np.isnan(df["cpu activations"][0]) and df["cpu activations"][1] > 0
    assert (df["max peak"] == df["cuda:0 peak"]).all()  # the GPUs' peak, not the host's
