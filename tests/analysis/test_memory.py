"""Memory categories, the timeline and peak attribution, checked against hand-computed values.

The reference figures are worked out from the model's shapes, not read off a run:
a 3-layer MLP with AdamW has known parameter, gradient, optimizer-state and
saved-activation bytes. The MemTracker comparison shows where our categories
differ from PyTorch's MemTracker on the same real run, and that ours are right.
"""

from __future__ import annotations

import gc

import pytest
import torch

import fakeviz as fv

B, D_IN, H, D_OUT = 8, 16, 32, 4
F32 = 4


def _mlp_step(with_opt: bool = True) -> dict:
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(D_IN, H), torch.nn.ReLU(), torch.nn.Linear(H, H), torch.nn.ReLU(), torch.nn.Linear(H, D_OUT)
    )
    opt = torch.optim.AdamW(m.parameters())
    x = torch.randn(B, D_IN)
    out = m(x)
    loss = out.sum()
    loss.backward()
    if with_opt:
        opt.step()
    return {"model": m, "opt": opt}


# hand-computed figures
PARAM_BYTES = ((D_IN * H + H) + (H * H + H) + (H * D_OUT + D_OUT)) * F32  # 6928
GRAD_BYTES = PARAM_BYTES  # every parameter gets a gradient of its own shape
N_PARAMS = 6
# AdamW keeps exp_avg and exp_avg_sq per parameter (same shape) and a 0-dim float32 "step" tensor
OPT_BYTES = 2 * PARAM_BYTES + N_PARAMS * F32
# saved for backward: the two ReLU outputs (each B x H; the Linear after each saves the same
# storage as its input); the first Linear saves x, which is an Input; weights are Parameters
ACT_BYTES = 2 * B * H * F32
INPUT_BYTES = B * D_IN * F32


@pytest.fixture(scope="module", params=[False, True], ids=["real", "fake"])
def mlp_trace(request):
    gc.collect()
    with fv.record(fake=request.param) as trace:
        _mlp_step()
    return trace


def test_mlp_categories_by_hand(mlp_trace):
    mem = mlp_trace.memory()
    ops = mlp_trace.ops
    end_fwd = int(ops[ops.phase == "forward"].seq.max())
    end_bwd = int(ops[ops.phase == "backward"].seq.max())
    at_fwd, at_bwd, last = mem.iloc[end_fwd], mem.iloc[end_bwd], mem.iloc[-1]
    assert at_fwd["Parameter"] == PARAM_BYTES
    assert at_fwd["Activation"] == ACT_BYTES
    assert at_fwd["Input"] == INPUT_BYTES
    assert at_fwd["Gradient"] == 0 and at_fwd["Optimizer state"] == 0
    assert at_bwd["Gradient"] == GRAD_BYTES
    assert at_bwd["Activation"] == 0  # saved tensors are freed as backward consumes them
    assert last["Optimizer state"] == OPT_BYTES
    assert last["Gradient"] == GRAD_BYTES and last["Parameter"] == PARAM_BYTES
    # the activation curve peaks at the end of forward, at exactly the saved bytes
    assert mem["Activation"].max() == ACT_BYTES
    st = mlp_trace.storages
    assert st[st.category == "Activation"].op.unique().tolist() == ["aten.relu.default"]
    assert (st[st.category == "Gradient"].phase == "backward").all()
    assert set(st[st.category == "Optimizer state"].phase) == {"optimizer"}


def test_mlp_optimizer_state_and_grads_have_owners(mlp_trace):
    st = mlp_trace.storages
    p = mlp_trace.col("p_tensor").tolist()
    for cat in ("Gradient", "Optimizer state"):
        owners = st[st.category == cat].owner
        assert (owners >= 0).all() and set(owners) == set(p), cat
    # every parameter row points at its gradient's storage
    grads = mlp_trace.col("p_grad")
    assert (grads >= 0).all()
    assert set(st.category.iloc[grads]) == {"Gradient"}


