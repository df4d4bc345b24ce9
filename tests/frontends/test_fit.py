"""fv.fit: the budget search (Note: [the budget search] in fakeviz/_frontends/fit.py) on a tiny Llama."""

from __future__ import annotations

import math

import pytest

import fakeviz as fv
from fakeviz._core.errors import ArgumentError

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip
MIB = 1 << 20


@pytest.fixture(scope="module")
def cfg():
    return fv.models.config("meta-llama/Llama-3.1-8B", **TINY)


def test_fit_returns_only_what_fits_ranked_and_each_plan_is_plans_own(cfg) -> None:
    # logits of 8 x 64 tokens x 256 vocab in fp32 are 0.5 MiB, their grad as much again: under the caching allocator
    # (2 MiB segments) some micro-batches of batch 8 need more segments than 3 MiB holds, micro-batch 1 does not
    df = fv.fit(cfg, gpus="3MB", seq=64, batch=8, progress=False, executor=False)
    tried = df.attrs["tried"]
    assert len(df) >= 1 and df.attrs["message"] == ""
    assert (~tried.fits).any() and tried.fits.any()  # the capacity cuts through the micro-batches
    cap = 3 * 10**6
    for (_, row), p in zip(df.iterrows(), df.attrs["plans"]):
        assert p.fits and row["max peak"] <= cap and row["headroom"] == cap - row["max peak"]
        assert row["micro_batch"] * row["accumulation"] == 8 and row["layout"] == "1 GPU"
        again = fv.plan(cfg, gpus="3MB", seq=64, batch=row["micro_batch"], train=True,
                        checkpointing=row["checkpointing"])  # fmt: skip
        assert again.trace.peak_bytes() == p.trace.peak_bytes()
        # the search took the largest micro-batch that fits with these knobs: the next candidate was tried and failed
        bigger = [b for b in (1, 2, 4, 8) if b > row["micro_batch"]]
        if bigger:
            same = (tried.checkpointing == row["checkpointing"]) & (
                tried.offload.fillna("-") == (row["offload"] or "-")
            )
            above = tried[(tried.micro_batch == bigger[0]) & same]
            assert len(above) == 1 and not above.fits.iloc[0]
    assert list(df["rank"]) == list(range(1, len(df) + 1))
    assert list(df.headroom) == sorted(df.headroom, reverse=True)  # no GPU kind: most headroom first
    # pruned: fewer recordings than every knob at every micro-batch (4 candidates each)
    knobs = len(tried[["checkpointing", "offload"]].astype(str).drop_duplicates())
    assert df.attrs["recordings"] == len(tried) < knobs * 4


def test_with_a_gpu_kind_the_fastest_global_step_comes_first(cfg) -> None:
    df = fv.fit(cfg, gpus="2xH100", seq=32, batch=4, progress=False, executor=False,
                parallel=["balanced", {"dp_shard": 2}])  # fmt: skip
    assert set(df.layout) == {"balanced map over 2 GPUs", "dp_shard 2"}
    assert list(df.global_step_s) == sorted(df.global_step_s)
    assert all(math.isclose(r.global_step_s, r.step_s * r.accumulation) for r in df.itertuples())
    sim = df.attrs["plans"][list(df.layout).index("dp_shard 2")]
    assert isinstance(sim, fv.Simulation) and sim.fits
    # everything fits at the largest micro-batch without checkpointing: one recording per layout (+1: the balanced
    # map over 2 GPUs places by a first run's peaks)
    assert df.attrs["recordings"] == 3 and set(df.checkpointing) == {False}
    assert set(df.micro_batch * df.accumulation * df.dp) == {4}


def test_nothing_fits_gives_an_empty_frame_that_says_what_was_tried(cfg) -> None:
    # every allocation takes at least one 2 MiB segment of the caching allocator: 1 MB holds none
    df = fv.fit(cfg, gpus="1MB", seq=16, batch=2, progress=False, executor=False)
    assert df.empty and "rank" in df.columns
    msg = df.attrs["message"]
    assert msg.startswith("nothing fits 1 x ") and "micro-batch 1" in msg and "checkpointing=True" in msg
    # each knob (checkpointing kind, offload after full checkpointing) fails at the largest micro-batch, then at
    # the smallest: two recordings per knob
    knobs = len(df.attrs["tried"][["checkpointing", "offload"]].astype(str).drop_duplicates())
    assert df.attrs["recordings"] == 2 * knobs and knobs >= 2


def test_fit_refuses_what_it_cannot_split(cfg) -> None:
    with pytest.raises(ArgumentError, match="multiply to the GPU count"):
        fv.fit(cfg, gpus="4xH100", parallel=[{"dp_shard": 2}], progress=False)
    with pytest.raises(ArgumentError, match="not divisible by the data-parallel degree 4"):
        fv.fit(cfg, gpus="4xH100", batch=6, parallel=[{"dp_shard": 4}], progress=False)
    with pytest.raises(ArgumentError, match="batch"):
        fv.fit(cfg, gpus="H100", batch=0, progress=False)
    with pytest.raises(ArgumentError, match="dtype='bf17'"):  # refused once, not failed in every configuration
        fv.fit(cfg, gpus="H100", dtype="bf17", progress=False)
    with pytest.raises(ArgumentError, match="executor"):
        fv.fit(cfg, gpus="H100", executor="pool", progress=False)
    module = fv.models.build(cfg, device="cuda:0")
    with pytest.raises(ArgumentError, match="device map only"):
        fv.fit(module, gpus="2xH100", parallel=[{"dp_shard": 2}], progress=False)
