"""fakeviz.serve: vLLM's serving capacity (``fakeviz/_frontends/serving.py``, ``fakeviz/_analysis/kv_blocks.py``;
Note: [vLLM's memory profile], Note: [vLLM's KV cache blocks]).

Tiny configs of published models (two to six layers, hidden 64) keep the recordings to seconds. Every expected figure
is computed here by hand from the config's shapes; the one figure read from the record is the profile run's peak,
and that is checked against a hand lower bound (the sampler's float32 tensors).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import fakeviz as fv
from fakeviz._analysis import kv_blocks
from fakeviz._analysis.memory import peak_bytes
from fakeviz._core.errors import ArgumentError

pytest.importorskip("transformers")

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
L, KV, HD, BS = 4, 2, 16, 16  # layers, KV heads, head_dim (64 / 4), block size


def _llama(**kw):
    return fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=L, **{**TINY, **kw})


def _gemma3(layer_types, **kw):
    return fv.models.config("google/gemma-3-1b-pt", num_hidden_layers=len(layer_types), head_dim=HD,
                            sliding_window=64, layer_types=layer_types, **{**TINY, **kw})  # fmt: skip


def _llama_weights(tp: int = 1) -> int:
    """Tiny Llama's weights on one of ``tp`` GPUs by hand: embeddings and an untied head of the vocabulary padded to a
    multiple of 64 (1000 -> 1024, as vLLM pads it), per layer q/o (64 x 64), k/v (32 x 64), the MLP's three 128 x 64,
    each split over ``tp``; two norms, a final norm, whole; all bf16; plus rotary's two float32 inv_freq tables of
    head_dim / 2."""
    h, i, v, kvd = 64, 128, 1024, KV * HD
    per_layer = (2 * h * h + 2 * kvd * h + 3 * i * h) // tp + 2 * h
    params = 2 * v * h // tp + L * per_layer + h
    return params * 2 + 2 * (HD // 2) * 4


# ------------------------------------------------------------------------------------------ KV bytes by hand
def test_kv_bytes_per_block_of_full_attention_by_hand() -> None:
    for kv_bytes in (2, 1):  # bf16, fp8
        specs = kv_blocks.layer_specs(_llama(), block_size=BS, dtype_bytes=kv_bytes)
        lay = kv_blocks.kv_layout(specs, max_model_len=4096, max_num_batched_tokens=512)
        assert [s.kind for s in specs] == ["full"] * L
        assert lay.bytes_per_block == 2 * L * KV * HD * BS * kv_bytes
        assert lay.blocks_per_request() == 4096 // BS
        assert lay.blocks(10**7) == 10**7 // (2 * L * KV * HD * BS * kv_bytes)


def test_kv_bytes_per_block_of_sliding_layers_by_hand() -> None:
    # Mistral-7B-v0.1: sliding_window on every layer (no layer_types): the page is full attention's, a request
    # holds only its window plus one chunked-prefill step, and one page more
    cfg = fv.models.config("mistralai/Mistral-7B-v0.1", num_hidden_layers=L, sliding_window=1000, **TINY)
    specs = kv_blocks.layer_specs(cfg, block_size=BS, dtype_bytes=2)
    assert [s.kind for s in specs] == ["sliding"] * L
    lay = kv_blocks.kv_layout(specs, max_model_len=32768, max_num_batched_tokens=2048)
    assert lay.bytes_per_block == 2 * L * KV * HD * BS * 2
    assert lay.blocks_per_request() == math.ceil((1000 - 1 + 2048) / BS) + 1
    # a max_model_len inside the window: the request is the whole max_model_len (+1 page)
    short = kv_blocks.kv_layout(specs, max_model_len=512, max_num_batched_tokens=2048)
    assert short.blocks_per_request() == 512 // BS + 1


def test_mla_latent_per_block_by_hand() -> None:
    cfg = fv.models.config("deepseek-ai/DeepSeek-V3")
    specs = kv_blocks.layer_specs(cfg, block_size=BS, dtype_bytes=2, tensor_parallel_size=8)
    lay = kv_blocks.kv_layout(specs, max_model_len=8192, max_num_batched_tokens=8192)
    # one latent of kv_lora_rank + qk_rope_head_dim per token and layer, no separate values, not split by tp
    assert lay.bytes_per_block == cfg.num_hidden_layers * BS * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2


def test_hybrid_groups_and_sliding_layers_serve_more_by_hand() -> None:
    # Gemma-3's 5 sliding : 1 full. vLLM: 6 groups of one layer (the full layer, then each sliding layer alone);
    # a block is one layer's page; a request needs cdiv(L, bs) full pages + 5 x (cdiv(min(W-1+B, L), bs) + 1)
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    hybrid = kv_blocks.layer_specs(_gemma3(kinds), block_size=BS, dtype_bytes=2)
    full = kv_blocks.layer_specs(_gemma3(["full_attention"] * 6), block_size=BS, dtype_bytes=2)
    n, b, w = 8192, 512, 64
    lh = kv_blocks.kv_layout(hybrid, max_model_len=n, max_num_batched_tokens=b)
    lf = kv_blocks.kv_layout(full, max_model_len=n, max_num_batched_tokens=b)
    page = 2 * KV * HD * BS * 2
    assert (len(lh.groups), lh.group_size, lh.bytes_per_block) == (6, 1, page)
    assert (len(lf.groups), lf.group_size, lf.bytes_per_block) == (1, 6, 6 * page)
    assert lh.blocks_per_request() == n // BS + 5 * (math.ceil((w - 1 + b) / BS) + 1)
    avail = 10**8
    assert lh.blocks(avail) == avail // page
    assert lh.max_concurrency(avail) == (avail // page) / (n // BS + 5 * 37)
    assert lf.max_concurrency(avail) == (avail // (6 * page)) / (n // BS)
    assert lh.max_concurrency(avail) > 3 * lf.max_concurrency(avail)


def test_group_size_rule_pads_the_larger_kind() -> None:
    # 2 full + 7 sliding: groups of 2 (the fewest; 7 >= 1.5 x 2): (f, f), then 4 sliding groups, the last padded
    kinds = ["full_attention"] * 2 + ["sliding_attention"] * 7
    lay = kv_blocks.kv_layout(kv_blocks.layer_specs(_gemma3(kinds), block_size=BS, dtype_bytes=2),
                              max_model_len=1024, max_num_batched_tokens=256)  # fmt: skip
    assert lay.group_size == 2
    assert [g.layers for g in lay.groups] == [(0, 1), (2, 6), (3, 7), (4, 8), (5,)]


# ------------------------------------------------------------------------------------------ serve, recorded
@pytest.fixture(scope="module")
def llama_served() -> fv.Serving:
    return fv.serve(_llama(), "1GB", max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=64)


def test_blocks_and_concurrency_by_hand(llama_served: fv.Serving) -> None:
    s = llama_served
    assert s.weights == _llama_weights()
    # the profile peak is read from the record (vLLM's torch_peak_increase), bounded by hand: 64 requests' float32
    # logits, probabilities and exponential draws are alive together in the sampler
    assert s.profile_peak == peak_bytes(s.trace)["cuda:0"]["bytes"] - s.weights
    assert s.profile_peak >= 3 * 64 * 1000 * 4
    requested = math.ceil(10**9 * 0.9)
    available = requested - _llama_weights() - s.profile_peak
    assert (s.requested, s.available_kv) == (requested, available)
    per_block = 2 * L * KV * HD * BS * 2
    assert s.kv_bytes_per_block == per_block
    assert s.kv_blocks == available // per_block
    assert s.max_concurrency == (available // per_block) / (4096 // BS)
    assert s.kv_tokens == (available // per_block) * BS
    assert s.max_context == 131072  # the model's own context fits many times over
    assert s.fits and s.error is None
    assert s.settings["profile_shape"] == "64 x 8"
    assert "maximum concurrency for 4,096 tokens per request" in s.text


def test_profile_run_record_and_its_assumptions(llama_served: fv.Serving) -> None:
    t = llama_served.trace
    ops = t.ops
    emb = ops[ops.op == "aten.embedding.default"]
    assert len(emb) == 1 and emb["shape"].iloc[0] == "64, 8, 64"  # 512 tokens as 64 requests of 8
    assert emb["nbytes"].iloc[0] == 64 * 8 * 64 * 2
    assert "aten.exponential_.default" in set(ops.op)  # the sampler ran
    said = set(t.fidelity()["assumptions"].op)
    assert {"vllm profile run", "vllm non-torch memory", "vllm cuda graphs", "vllm sampler"} <= said


def test_tensor_parallel_rank_by_hand() -> None:
    # two GPUs: each holds half of every linear layer and of the padded vocabulary, and half the KV heads
    s = fv.serve(_llama(), "2x1GB", tensor_parallel_size=2, max_model_len=4096, max_num_batched_tokens=512,
                 max_num_seqs=64)  # fmt: skip
    assert s.weights == _llama_weights(tp=2)
    per_block = 2 * L * (KV // 2) * HD * BS * 2
    assert s.kv_bytes_per_block == per_block
    available = math.ceil(10**9 * 0.9) - _llama_weights(tp=2) - s.profile_peak
    assert s.kv_blocks == available // per_block
    ops = s.trace.ops
    q = ops[(ops.op == "aten.mm.default") & ops.module.str.endswith("layers.0.self_attn.q_proj")]
    assert q["shape"].iloc[0] == "512, 32"  # 2 of 4 heads of 16 over 512 tokens
    # the sampler sees the whole real vocabulary: the gathered logits, cut to 1000
    assert "1000" in ops[ops.op == "aten.exponential_.default"]["shape"].iloc[0]
    assert "vllm tensor parallel" in set(s.trace.fidelity()["assumptions"].op)
    with pytest.raises(ArgumentError, match="not followed"):
        fv.serve("Qwen/Qwen3-30B-A3B", "2xH100", tensor_parallel_size=2)


def _profile_fake_equals_real(cfg: object, tokens: int, seqs: int) -> None:
    """The profile run's program on ``cfg`` recorded fake equals its real CPU run op by op and byte by byte (the
    model built inside the record from the same seed; float32: the CPU's own dtype)."""
    import gc

    from transformers import AutoModelForCausalLM

    from fakeviz._frontends.serving import profile_forward

    def run(fake: bool) -> fv.Trace:
        gc.collect()
        gc.disable()
        try:
            with fv.record(fake=fake) as t:
                torch.manual_seed(0)
                m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
                profile_forward(m, tokens=tokens, seqs=seqs, vocab=1000, device="cpu")
        finally:
            gc.enable()
        assert t.error is None, t.error
        return t

    real, fake = run(False), run(True)
    assert fake.oplog_lines() == real.oplog_lines()
    assert fake.peak_bytes() == real.peak_bytes()
    assert (fake.live_bytes()["cpu"] == real.live_bytes()["cpu"]).all()