def test_step_tensor_is_born_in_the_optimizer_step(mlp_trace):
    # torch.tensor(0.0) inside AdamW reaches the recorder only as lift_fresh: it must count
    # from that op, not from the start of the run
    st = mlp_trace.storages
    steps = st[(st.category == "Optimizer state") & (st.nbytes == F32)]
    assert len(steps) == N_PARAMS
    assert (steps.alloc_seq >= 0).all() and (steps.phase == "optimizer").all()


def test_peak_attribution(mlp_trace):
    pk = mlp_trace.peak()["cpu"]
    curve = mlp_trace.live_bytes()["cpu"]
    assert pk.bytes == curve.max() and pk.seq == int(curve.argmax())
    assert pk.bytes == sum(pk.by_category.values())
    assert pk.phase == "optimizer"  # AdamW's temporaries on top of params, grads and state
    assert pk.by_category["Optimizer state"] > 0
    top = pk.top
    assert list(top.nbytes) == sorted(top.nbytes, reverse=True)
    assert {"category", "op", "module", "user_line"} <= set(top.columns)
    # the top storages were alive at the peak
    assert ((top.alloc_seq <= pk.seq) & (top.storage >= 0)).all()


def test_memory_frame_shape(mlp_trace):
    mem = mlp_trace.memory()
    assert len(mem) == mlp_trace.num_ops
    assert list(mem.columns[:3]) == ["device", "seq", "phase"]
    assert (mem[list(fv.CATEGORIES)].sum(axis=1) == mem.total).all()
    assert (mem.total.to_numpy() == mlp_trace.live_bytes()["cpu"]).all()


# ------------------------------------------------------------------ vs MemTracker
def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    # few tokens and a large tied vocabulary: the peak falls inside backward, while the
    # tied embedding's two gradient contributions are added up
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2000, n_positions=64, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg), torch.randint(0, 2000, (1, 8))


def test_gradients_at_the_peak_vs_memtracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    m, ids = _gpt2()
    mt = MemTracker()
    mt.track_external(m)
    with mt:
        m(ids, labels=ids).loss.backward()
    theirs = {str(k).split(".")[-1]: v for k, v in next(iter(mt.get_tracker_snapshot("peak").values())).items()}
    m.zero_grad(set_to_none=True)
    gc.collect()
    with fv.record(fake=False, modules=[m]) as trace:
        m(ids, labels=ids).loss.backward()
    pk = trace.peak()["cpu"]
    ours = pk.by_category
    # the same run, the same bytes at the peak
    assert pk.bytes == theirs["Total"]
    grad_bytes = sum(p.grad.nbytes for p in m.parameters())
    assert ours["Gradient"] == grad_bytes  # at this peak every gradient exists
    # MemTracker counts fewer gradient bytes and more "Temp" by the same amount ...
    missing = ours["Gradient"] - theirs["GRAD"]
    assert missing > 0
    assert theirs["TEMP"] + theirs["ACT"] - (ours["Temporary"] + ours["Activation"] + ours["Input"]) == missing
    # ... and that amount is the tied embedding's gradient, made by the add at the peak op:
    # the storage that add produced is what wte.weight.grad is after backward
    wte = m.transformer.wte.weight
    assert missing == wte.grad.nbytes
    assert pk.op == "aten.add.Tensor" and pk.phase == "backward"
    out = trace.outputs
    peak_out_storage = int(out[out.seq == pk.seq].storage.iloc[0])
    names = trace.strings("names")
    rows = [i for i, n in enumerate(trace.col("p_name").tolist()) if names[n].endswith("transformer.wte.weight")]
    assert int(trace.col("p_grad")[rows[0]]) == peak_out_storage
    assert trace.storages.category.iloc[peak_out_storage] == "Gradient"
    # MemTracker's ACT is every tensor made in a forward; ours is what autograd saved
    assert ours["Activation"] < theirs["ACT"]


