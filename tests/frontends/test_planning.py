"""fakeviz.plan / sweep / max_batch / compare (``fakeviz/_frontends/planning.py``, Note: [balanced placement]).

A 2-layer Llama-3.1-8B (the published widths, two blocks) is placed on fake GPUs and run as placed. Figures are
checked against hand sums over the parameters placed on each device, accelerate's own device-map functions,
and recordings made directly at the batch ``max_batch`` returns and one above.
"""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv
import fakeviz.models
from fakeviz._analysis import placement
from fakeviz._core.gpus import parse_gpus

pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return fv.models.build("meta-llama/Llama-3.1-8B", num_hidden_layers=2, device="cuda:0")


def _bytes_on(model: torch.nn.Module, device: str) -> int:
    seen = {}
    for t in [*model.parameters(), *model.buffers()]:
        if str(t.device) == device:
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


@pytest.mark.parametrize("device_map", ["balanced", "auto", "sequential"])
def test_weights_per_device_are_the_parameters_placed_there(llama: torch.nn.Module, device_map: str) -> None:
    p = fv.plan(llama, gpus="2x12GB", device_map=device_map, batch=1, seq=256)
    assert p.trace.error is None
    peaks = p.peaks.set_index("device")
    # p.module is the plan's copy of the model, placed as the plan ran it; the user's model is not moved
    assert p.module is not llama
    assert _bytes_on(llama, "cuda:1") == 0
    for dev in ("cuda:0", "cuda:1"):
        assert peaks.loc[dev, "weights"] == _bytes_on(p.module, dev), dev
        assert peaks.loc[dev, "capacity"] == 12 * 10**9
        assert peaks.loc[dev, "headroom"] == peaks.loc[dev, "capacity"] - peaks.loc[dev, "peak"]
    assert set(p.device_map.values()) <= {"cuda:0", "cuda:1"}
    assert p.fits and p.verdict["fits"]
    assert p.settings["device_map_kind"] == device_map


def test_auto_and_sequential_are_the_maps_transformers_and_accelerate_compute(llama: torch.nn.Module) -> None:
    """ "auto": what ``from_pretrained(device_map="auto", max_memory=...)`` resolves (transformers' own
    get_balanced_memory, then infer_auto_device_map); "sequential": accelerate's infer_auto_device_map with
    the capacities as max_memory (transformers passes them through get_max_memory unchanged)."""
    from accelerate.utils import infer_auto_device_map
    from transformers.integrations import accelerate as hf_accelerate

    from fakeviz._frontends.planning import _machine, _own_mode

    caps = parse_gpus(["6GB", "6GB", "6GB"])
    max_memory = {i: c.bytes for i, c in enumerate(caps)}
    with _own_mode(llama):
        llama.to("cpu")
    no_split = llama._no_split_modules
    with _machine(len(caps)):  # both ask torch.cuda how many GPUs there are
        balanced = hf_accelerate.get_balanced_memory(llama, max_memory=dict(max_memory),
                                                     no_split_module_classes=no_split)  # fmt: skip
        auto = hf_accelerate.infer_auto_device_map(llama, max_memory=balanced, no_split_module_classes=no_split)
        seq = infer_auto_device_map(llama, max_memory=dict(max_memory), no_split_module_classes=no_split)
    p_auto = fv.plan(llama, gpus=["6GB"] * 3, device_map="auto", batch=1, seq=128)
    p_seq = fv.plan(llama, gpus=["6GB"] * 3, device_map="sequential", batch=1, seq=128)
    assert p_auto.device_map == {k: f"cuda:{v}" for k, v in auto.items()}
    assert p_seq.device_map == {k: f"cuda:{v}" for k, v in seq.items()}
    assert len(set(p_auto.device_map.values())) > 1  # auto spreads the weights
    assert set(p_seq.device_map.values()) == {"cuda:0"}  # sequential fills the first GPU: here all of it
    assert p_auto.fits and p_seq.fits


def test_balanced_evens_the_peaks_that_weights_alone_do_not() -> None:
    """Inference on two GPUs: accelerate's auto map balances weights, so the GPU with the head also holds the
    logits (batch x seq x vocab) on top; balanced evens the measured peaks."""
    model = fv.models.build("meta-llama/Llama-3.1-8B", num_hidden_layers=4, device="cuda:0")
    peaks = {}
    for dm in ("auto", "balanced"):
        p = fv.plan(model, gpus="2x40GB", device_map=dm, batch=4, seq=1024)
        assert p.trace.error is None
        pk = p.peaks.peak.to_numpy()
        peaks[dm] = pk.max() / pk.min()
    assert peaks["balanced"] < peaks["auto"] and peaks["auto"] > 1.15
    assert peaks["balanced"] < 1.1


