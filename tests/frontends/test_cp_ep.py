"""``fv.plan(..., parallel={"cp": C})`` and ``{"ep": E}`` (issue 33): torch's ring attention over a sequence sharded
by ``context_parallel``, and a mixture of experts sharded by expert with all-to-all dispatch, per rank in torch's
fake process group; every figure checked against bytes computed by hand from the config."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, MistralConfig, MixtralConfig

import fakeviz as fv
from fakeviz._core.errors import ArgumentError

pytest.importorskip("torch.distributed.fsdp")
pytest.importorskip("torch.distributed.tensor.experimental")

BF16 = 2
B, S = 2, 64  # batch per data-parallel rank, sequence before cp shards it
H, HEADS, KV, D = 64, 4, 2, 16  # hidden, query heads, key/value heads, head_dim
EXPERTS, TOP_K, INTER = 8, 2, 128

DENSE = dict(hidden_size=H, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=HEADS,
             num_key_value_heads=KV, vocab_size=256, max_position_embeddings=256)  # fmt: skip


def _dense() -> LlamaConfig:
    return LlamaConfig(**DENSE)


def _moe() -> MixtralConfig:
    return MixtralConfig(**DENSE, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K)


def _shapes(cfg: object) -> dict[str, tuple[int, ...]]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def _param_bytes_before_forward(trace: object) -> int:
    mem = trace.memory(allocator=False)  # type: ignore[attr-defined]
    mem = mem[mem.device.astype(str).str.startswith("cuda")]
    first = mem.index[mem.phase == "forward"][0]
    return int(mem.loc[:first].Parameter.iloc[-2])


def _hand_param_bytes(cfg: object, fsdp: int, ep: int = 1) -> int:
    """One rank's weights: FSDP2's padded dim-0 shard (ceil rows) over ``fsdp`` ranks; the experts' weights first
    split by expert over ``ep`` (experts / ep whole experts), then over their ``fsdp / ep`` FSDP ranks."""
    total = 0
    for name, shape in _shapes(cfg).items():
        if ".experts." in name and ep > 1:
            rows = math.ceil(shape[0] // ep / (fsdp // ep))
        else:
            rows = math.ceil(shape[0] / fsdp)
        total += rows * math.prod(shape[1:]) * BF16
    return total


# ------------------------------------------------------------------------------------------- context parallel
def test_cp_shards_the_sequence_and_rings_kv_by_hand() -> None:
    cp, dp = 2, 2
    full = fv.plan(_dense(), gpus="4xH100", parallel={"dp_shard": dp, "cp": cp}, batch=B, seq=S, train=True,
                   dtype="bfloat16", ranks="all")  # fmt: skip
    auto = fv.plan(_dense(), gpus="4xH100", parallel={"dp_shard": dp, "cp": cp}, batch=B, seq=S, train=True,
                   dtype="bfloat16")  # fmt: skip
    assert full.complete and full.mesh_dim_names == ("dp_shard", "cp")
    local = S // cp
    for r in full.ranks:
        t = full.trace(r)
        # the weights: FSDP2 over dp_shard x cp (torchtitan's fsdp mesh)
        assert _param_bytes_before_forward(t) == _hand_param_bytes(_dense(), dp * cp), r
        # each rank's activations hold seq / cp tokens: the embedding's output is [B, S / cp, H]
        emb = t.ops[(t.ops.op == "aten.embedding.default") & (t.ops.phase == "forward")]
        assert emb["shape"].astype(str).tolist() == [f"{B}, {local}, {H}"] and emb.nbytes.tolist() == [
            B * local * H * BF16
        ]
        coll = full.collectives(r)
        attn = coll[coll.module.astype(str).str.endswith("self_attn")]
        kv = 2 * B * KV * local * D  # K and V of the local shard, flattened and concatenated
        fwd = attn[attn.phase == "forward"]
        # one all-gather of K/V per attention forward (torch's default rotate method), C x what each rank sends
        assert fwd.kind.tolist() == ["all_gather"] * 2
        assert (fwd.bytes_in == kv * BF16).all() and (fwd.bytes_out == cp * kv * BF16).all()
        bwd = attn[attn.phase == "backward"]
        # backward: K/V gathered again, and the K/V gradients (float32 accumulators) passed on once per ring step
        assert sorted(bwd.kind.value_counts().items()) == [("all_gather", 2), ("all_to_all", 2 * cp)]
        a2a = bwd[bwd.kind == "all_to_all"]
        assert (a2a.bytes_in == kv * 4).all() and (a2a.bytes_out == kv * 4).all()
    # ring steps differ by cp rank (load balancing): one class per cp coordinate; dp_shard replicas stand in
    assert len(full.classes) == len(auto.classes) == cp
    assert auto.stand_ins == {2: 0, 3: 1}
    for r in range(dp * cp):
        assert auto.class_of(r) == full.class_of(r), r
    cols = ["rank", "weights", "gradients", "optimizer", "activations", "peak", "class"]
    assert auto.peaks[cols].equals(full.peaks[cols])


def test_cp_with_tp_splits_heads_and_sequence() -> None:
    sim = fv.plan(_dense(), gpus="4xH100", parallel={"cp": 2, "tp": 2}, batch=1, seq=32, train=False,
                  dtype="bfloat16")  # fmt: skip
    assert sim.complete and sim.mesh_dim_names == ("cp", "tp")
    coll = sim.collectives(0)
    ring = coll[coll.module.astype(str).str.endswith("self_attn") & (coll.kind == "all_gather")]
    # each tp rank holds KV / tp key/value heads of its cp shard of 32 / 2 tokens
    assert (ring.bytes_in == 2 * 1 * (KV // 2) * 16 * D * BF16).all() and len(ring) == 2


# -------------------------------------------------------------------------------------------- expert parallel
def test_ep_shards_experts_and_dispatches_by_all_to_all_by_hand() -> None:
    ep, dp = 2, 4
    full = fv.plan(_moe(), gpus="4xH100", parallel={"ep": ep, "dp_shard": dp}, batch=B, seq=S, train=True,
                   dtype="bfloat16", ranks="all")  # fmt: skip
    auto = fv.plan(_moe(), gpus="4xH100", parallel={"ep": ep, "dp_shard": dp}, batch=B, seq=S, train=True,
                   dtype="bfloat16")  # fmt: skip
    assert full.complete and full.ranks == [0, 1, 2, 3]
    rows = B * S * TOP_K  # the (token, expert) pairs a rank sends, and under balanced routing receives
    for r in full.ranks:
        t = full.trace(r)
        assert _param_bytes_before_forward(t) == _hand_param_bytes(_moe(), dp, ep), r
        coll = full.collectives(r)
        a2a = coll[coll.kind == "all_to_all"]
        fwd = a2a[a2a.phase == "forward"]
        # per layer: the per-expert counts (int64, ep x experts/ep), the tokens out, the outputs back
        assert fwd.bytes_in.tolist() == [EXPERTS * 8, rows * H * BF16, rows * H * BF16] * 2
        assert (fwd.group_size == ep).all() and (fwd.bytes_out == fwd.bytes_in).all()
        assert len(a2a[a2a.phase == "backward"]) == 2 * 2  # the two token exchanges' gradients, per layer
        assumed = t.fidelity()["assumptions"].assumption.str.cat()
        assert "expert parallel: every rank routes its 128 tokens the same balanced way" in assumed
        assert "assumed balanced" in assumed
    # ep ranks with the same layout record once: all four ranks hold the same shapes
    assert auto.ranks == [0] and auto.stand_ins == {1: 0, 2: 0, 3: 0}
    assert len(full.classes) == 1
    cols = ["rank", "weights", "gradients", "optimizer", "activations", "peak", "class"]
    assert auto.peaks[cols].equals(full.peaks[cols])


def test_ep_defaults_dp_shard_to_ep_and_holds_experts_over_ep() -> None:
    sim = fv.plan(_moe(), gpus="2xH100", parallel={"ep": 2}, batch=1, seq=16, train=False, dtype="bfloat16")
    assert sim.world_size == 2 and sim.mesh_dim_names == ("dp_shard",) and sim.settings["parallel"]["dp_shard"] == 2
    assert _param_bytes_before_forward(sim.trace(0)) == _hand_param_bytes(_moe(), 2, 2)


def test_ep_on_deepseek_v3_keeps_the_assumed_routing_past_its_router() -> None:
    """DeepSeek-V3's router gathers its scores at the chosen experts (``scores.gather(1, topk_indices)``): with more
    scores than fakeviz keeps values of (tokens x experts > 65,536) the assumed routing must survive that gather for
    the dispatch to count its tokens; its float32 router gets an FSDP group of its own."""
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(hidden_size=H, intermediate_size=INTER, moe_intermediate_size=32, num_hidden_layers=2,
                           first_k_dense_replace=1, n_routed_experts=64, n_group=8, topk_group=4, num_experts_per_tok=8,
                           n_shared_experts=1, num_attention_heads=HEADS, num_key_value_heads=HEADS, q_lora_rank=32,
                           kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, vocab_size=256,
                           max_position_embeddings=4096)  # fmt: skip
    tokens = 2048  # x 64 experts = 131,072 scores
    sim = fv.plan(cfg, gpus="4xH100", parallel={"ep": 4}, batch=1, seq=tokens, train=False, dtype="bfloat16")
    coll = sim.collectives(0)
    a2a = coll[coll.kind == "all_to_all"]
    assert a2a.bytes_in.tolist() == [64 * 8, tokens * 8 * H * BF16, tokens * 8 * H * BF16]


def _balanced_router(self, hidden_states):  # Mixtral's router with the routing the fake run assumes, both runs
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    probs = torch.nn.functional.softmax(logits.float(), dim=-1)
    idx = (torch.arange(hidden_states.shape[0])[:, None] * self.top_k + torch.arange(self.top_k)[None, :]) % EXPERTS
    top = probs.gather(1, idx)
    return logits, top / top.sum(dim=-1, keepdim=True), idx


def _ep_step(rank: int, mesh: object) -> None:
    """The expert-parallel recipe of the plans (context_expert.expert_parallel, FSDP2 per block) on cpu."""
    import types

    from torch.distributed.fsdp import fully_shard
    from transformers import MixtralForCausalLM

    from fakeviz._frontends import context_expert

    torch.manual_seed(0)
    model = MixtralForCausalLM(_moe())
    for mod in model.modules():
        if type(mod).__name__ == "MixtralTopKRouter":
            mod.forward = types.MethodType(_balanced_router, mod)
    context_expert.expert_parallel(model, mesh, ("dp_shard",), 2)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    ids = torch.randint(0, 256, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()


def _real_rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from fakeviz._analysis.collectives import collectives

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    with fv.record(fake=False, device="cpu") as trace:
        _ep_step(rank, init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",)))
    if rank == 0:
        collectives(trace)[COLL].to_csv(out, index=False)
    dist.destroy_process_group()


COLL = ["op", "kind", "phase", "group_size", "bytes_in", "bytes_out"]


def test_ep_collectives_equal_a_real_gloo_run(tmp_path: object) -> None:
    """Two real CPU processes over gloo run the same ep step (transformers' all-to-all dispatch, FSDP2) as the fake
    process group's rank 0, with the router giving both the balanced routing: every collective, its kind, group and
    bytes, is the same. (The op logs differ where DTensor and functional collectives record differently on a real
    group: 4 ``_wrap_tensor_autograd`` and 9 ``empty_strided`` rows in the real run, 21 views in the fake one.)"""
    import socket

    import pandas as pd
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "real.csv")  # type: ignore[operator]
    mp.spawn(_real_rank, args=(port, out), nprocs=2, join=True)
    fake = fv.simulate(_ep_step, 2, mesh_shape=(2,), mesh_dim_names=("dp_shard",), device="cpu", ranks=[0])
    real = pd.read_csv(out)
    got = fake.collectives(0)[COLL].reset_index(drop=True)
    assert len(real) == 18 and real.astype(str).equals(got.astype(str))
    assert (got.kind == "all_to_all").sum() == 2 * 5  # per layer: counts, tokens out, back; backward: two


# ---------------------------------------------------------------------------------------------------- refusals
def test_cp_and_ep_refuse_what_they_cannot_run() -> None:
    with pytest.raises(ArgumentError, match="(?s)parallel.*ep needs a mixture-of-experts model; LlamaConfig is dense"):
        fv.plan(_dense(), gpus="2xH100", parallel={"ep": 2})
    with pytest.raises(ArgumentError, match="ep=3 does not divide the 8 experts"):
        fv.plan(_moe(), gpus="3xH100", parallel={"ep": 3})
    with pytest.raises(ArgumentError, match="ep=4 does not divide dp_shard=2"):
        fv.plan(_moe(), gpus="2xH100", parallel={"ep": 4, "dp_shard": 2})
    with pytest.raises(ArgumentError, match="ep with tp"):
        fv.plan(_moe(), gpus="4xH100", parallel={"ep": 2, "tp": 2})
    with pytest.raises(ArgumentError, match="(?s)seq.*cp=2 needs seq divisible by 2 x cp = 4.*seq=32"):
        fv.plan(_dense(), gpus="2xH100", parallel={"cp": 2}, seq=30, dtype="bfloat16")
    with pytest.raises(ArgumentError, match="(?s)float32 with grouped-query attention.*dtype='bfloat16'"):
        fv.plan(_dense(), gpus="2xH100", parallel={"cp": 2}, seq=32, dtype="float32")
    with pytest.raises(ArgumentError, match="generate does not"):
        fv.plan(_dense(), gpus="2xH100", parallel={"cp": 2}, seq=32, train=False, new_tokens=4, dtype="bfloat16")
    windowed = MistralConfig(**DENSE, sliding_window=16)
    with pytest.raises(ArgumentError, match="sliding_attention"):
        fv.plan(windowed, gpus="2xH100", parallel={"cp": 2}, seq=32, dtype="bfloat16")
    assert not torch.distributed.is_initialized()
