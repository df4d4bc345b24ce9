"""Optimizers and ``clip_grad_norm_`` take the kernels a real run on the same device takes.

Note: [foreach on fake tensors] (``fakeviz/_engine/session.py``): torch picks its multi-tensor
``_foreach_*`` kernels by ``type(p) in _foreach_supported_types`` and the device type. Without the
session patch, fake parameters (type FakeTensor) always took the per-tensor loop, which on a real
GPU run is not what happens: an H200 run of AdamW on a 4-layer GPT-NeoX peaked 15 % above the fake
record (benchmarks/gpu_accuracy.py; ``tests/engine/test_gpu_golden.py`` pins the real H200 logs).
"""

from __future__ import annotations

import torch
import torch.optim.optimizer as optim_mod
import torch.utils._foreach_utils as foreach_utils
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import fakeviz as fv


def _step(clip: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).square().mean().backward()
    if clip:
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _ops(trace: fv.Trace) -> list[str]:
    return [str(op) for op in trace.ops.op]


def test_fake_cuda_optimizer_takes_foreach_like_a_gpu() -> None:
    with fv.record(device="cuda:0") as trace:
        _step(clip=False)
    names = _ops(trace)
    assert any(n.startswith("aten._foreach_") for n in names), sorted(set(names))
    # the per-tensor loop would run one addcdiv_ per parameter (4 of them)
    assert sum(n == "aten.addcdiv_.Tensor" for n in names) == 0


def test_fake_cpu_equals_real_cpu_with_clip_grad_norm() -> None:
    # on cpu the optimizer loops per tensor but clip_grad_norm_ takes foreach (cpu is in its device list)
    with fv.record(fake=False) as real:
        _step(clip=True)
    with fv.record() as fake:
        _step(clip=True)
    assert "aten._foreach_norm.Scalar" in _ops(real)
    assert fake.oplog_lines() == real.oplog_lines()
    assert fake.peak_bytes() == real.peak_bytes()


def test_lists_restored_after_session_and_after_error() -> None:
    assert FakeTensor not in optim_mod._foreach_supported_types
    assert FakeTensor not in foreach_utils._foreach_supported_types
    try:
        with fv.record(device="cuda:0"):
            assert FakeTensor in optim_mod._foreach_supported_types
            raise KeyError("boom")
    except KeyError:
        pass
    assert FakeTensor not in optim_mod._foreach_supported_types
    assert FakeTensor not in foreach_utils._foreach_supported_types