def test_transfers_are_recorded_ops(llama: torch.nn.Module) -> None:
    p = fv.plan(llama, gpus="2x40GB", device_map={"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1,
                                                   "model.norm": 1, "model.rotary_emb": 0, "lm_head": 1},
                batch=2, seq=128)  # fmt: skip
    t = p.transfers.set_index(["src", "dst"])
    hidden = 2 * 128 * llama.config.hidden_size * 2  # bf16 hidden states [2, 128, 4096]
    assert t.loc[("cuda:0", "cuda:1"), "bytes"] >= hidden
    ops = p.trace.ops
    copies = ops[(ops.op == "aten._to_copy.default") & (ops.device == "cuda:1")]
    assert len(copies) >= t.loc[("cuda:0", "cuda:1"), "copies"]


def test_heterogeneous_gpus(llama: torch.nn.Module) -> None:
    p = fv.plan(llama, gpus=["20GB", "10GiB"], batch=1, seq=128)
    caps = p.peaks.set_index("device").capacity
    assert caps["cuda:0"] == 20 * 10**9 and caps["cuda:1"] == 10 * 2**30


def test_max_batch_is_b_fits_and_b_plus_one_does_not(llama: torch.nn.Module) -> None:
    r = fv.max_batch(llama, gpus="2x12GB", seq=1024, train=True, limit=64)
    assert r.value >= 1 and r.plan is not None and r.plan.fits
    assert r.failing is not None and not r.failing.fits and r.failing.first_oom is not None
    assert r.recordings <= 2 * (2 * r.value.bit_length() + 3)  # doubling then bisection
    # recorded directly, with the map the search ended on for each
    at = fv.plan(llama, gpus="2x12GB", seq=1024, train=True, batch=r.value, device_map=r.plan.device_map)
    above = fv.plan(llama, gpus="2x12GB", seq=1024, train=True, batch=r.value + 1, device_map=r.failing.device_map)
    assert at.fits and not above.fits
    assert above.first_oom["device"] in ("cuda:0", "cuda:1")


def test_sweep_builds_once_per_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    from fakeviz._frontends import planning

    builds = []
    real_build = planning._build

    def counting(model, dtype):  # noqa: ANN001, ANN202
        builds.append(dtype)
        return real_build(model, dtype)

    monkeypatch.setattr(planning, "_build", counting)
    cfg = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=1)
    df = fv.sweep(cfg, gpus="2x40GB", batch=[1, 2], seq=[64, 128], dtype=["bf16", "fp32"], progress=False)
    assert len(df) == 8 and len(builds) == 2
    assert {"cuda:0 peak", "cuda:1 peak", "max peak", "fits", "first fails"} <= set(df.columns)
    fp32 = df[df.dtype == "fp32"]["cuda:0 weights"].sum()
    bf16 = df[df.dtype == "bf16"]["cuda:0 weights"].sum()
    assert abs(fp32 / bf16 - 2) < 1e-5  # the same split, parameters twice the bytes (fp32 buffers stay)


def test_checkpointing_lowers_the_training_peak(llama: torch.nn.Module) -> None:
    df = fv.sweep(llama, gpus="1x80GB", batch=4, seq=1024, train=True, checkpointing=[False, True], progress=False)
    plans = df.attrs["plans"]
    assert [p.settings["checkpointing"] for p in plans] == [False, True]
    saved = [int(p.trace.memory(allocator=False)["Activation"].max()) for p in plans]
    assert 0 < saved[1] < saved[0]  # the blocks keep only their inputs (the head's logits stay: not a block)
    model = plans[-1].module
    on = (
        model.is_activation_checkpointing
        if hasattr(model, "is_activation_checkpointing")
        else model.is_gradient_checkpointing
    )
    assert not on  # switched off again after the point


