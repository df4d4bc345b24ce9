"""Planning's one pipeline (issue 34; Note: [planning's pipeline] in ``fakeviz/_frontends/planning.py``): resolve
the model -> measure costs -> choose the placement -> record the step -> read the answers, each stage a function
of plain data, composed by ``plan_point``; ``fv.plan`` and ``fv.simulate`` without private parameters.

A tiny Llama (2 blocks, hidden 64, vocabulary 512, bf16): its units' bytes are computed here from its shapes.
"""

from __future__ import annotations

import inspect

import pytest

import fakeviz as fv
from fakeviz._analysis import placement
from fakeviz._core.gpus import parse_gpus
from fakeviz._frontends import plan_stages, planning
from fakeviz._frontends.distributed import simulate_recipe

pytest.importorskip("transformers")

H, FF, V, KV = 64, 128, 512, 32  # hidden, intermediate, vocabulary, the k/v projections' width (2 heads of 16)


@pytest.fixture(scope="module")
def cfg():  # noqa: ANN201
    return fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=2, hidden_size=H, intermediate_size=FF,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=V, bos_token_id=0,
                            eos_token_id=1)  # fmt: skip


def _by_hand(train: bool) -> dict[str, float]:
    """Each unit's bytes from the shapes: bf16 parameters (x4 in training: gradient and AdamW's two moments) and
    the rotary embedding's two fp32 buffers of head_dim / 2 (inv_freq, original_inv_freq)."""
    k = 4 if train else 1
    block = (2 * H * H + 2 * H * KV + 3 * H * FF + 2 * H) * 2  # q, o; k, v; gate, up, down; two norms
    return {"model.embed_tokens": V * H * 2 * k, "model.layers.0": block * k, "model.layers.1": block * k,
            "model.norm": H * 2 * k, "model.rotary_emb": 2 * (16 // 2) * 4, "lm_head": V * H * 2 * k}  # fmt: skip


def test_public_signatures_hold_no_private_parameters() -> None:
    """issue 34: plan() exposed ``_built`` / ``_costs_from`` and returned ``Any``; simulate() ``_rank_keys``,
    ``_remote``, ``_executor``. The internal entries take them under their own names."""
    for f in (fv.plan, fv.simulate, fv.sweep, fv.max_batch, fv.max_seq, fv.compare):
        assert not [p for p in inspect.signature(f).parameters if p.startswith("_")], f.__name__
    assert inspect.signature(fv.plan).return_annotation == "Plan | Simulation"
    assert {"built", "costs_from"} <= set(inspect.signature(planning.plan_point).parameters)
    assert {"rank_keys", "remote", "executor"} <= set(inspect.signature(simulate_recipe).parameters)


def test_plan_point_takes_plans_arguments_only(cfg) -> None:  # noqa: ANN001
    with pytest.raises(TypeError, match="bogus"):
        planning.plan_point(cfg, gpus="1GB", bogus=1)
    with pytest.raises(TypeError, match="gpus"):
        planning.plan_point(cfg)  # as plan(cfg): gpus has no default
    with pytest.raises(ValueError, match="built= / costs_from= are for a device map"):  # never silently unused
        planning.plan_point(cfg, gpus="2xH100", parallel={"dp_shard": 2}, built=object())


def test_balanced_map_is_a_function_of_costs_alone() -> None:
    names = ["a", "b", "c", "d"]
    even = placement.balanced_map(names, dict.fromkeys(names, 1.0), [10, 10])
    assert even == {"a": "cuda:0", "b": "cuda:0", "c": "cuda:1", "d": "cuda:1"}
    # costs 3,1,1,1 on 4 and 20 bytes: a on cuda:0 alone is 3/4 of it; all on cuda:1 is 6/20, the smaller share
    small_first = placement.balanced_map(names, {"a": 3.0, "b": 1.0, "c": 1.0, "d": 1.0}, [4, 20])
    assert set(small_first.values()) == {"cuda:1"}
    tied = placement.balanced_map(names, dict.fromkeys(names, 1.0), [10, 10], {"d": "a"})  # d shares a's weight
    assert tied == {**even, "d": "cuda:0"}


def test_measure_costs_by_stage(cfg) -> None:  # noqa: ANN001
    one, two = parse_gpus("1GB"), parse_gpus("2x1GB")
    built = plan_stages.resolve_model(cfg, None)
    settings = {"batch": 1, "seq": 32, "train": False, "new_tokens": 0, "checkpointing": False, "offload": None}
    assert plan_stages.measure_costs(built, {"lm_head": 0}, two, settings) == (None, 0)  # a dict map is given
    assert plan_stages.measure_costs(built, "auto", two, settings) == (None, 0)  # accelerate places by weights
    assert plan_stages.measure_costs(built, "balanced", one, settings) == (_by_hand(False), 0)  # one GPU: weights
    train = {**settings, "train": True, "optimizer": "adamw"}
    assert plan_stages.measure_costs(built, "balanced", one, train) == (_by_hand(True), 0)
    costs, probes = plan_stages.measure_costs(built, "balanced", two, settings)  # a probe placed by weights
    assert probes == 1 and list(costs) == list(_by_hand(False))
    assert all(costs[n] >= _by_hand(False)[n] for n in costs)  # the weights, plus what each unit's ops kept live
    assert sum(costs.values()) > sum(_by_hand(False).values())


def test_the_stages_are_the_plan(cfg) -> None:  # noqa: ANN001
    """resolve -> measure -> place -> record -> Plan, called one by one, give fv.plan's map and peaks."""
    gpus = parse_gpus("2x1GB")
    settings = {"batch": 2, "seq": 32, "train": True, "new_tokens": 0, "checkpointing": False, "optimizer": "adamw",
                "offload": None}  # fmt: skip
    built = plan_stages.resolve_model(cfg, None)
    costs, probes = plan_stages.measure_costs(built, "balanced", gpus, settings)
    dm = plan_stages.choose_placement("balanced", built.model, gpus, costs)
    trace = plan_stages.record_step(built, dm, gpus, settings)
    by_stage = plan_stages.Plan(model="cfg", gpus=gpus, device_map=dm, trace=trace, settings=settings)
    p = fv.plan(cfg, gpus="2x1GB", batch=2, seq=32, train=True)
    assert p.recordings == probes + 1 == 2
    assert p.device_map == dm and len(set(dm.values())) == 2
    assert p.peaks.peak.tolist() == by_stage.peaks.peak.tolist()
    # a point that reuses the model and the costs: no build, no probe, the same map
    again = planning.plan_point(cfg, gpus="2x1GB", batch=2, seq=32, train=True, built=built, costs_from=p)
    assert again.recordings == 1 and again.module is built.model and again.device_map == dm