@pytest.mark.parametrize("tokens", [64, 60])  # 8 requests of 8; one packed sequence of 60 (8 requests)
def test_profile_forward_fake_equals_real_on_cpu(tokens: int) -> None:
    _profile_fake_equals_real(fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=2, **TINY), tokens, 8)


def test_sliding_layers_serve_more_than_full_layers() -> None:
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    kw = dict(max_model_len=8192, max_num_batched_tokens=256, max_num_seqs=32)
    hybrid = fv.serve(_gemma3(kinds), "T4", **kw)
    full = fv.serve(_gemma3(["full_attention"] * 6), "T4", **kw)
    assert hybrid.settings["dtype"] == "float16"  # vLLM's "auto": the config's float32, served in fp16 before sm80
    # the same parameters; sliding layers add a second rotary table (two float32 inv_freq buffers of head_dim / 2)
    assert hybrid.weights - full.weights == 2 * (HD // 2) * 4
    assert hybrid.kv_bytes_per_block == 2 * KV * HD * BS * 2
    assert full.kv_bytes_per_block == 6 * 2 * KV * HD * BS * 2
    assert hybrid.max_concurrency > 3 * full.max_concurrency


def test_not_enough_memory_is_vllms_error() -> None:
    # 2 MB: after the weights and the profile run, less than one 4096-token request's KV cache
    s = fv.serve(_llama(), "2MB", max_model_len=4096, max_num_batched_tokens=64, max_num_seqs=8)
    need = 2 * L * KV * HD * 2 * 4096
    assert 0 < s.available_kv < need
    assert not s.fits
    longest = s.available_kv // (2 * L * KV * HD * 2 * BS) * BS
    assert s.error.startswith("To serve at least one request with the models's max seq len (4096), ")
    assert f"the estimated maximum model length is {longest}." in s.error
    assert s.max_context == longest
    assert "does not start" in s.text
    gone = fv.serve(_llama(), "500KB", max_model_len=4096, max_num_batched_tokens=64, max_num_seqs=8)
    assert gone.available_kv < 0 and gone.kv_blocks == 0
    assert gone.error.startswith("No available memory for the cache blocks.")


# -------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("kw", "argument"),
    [
        ({"max_model_len": 8192, "cfg": {"max_position_embeddings": 4096}}, "max_model_len"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": "0.9"}, "gpu_memory_utilization"),
        ({"block_size": 24}, "block_size"),
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
        ({"tensor_parallel_size": 3, "gpus": "3xH100"}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 2}, "gpus"),
        ({"max_num_batched_tokens": 16, "max_num_seqs": 32}, "max_num_batched_tokens"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_batched_tokens": 512}, "max_num_batched_tokens"),  # below vllm serve's 1024 sequences on an H100
    ],
)
def test_refusals(kw: dict, argument: str) -> None:
    cfg = _llama(**kw.pop("cfg", {}))
    with pytest.raises(ArgumentError) as e:
        fv.serve(cfg, kw.pop("gpus", "H100"), **{"max_model_len": 2048, **kw})
    assert e.value.argument == argument


def test_layer_specs_refusals() -> None:
    with pytest.raises(ArgumentError, match="do not split evenly over 3 GPUs"):
        kv_blocks.layer_specs(_llama(), block_size=BS, dtype_bytes=2, tensor_parallel_size=3)
    with pytest.raises(ArgumentError, match="not followed"):
        kv_blocks.layer_specs(_gemma3(["linear_attention", "full_attention"]), block_size=BS, dtype_bytes=2)
    with pytest.raises(ArgumentError, match="decoder-only"):
        kv_blocks.layer_specs(fv.models.config("t5-base"), block_size=BS, dtype_bytes=2)


# ------------------------------------------------------------------------------------------ command line
def test_cli_serve_json(tmp_path) -> None:
    _llama().save_pretrained(tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-m", "fakeviz", "serve", str(tmp_path), "--gpus", "1GB", "--max-model-len",
                        "4096", "--max-num-batched-tokens", "512", "--max-num-seqs", "64", "--json"],
                       capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    per_block = 2 * L * KV * HD * BS * 2
    assert got["weights"] == _llama_weights()
    assert got["kv_bytes_per_block"] == per_block
    assert got["kv_blocks"] == (math.ceil(10**9 * 0.9) - got["weights"] - got["profile_peak"]) // per_block
    assert got["fits"] is True


def test_cli_names_the_option_it_refuses(tmp_path, capsys) -> None:
    from fakeviz._frontends.cli import main

    _llama().save_pretrained(tmp_path)
    assert main(["serve", str(tmp_path), "--gpus", "H100", "--block-size", "24"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fakeviz: error: --block-size 24: vLLM's block sizes are 1, 8, 16, 32, 64, 128, 256")
    assert "Traceback" not in err


# ------------------------------------------------------------------------- Mamba / linear-attention state
# Note: [vLLM's Mamba state pages]. Tiny hybrids of three kinds, every figure by hand from the config's numbers
# (bf16: 2 bytes; one attention token of a layer: 2 x KV heads x head_dim x 2 bytes = 128 bytes).
TOKEN = 2 * KV * HD * 2


def _jamba(**kw):  # mamba1: d_inner = expand x hidden = 128, conv kernel 4, state 8; attention at layer 2
    from transformers import JambaConfig

    return JambaConfig(num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2,
                       expert_layer_offset=1, num_experts=2, num_experts_per_tok=1, mamba_d_state=8, mamba_d_conv=4,
                       mamba_expand=2, mamba_dt_rank=8, **{**TINY, **kw})  # fmt: skip


def _qwen3_next(**kw):  # gated delta net: 2 key heads, 8 value heads of 16, conv kernel 4; full attention at layer 3
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(num_hidden_layers=4, head_dim=HD, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                           linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=8, num_experts=2,
                           num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                           **{**TINY, **kw})  # fmt: skip


def _bamba(**kw):  # mamba2: d_inner 128, 1 group, state 16, 8 heads of 16, conv kernel 4; attention at layer 2
    from transformers import BambaConfig

    return BambaConfig(num_hidden_layers=4, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
                       mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
                       **{"attn_layer_indices": [2], **TINY, **kw})  # fmt: skip


@pytest.mark.parametrize(
    ("make", "kind", "shapes", "block"),
    [
        # conv (kernel - 1, d_inner), ssm (d_inner, state)
        (_jamba, "mamba1", [(3, 128), (128, 8)], 32),
        # conv (kernel - 1, 2 x 16 x 2 + 16 x 8), temporal (value heads, value dim, key dim)
        (_qwen3_next, "gated_delta_net", [(3, 192), (8, 16, 16)], 48),
        # conv (kernel - 1, d_inner + 2 x groups x state), ssm (heads, head dim, state)
        (_bamba, "mamba2", [(3, 128 + 2 * 16), (8, 16, 16)], 48),
    ],
)
def test_mamba_state_page_and_block_size_by_hand(make, kind: str, shapes: list, block: int) -> None:
    state = sum(math.prod(s) * 2 for s in shapes)
    # vLLM raises the attention block to 16 x cdiv(state, 16 x one token's bytes), pads the state to that page
    assert block == 16 * math.ceil(state / (16 * TOKEN))
    specs = kv_blocks.layer_specs(make(), block_size=BS, dtype_bytes=2, max_model_len=512)
    mamba = [s for s in specs if s.kind == "mamba"]
    attn = [s for s in specs if s.kind == "full"]
    assert len(mamba) == 3 and len(attn) == 1
    m = mamba[0]
    assert (m.mamba_type, [s for s, _ in m.states], m.state_bytes) == (kind, shapes, state)
    assert attn[0].block_size == block and attn[0].page_bytes == block * TOKEN
    assert m.page_bytes == block * TOKEN and m.block_size == 512  # padded; mamba_block_size = max_model_len
    lay = kv_blocks.kv_layout(specs, max_model_len=512, max_num_batched_tokens=256)
    # 3 Mamba layers, 1 attention layer: groups of 1 (3 >= 1.5 x 1), four groups, a block is one page
    assert (len(lay.groups), lay.group_size, lay.bytes_per_block, lay.block_size) == (4, 1, block * TOKEN, block)
    # a request: cdiv(512, block) attention pages and one state page per Mamba group; twice the context costs
    # only attention pages
    assert lay.blocks_per_request() == math.ceil(512 / block) + 3
    assert lay.blocks_per_request(1024) - lay.blocks_per_request(512) == math.ceil(1024 / block) - math.ceil(
        512 / block
    )
    avail = 10**7
    assert lay.max_concurrency(avail) == (avail // (block * TOKEN)) / (math.ceil(512 / block) + 3)
    assert lay.kv_tokens(avail) == avail // (block * TOKEN) // 4 * block


def test_mamba_block_size_asked_larger_and_fp8_kv_by_hand() -> None:
    # a block asked larger than needed stays; the state is padded to its page
    specs = kv_blocks.layer_specs(_jamba(), block_size=64, dtype_bytes=2, max_model_len=512)
    assert {s.page_bytes for s in specs} == {64 * TOKEN}
    # a block asked too small is raised in its own steps (the alignment is max(16, block_size)): Bamba's state of
    # (3 x 160 + 8 x 16 x 16) x 2 = 5,056 bytes needs 40 tokens of 128 bytes: 48 from 16, 64 from 32
    for asked, raised in ((16, 48), (32, 64)):
        specs = kv_blocks.layer_specs(_bamba(), block_size=asked, dtype_bytes=2, max_model_len=512)
        assert specs[2].block_size == raised == asked * math.ceil(5056 / (asked * TOKEN))
    # an fp8 KV cache halves attention's token, not the state (the model's dtype): the block grows to hold it
    specs = kv_blocks.layer_specs(_bamba(), block_size=BS, dtype_bytes=1, state_dtype_bytes=2, max_model_len=512)
    state = (3 * 160 + 8 * 16 * 16) * 2
    assert specs[0].state_bytes == state
    assert specs[2].block_size == 16 * math.ceil(state / (16 * TOKEN // 2))


def test_mamba2_state_under_tensor_parallel_by_hand() -> None:
    # tp=2: the one group is extended to 2 (extra_groups_for_head_shards), then the conv dim and the heads split
    s = kv_blocks.mamba_state(_bamba(), tp=2, dtype_bytes=2)
    assert [x for x, _ in s.states] == [(3, (128 + 2 * 2 * 16) // 2), (4, 16, 16)]
    with pytest.raises(ArgumentError, match="do not split evenly over 3 GPUs"):
        kv_blocks.mamba_state(_jamba(), tp=3)


@pytest.fixture(scope="module")
def jamba_served() -> fv.Serving:
    return fv.serve(_jamba(), "8MB", max_model_len=512, max_num_batched_tokens=64, max_num_seqs=8)


def test_hybrid_serve_by_hand(jamba_served: fv.Serving) -> None:
    s = jamba_served
    page = 32 * TOKEN  # Jamba's block of 32 tokens (above), one layer a group
    available = math.ceil(8 * 10**6 * 0.9) - s.weights - s.profile_peak
    assert s.available_kv == available > 0
    assert (s.kv_bytes_per_block, s.kv_blocks) == (page, available // page)
    assert s.max_concurrency == (available // page) / (512 // 32 + 3)
    assert s.kv_tokens == available // page // 4 * 32
    # the longest context: (blocks - 3 state pages) x 32 tokens, up to the model's 262,144 positions
    assert s.max_context == min((available // page - 3) * 32, 262144)
    assert s.settings["kv_block_size"] == 32 and s.to_dict()["layer_kinds"] == ["full", "mamba"]
    assert "3 mamba1 layers hold a fixed state of 2.8 KiB per request (padded to a 4.0 KiB page)" in s.text
    said = s.trace.fidelity()["assumptions"]
    row = said[said.op == "vllm mamba state"]
    assert len(row) == 1 and "mamba1 state of 2,816 bytes" in row["assumption"].iloc[0]


def test_hybrid_serves_more_than_a_formula_that_grows_the_state(jamba_served: fv.Serving) -> None:
    # the weights + KV formula counts every layer as attention that grows with the context; vLLM keeps a Mamba
    # layer's state fixed: at 512 tokens a request needs 16 + 3 pages, not 4 x 16
    s = jamba_served
    formula = s.available_kv / (4 * TOKEN * 512)
    assert s.max_concurrency > 3 * formula


@pytest.mark.parametrize("make", [_jamba, _qwen3_next, _bamba])
def test_hybrid_profile_forward_fake_equals_real_on_cpu(make) -> None:
    """A hybrid model's profile run (transformers' PyTorch paths of the Mamba scan and the gated delta rule, which
    run on a CPU) recorded fake equals its real CPU run op by op and byte by byte."""
    _profile_fake_equals_real(make(), 32, 4)


def test_nemotron_h_state_in_float32_and_layers_without_cache_by_hand() -> None:
    # NemotronH: mamba2 with d_inner = 8 heads x 16 = 128, 2 groups of state 16, conv kernel 4; the ssm state in
    # float32 (no mamba_ssm_cache_dtype set: vLLM's NemotronH default); its MLP and MoE layers hold nothing
    from transformers import NemotronHConfig

    kinds = ["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "mlp"]
    cfg = NemotronHConfig(head_dim=HD, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16,
                          conv_kernel=4, layers_block_type=kinds, moe_intermediate_size=32,
                          moe_shared_expert_intermediate_size=32, n_routed_experts=2, num_experts_per_tok=1,
                          **TINY)  # fmt: skip
    specs = kv_blocks.layer_specs(cfg, block_size=BS, dtype_bytes=2, max_model_len=512)
    assert [s.kind for s in specs] == ["mamba", "full", "mamba"]
    state = 3 * (128 + 2 * 2 * 16) * 2 + 8 * 16 * 16 * 4
    assert specs[0].states == (((3, 192), 2), ((8, 16, 16), 4)) and specs[0].state_bytes == state
    block = 16 * math.ceil(state / (16 * TOKEN))
    assert specs[1].block_size == block == 80
    lay = kv_blocks.kv_layout(specs, max_model_len=512, max_num_batched_tokens=64)
    assert (len(lay.groups), lay.group_size, lay.bytes_per_block) == (3, 1, block * TOKEN)
    assert lay.blocks_per_request() == math.ceil(512 / block) + 2
    # no attention layer (a Mamba-only model): nothing to align, the state page unpadded, one page per request
    only = kv_blocks.layer_specs(_bamba(attn_layer_indices=[]), block_size=BS, dtype_bytes=2, max_model_len=512)
    lay = kv_blocks.kv_layout(only, max_model_len=512, max_num_batched_tokens=64)
    assert (len(lay.groups), lay.page_bytes, lay.blocks_per_request()) == (1, (3 * 160 + 8 * 16 * 16) * 2, 1)


def test_mamba_refusals() -> None:
    from transformers import FalconH1Config, GraniteMoeHybridConfig

    with pytest.raises(ArgumentError, match="not followed"):  # Mamba layers whose state vLLM shapes otherwise
        kv_blocks.layer_specs(GraniteMoeHybridConfig(), block_size=BS, dtype_bytes=2, max_model_len=512)
    with pytest.raises(ArgumentError, match="not followed"):
        kv_blocks.layer_specs(FalconH1Config(), block_size=BS, dtype_bytes=2, max_model_len=512)
    with pytest.raises(ArgumentError, match="needs it"):
        kv_blocks.layer_specs(_jamba(), block_size=BS, dtype_bytes=2)
    with pytest.raises(ArgumentError, match="not followed"):
        fv.serve(_bamba(), "2xH100", tensor_parallel_size=2, max_model_len=512)