def test_training_plan_is_the_steady_state_step(llama: torch.nn.Module) -> None:
    """A training plan records the step with AdamW's state alive from the start (as from step 2 of a real run):
    its peak equals a direct recording of build, optimizer state, step; and a first step alone peaks lower."""
    from fakeviz._frontends import steps

    p = fv.plan(llama, gpus="1x80GB", batch=8, seq=1024, train=True)

    def direct(init: bool) -> int:
        with fv.record(device="cuda:0", gpu=None) as t:
            model = fv.models.build("meta-llama/Llama-3.1-8B", num_hidden_layers=2)
            opt = steps.make_optimizer("adamw", model)
            if init:
                steps.init_state(opt)
            steps.train(model, fv.models.inputs(model, batch=8, seq=1024, labels=True), optimizer=opt)
        assert t.error is None
        return int(t.peak_bytes()["cuda:0"]["bytes"])

    peak = int(p.trace.peak_bytes()["cuda:0"]["bytes"])  # live bytes (the table's peak adds the allocator's)
    assert peak == direct(init=True)
    assert direct(init=False) < peak  # activations larger than the optimizer's temporaries: step 2 peaks higher
    row = p.peaks.set_index("device").loc["cuda:0"]
    params = sum(t.numel() * t.element_size() for t in p.module.parameters())
    assert row["optimizer"] == 2 * params  # exp_avg and exp_avg_sq, bf16 as the parameters (``step`` on the cpu)


def test_generate_plan_holds_the_kv_cache(llama: torch.nn.Module) -> None:
    """``new_tokens``: prefill, then a decode step per token; the KV cache grows to the keys and values of every
    layer for the tokens the last decode step attends to, by hand from the config."""
    cfg = llama.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv = {}
    for n in (0, 8):
        p = fv.plan(llama, gpus="1x80GB", batch=2, seq=100, new_tokens=n)
        assert p.trace.error is None and p.fits
        kv[n] = int(p.trace.memory(allocator=False)["KV cache"].max())
        assert "generate 8" in repr(p) or n == 0
    per_token = 2 * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2  # k+v, batch 2, bf16
    assert kv[0] == per_token * 100  # a forward alone: transformers fills a cache with the prompt too
    assert per_token * (100 + 8 - 1) <= kv[8] <= 2 * per_token * (100 + 8)  # at most old and grown during a cat


def test_max_batch_on_unequal_gpus(llama: torch.nn.Module) -> None:
    gpus = ["14GB", "9GB"]
    r = fv.max_batch(llama, gpus=gpus, seq=1024, train=True, limit=64)
    assert r.plan is not None and r.plan.fits and r.failing is not None and not r.failing.fits
    caps = r.plan.peaks.set_index("device").capacity
    assert caps["cuda:0"] == 14 * 10**9 and caps["cuda:1"] == 9 * 10**9
    at = fv.plan(llama, gpus=gpus, seq=1024, train=True, batch=r.value, device_map=r.plan.device_map)
    above = fv.plan(llama, gpus=gpus, seq=1024, train=True, batch=r.value + 1, device_map=r.failing.device_map)
    assert at.fits and not above.fits
    peaks = at.peaks.set_index("device")
    assert (peaks.peak <= peaks.capacity).all()


def test_compare_puts_runs_on_one_scale(llama: torch.nn.Module) -> None:
    plans = [fv.plan(llama, gpus="2x40GB", batch=b, seq=256) for b in (1, 4)]
    c = fv.compare(plans)
    t = c.table
    assert len(t) == 4 and set(t.device) == {"cuda:0", "cuda:1"}
    bars = c.bars()
    assert len(bars.data[0].x[0]) == 4  # (run, device) pairs on one axis
    tl = c.timelines()
    ys = [ax for ax in tl.layout if ax.startswith("yaxis")]
    assert len(ys) == 2 and tl.layout.yaxis.range == tl.layout.yaxis2.range or tl.layout.yaxis2.matches == "y"
    assert "Comparison of 2 runs" in repr(c)


def test_bad_inputs_are_clear(llama: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="device_map='even'"):
        fv.plan(llama, gpus="H100", device_map="even")
    with pytest.raises(ValueError, match="unknown GPU or capacity"):
        fv.plan(llama, gpus="4xH900")
    with pytest.raises(ValueError, match="batchsize=\\[1\\]: sweep has no such axis\nDid you mean 'batch'"):
        fv.sweep(llama, gpus="H100", batchsize=[1])


def test_balanced_partition_is_optimal() -> None:
    costs = [5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0]
    order = placement.balanced_partition(costs, [10, 10])
    loads = [sum(c for c, d in zip(costs, order) if d == k) for k in (0, 1)]
    assert order == sorted(order) and max(loads) == 7.0
    order = placement.balanced_partition(costs, [4, 20])  # a small first GPU takes less
    loads = [sum(c for c, d in zip(costs, order) if d == k) for k in (0, 1)]
    assert loads[0] <= 4 or loads[0] / 4 <= loads[1] / 20 + 1e-9
