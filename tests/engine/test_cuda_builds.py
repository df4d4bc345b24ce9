"""Fake cuda on each kind of torch build (fakeviz._engine.cuda_shim): a CPU-only build, a CUDA build that sees no
GPU (Note: [fake cuda on a CUDA build without a GPU]) and a CUDA build with GPUs (torch's own guard).

The suite runs on the pinned CPU wheel and, in CI, on the newest default wheel (a CUDA build, no GPU here):
each test checks what holds on the build it runs on, and the status must name that build."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import fakeviz as fv
from fakeviz._engine import cuda_shim, session

CUDA_BUILD = torch.backends.cuda.is_built()
REAL_GPUS = torch.cuda.device_count() if CUDA_BUILD else 0


def test_the_status_names_the_build_and_the_path() -> None:
    st = fv.fake_cuda_status()
    assert st.build == ("cuda" if CUDA_BUILD else "cpu") and st.real_gpus == REAL_GPUS
    assert st.torch_version == torch.__version__
    if REAL_GPUS:
        assert st.mode == "native" and st.device_count == REAL_GPUS and "nothing of torch is replaced" in st.reason
    else:
        assert st.mode == "shim" and st.device_count == 64 and st.backward_max_index == 63
        assert ("sees no GPU" if CUDA_BUILD else "CPU-only build") in st.reason


@pytest.mark.skipif(REAL_GPUS > 0, reason="a machine with GPUs serves fake cuda with torch's own guard")
@pytest.mark.parametrize("device", ["cuda:0", "cuda:63"])
def test_training_step_on_any_fake_gpu(device: str) -> None:
    with fv.record(device=device, gpus=64) as trace:
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        opt = torch.optim.AdamW(m.parameters())
        m(torch.randn(8, 16)).sum().backward()
        opt.step()
        assert torch.cuda.get_device_capability() == (9, 0) and torch.cuda.device_count() == 64
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())  # reaches no driver
    assert trace.error is None and trace.peak()[device].by_category["Optimizer state"] == 2 * 4 * (
        16 * 32 + 32 + 32 * 4 + 4
    )


@pytest.mark.skipif(not CUDA_BUILD or REAL_GPUS > 0, reason="a CUDA build that sees no GPU")
def test_outside_a_session_a_cuda_build_answers_as_always() -> None:
    """Only hasPrimaryContext changed in the build's hooks: initialisation still says what the driver says, in a
    process that never recorded and in one that did."""
    code = textwrap.dedent(
        """
        import torch
        def init():
            try:
                torch.cuda.init()
            except RuntimeError as exc:
                return str(exc)[:40]
        before = init()
        import fakeviz as fv
        with fv.record(device="cuda:0"):
            torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum().backward()
        print(repr((before, init(), torch.cuda.is_available(), torch.cuda.device_count())))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, available, count = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert before == after == "Found no NVIDIA driver on your system. P"
    assert (available, count) == (False, 0)


def test_native_attention_is_the_math_path_where_the_build_cannot_choose() -> None:
    """``attention="native"`` on fake cuda: a CPU-only build and a CUDA build without a GPU run the math path
    (on a CUDA build the session's patch does it: registry entry ``sdpa-native``)."""
    if REAL_GPUS:
        pytest.skip("with a GPU the build chooses for itself")
    with fv.record(device="cuda:0", attention="native", dtype=torch.bfloat16) as trace:
        q = torch.randn(1, 4, 64, 32, requires_grad=True)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    ops = set(trace.ops.op)
    assert "aten._scaled_dot_product_attention_math.default" in ops or "aten._safe_softmax.default" in ops, ops
    assert not {o for o in ops if "flash" in o or "efficient" in o or "cudnn" in o}


def test_with_real_gpus_indices_past_them_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA build with 2 GPUs torch's own guard serves cuda:0 and cuda:1 only: a larger index is a one-line
    error before anything runs (a machine with GPUs is simulated by the status alone: nothing else reads it)."""
    native = cuda_shim.ShimStatus(mode="native", device_count=2, backward_max_index=1, build="cuda", real_gpus=2)
    monkeypatch.setattr(cuda_shim, "_status", native)
    session.check_device("cuda:1")
    with pytest.raises(ValueError, match=r"cuda:0 \.\. cuda:1 \(torch's own CUDA guard serves this machine's 2 GPU"):
        session.check_device("cuda:2")
