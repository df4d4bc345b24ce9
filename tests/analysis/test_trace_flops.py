"""FLOPs in the trace: recorded per op, agreeing with FlopCounterMode where both count."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fakeviz as fv


@pytest.mark.parametrize("name", ["gpt2_tied", "llama", "convnet_channels_last"])
def test_trace_flops_agree_with_flopcountermode(name):
    import zoo

    gc.collect()
    with FlopCounterMode(display=False) as fc:
        with fv.record(fake=False) as trace:
            zoo.run(name)
    cov = trace.flop_coverage()
    assert (cov.kind != "unknown").all(), cov[cov.kind == "unknown"]
    registry = cov[cov.kind == "registry"].flops.sum()
    assert registry == fc.get_total_flops() and registry > 0
    # we count more: elementwise work and (on cpu) flash attention, which FlopCounterMode counts as 0
    assert cov.flops.sum() > registry
    assert cov[cov.kind == "added"].flops.sum() > 0
    # the layer tree's root holds every forward/backward FLOP made inside the model
    ops = trace.ops
    mt = trace.modules
    root = mt[mt.depth == 0].iloc[0]
    flops = trace.col("flops")
    inside = ops.module.notna().to_numpy()
    fwd = (ops.phase == "forward").to_numpy()
    bwd = (ops.phase == "backward").to_numpy()
    assert root.flops_fwd == flops[inside & fwd & (flops > 0)].sum()
    assert root.flops_bwd == flops[inside & bwd & (flops > 0)].sum()
    assert trace.flops()["forward"] == root.flops_fwd


def test_fake_flops_equal_real():
    import zoo

    out = []
    for fake in (False, True):
        gc.collect()
        with fv.record(fake=fake) as trace:
            zoo.run("llama")
        out.append(trace.col("flops"))
    assert (out[0] == out[1]).all()


def test_symbolic_size_gives_no_figure():
    with fv.record(symbolic=True) as trace:
        x = torch.empty(16)  # values unknown (Note: [values under fake tensors])
        y = x[x > 0]  # data-dependent length u0
        (y * 2).sum()
    ops = trace.ops
    mul = ops[ops.op == "aten.mul.Tensor"].seq.iloc[0]
    assert trace.col("flops")[mul] == -1
    assert trace.modules.empty or True