def test_inputs_given_as_keyword_arguments():
    m, ids = _gpt2()
    with fv.record(fake=True, modules=[m]) as trace:
        m(input_ids=ids, labels=ids)
    st = trace.storages
    assert st[st.category == "Input"].nbytes.sum() == ids.nbytes


def test_activation_checkpointing_saves_less():
    from torch.utils.checkpoint import checkpoint

    def run(ckpt: bool) -> int:
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)) for _ in range(4)
        )
        x = torch.randn(32, 64)
        with fv.record() as trace:
            h = x
            for b in blocks:
                h = checkpoint(b, h, use_reentrant=False) if ckpt else b(h)
            h.sum().backward()
        return int(trace.memory()["Activation"].max())

    full, ckpt = run(False), run(True)
    assert full > 0 and ckpt < full / 4


# ------------------------------------------------------------------ cuda: allocator in the figures
def _cuda_trace():
    with fv.record(device="cuda:0") as trace:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(1000, 3000), torch.nn.ReLU(), torch.nn.Linear(3000, 10))
        m(torch.randn(33, 1000)).sum().backward()
    return trace


def test_cuda_memory_has_allocated_and_reserved():
    trace = _cuda_trace()
    mem = trace.memory()
    assert {"allocated", "reserved"} <= set(mem.columns)
    # rounding to 512-byte blocks: allocated >= raw bytes, reserved (whole segments) >= allocated
    assert (mem.allocated >= mem.total).all() and (mem.reserved >= mem.allocated).all()
    assert (mem.allocated > mem.total).any()
    pk = trace.peak()["cuda:0"]
    assert pk.allocated == mem.allocated.max() and pk.reserved == mem.reserved.max()
    assert pk.bytes == mem.total.max()


def test_verdict_uses_the_allocator_model():
    trace = _cuda_trace()
    pk = trace.peak()["cuda:0"]
    roomy = trace.verdict(pk.reserved)
    assert roomy["fits"] and roomy["devices"]["cuda:0"]["peak"] == pk.reserved
    # the raw tensor bytes would fit, but the allocator's 512-byte blocks do not
    tight = trace.verdict(pk.bytes)
    assert not tight["fits"] and "cuda:0" in tight["text"]
    assert tight["devices"]["cuda:0"]["raw"] == pk.bytes


# --------------------------------------------------------------------------------------------- KV cache
# A tiny Llama generating N tokens after a prompt of P, greedy (min_new_tokens = max_new_tokens = N): the
# KV cache holds keys and values of P + N - 1 positions at the end (the last token is never fed back).
KV_P, KV_N, KV_B = 5, 4, 2


def _generate(impl: str, *, keep_cache: bool = True) -> dict:
    import arch_zoo

    torch.manual_seed(0)
    model = arch_zoo.build("llama").eval()
    ids = torch.randint(2, model.config.vocab_size, (KV_B, KV_P))
    out = model.generate(
        ids, max_new_tokens=KV_N, min_new_tokens=KV_N, do_sample=False, cache_implementation=impl,
        return_dict_in_generate=keep_cache, pad_token_id=0,
    )  # fmt: skip
    return {"model": model, "out": out}


def _kv_bytes(cfg, positions: int, dtype_size: int = F32) -> int:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * KV_B * cfg.num_key_value_heads * head_dim * positions * dtype_size


@pytest.fixture(scope="module", params=["dynamic", "static"])
def kv_traces(request):
    traces = {}
    for fake in (False, True):
        gc.collect()
        with fv.record(fake=fake) as trace:
            got = _generate(request.param)
        traces[fake] = (trace, got)
    return request.param, traces


def test_kv_cache_bytes_match_the_formula_fake_and_real(kv_traces):
    impl, traces = kv_traces
    (real, got), (fake, _) = traces[False], traces[True]
    cfg = got["model"].config
    expected = _kv_bytes(cfg, KV_P + KV_N - 1)
    for trace in (real, fake):
        mem = trace.memory()
        # the cache is returned (return_dict_in_generate): alive at the end, exactly the formula
        assert mem["KV cache"].iloc[-1] == expected
        st = trace.storages
        kv = st[st.category == "KV cache"]
        assert (kv.phase == "forward").all()
        assert kv.roles.str.contains("kv_cache").all()
        assert (kv.free_seq == -1).sum() == 2 * cfg.num_hidden_layers  # the returned cache's keys and values
        # StaticCache allocates every position in the prefill call; DynamicCache grows by torch.cat
        assert set(kv.op) == ({"aten.zeros.default"} if impl == "static" else {"aten.cat.default"})
    # fake == real, op by op
    assert real.memory()["KV cache"].tolist() == fake.memory()["KV cache"].tolist()
    assert real.storages.category.tolist() == fake.storages.category.tolist()
    if impl == "dynamic":
        # each cat holds a layer's old and grown tensor at once: the most is at the last layer's values
        # in the last step, all else grown and that one tensor of P + N - 2 positions still alive
        one_old = _kv_bytes(cfg, KV_P + KV_N - 2) // (2 * cfg.num_hidden_layers)
        assert real.memory()["KV cache"].max() == expected + one_old
    else:
        assert real.memory()["KV cache"].max() == expected


def test_generation_steps_are_marked(kv_traces):
    from fakeviz.views import memory_timeline_figure

    impl, traces = kv_traces
    (real, got), fake = traces[False], traces[True][0]
    cfg = got["model"].config
    steps = real.meta["steps"]
    assert [s[2] for s in steps] == ["prefill", *(f"decode {i}" for i in range(1, KV_N))]
    assert steps == fake.meta["steps"]
    ops = real.ops
    for first, stop, _ in steps:  # each step is one top-level forward of the model
        assert first < stop and set(ops.phase.iloc[first:stop]) == {"forward"}
    # at each step's end: one position more per step (dynamic), every position from the prefill on (static)
    mem = real.memory()["KV cache"]
    ends = [int(mem.iloc[stop - 1]) for _, stop, _ in steps]
    if impl == "dynamic":
        assert ends == [_kv_bytes(cfg, KV_P + k) for k in range(KV_N)]
    else:
        assert ends == [_kv_bytes(cfg, KV_P + KV_N - 1)] * KV_N
    fig = memory_timeline_figure(real)
    assert [sh.name for sh in fig.layout.shapes if sh.type == "line" and sh.name][: len(steps)] == [s[2] for s in steps]


def test_kv_cache_freed_with_generate_output():
    """Without return_dict_in_generate the cache dies when generate returns: KV cache bytes end at 0."""
    gc.collect()
    with fv.record() as trace:
        got = _generate("dynamic", keep_cache=False)
    cfg = got["model"].config
    st = trace.storages
    kv = st[st.category == "KV cache"]
    assert (kv.free_seq >= 0).all() and kv.free_seq.max() == len(trace.ops)  # freed after the last op
    assert trace.memory()["KV cache"].iloc[-1] == _kv_bytes(cfg, KV_P + KV_N - 1)  # alive at the last op


def test_kv_cache_in_a_hand_written_decode_loop():
    """model(ids, use_cache=True) returns a new cache (prefill); feeding it back is a decode step."""
    import arch_zoo

    for fake in (False, True):
        gc.collect()
        with fv.record(fake=fake) as trace:
            torch.manual_seed(0)
            model = arch_zoo.build("llama").eval()
            ids = torch.randint(2, model.config.vocab_size, (KV_B, KV_P))
            with torch.no_grad():
                out = model(ids, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
                out = model(nxt, cache=out.cache, use_cache=True)
                model(nxt, use_cache=False)  # no cache: not a step
        assert [s[2] for s in trace.meta["steps"]] == ["prefill", "decode 1"]
        assert trace.memory()["KV cache"].iloc[-1] == _kv_bytes(model.config, KV_P + 1)
        del out
