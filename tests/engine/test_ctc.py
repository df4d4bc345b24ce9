"""CTC loss under fake tensors (Note: [cuDNN CTC under fake tensors], Note: [strides of the real kernel]).

On the CPU, ``F.ctc_loss`` forward and backward record the same op log as a real run, for int64 and int32
targets and a transposed (non-contiguous) ``log_probs`` as CTC heads pass it. On fake ``cuda:0`` the choice
between cuDNN's kernel and the native one is the C++ dispatcher's (``_use_cudnn_ctc_loss``), made from the
arguments' metadata and, where known, the lengths' values; unknown lengths are a stated assumption.
"""

from __future__ import annotations

import gc

import arch_zoo
import pytest
import torch
import torch.nn.functional as F
from oplog_diff import first_diff, window_diff

import fakeviz as fv
from fakeviz._analysis.fidelity import op_rule
from fakeviz._engine.ctc import FAKE_RULE_OPS, use_cudnn_ctc_loss

T, B, C, S = 50, 3, 20, 10


def _ctc_step(target_dtype: torch.dtype, lengths: str = "tensor") -> torch.Tensor:
    torch.manual_seed(0)
    logits = torch.randn(B, T, C, requires_grad=True)
    log_probs = F.log_softmax(logits, -1, dtype=torch.float32).transpose(0, 1)  # [T, B, C], not contiguous
    targets = torch.randint(1, C, (B * S,), dtype=target_dtype)
    if lengths == "tensor":
        il = torch.full((B,), T, dtype=target_dtype)
        tl = torch.full((B,), S, dtype=target_dtype)
    else:
        il, tl = [T] * B, [S] * B
    loss = F.ctc_loss(log_probs, targets, il, tl)
    loss.backward()
    return loss


@pytest.mark.parametrize("lengths", ["tensor", "list"])
@pytest.mark.parametrize("target_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
def test_ctc_loss_fwd_bwd_fake_equals_real_on_cpu(target_dtype: torch.dtype, lengths: str) -> None:
    logs = {}
    for fake in (False, True):
        gc.collect()
        with fv.record(fake=fake) as trace:
            _ctc_step(target_dtype, lengths)
        assert trace.error is None, trace.error
        logs[fake] = (trace.oplog_lines(), trace.peak_bytes()["cpu"]["bytes"])
    (real, real_peak), (fake, fake_peak) = logs[False], logs[True]
    i = first_diff(real, fake)
    assert i is None, f"op logs differ first at op {i}:\n{window_diff(real, fake, i)}"
    assert any("_ctc_loss_backward" in line for line in fake)
    assert real_peak == fake_peak


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_ctc_loss_with_list_lengths_fake_equals_real(batched: bool, reduction: str) -> None:
    """Lengths as Python lists and reduction="mean": torch's C++ fills a tensor through its data pointer, which a
    fake tensor does not have; the fake run does the same ops in Python (Note: [cuDNN CTC under fake tensors])."""

    def step() -> None:
        torch.manual_seed(0)
        logits = torch.randn(B if batched else 1, T, C, requires_grad=True)
        lp = logits.log_softmax(-1).transpose(0, 1)
        if not batched:
            lp = lp[:, 0]
        n = B if batched else 1
        targets = torch.randint(1, C, (n * S,) if batched else (S,))
        loss = F.ctc_loss(lp, targets, [T] * n if batched else [T], [S] * n if batched else [S], reduction=reduction)
        loss.sum().backward()

    logs = {}
    for fake in (False, True):
        gc.collect()
        with fv.record(fake=fake) as trace:
            step()
        assert trace.error is None, trace.error
        logs[fake] = trace.oplog_lines()
    i = first_diff(logs[False], logs[True])
    assert i is None, f"op logs differ first at op {i}:\n{window_diff(logs[False], logs[True], i)}"
    assert torch.ctc_loss is torch._C._VariableFunctions.ctc_loss  # the patch is gone after the session


def test_log_softmax_backward_has_the_real_kernels_strides() -> None:
    """torch's decomposition follows a transposed grad's strides; the real kernels return a contiguous tensor."""
    grad, out = torch.randn(39, 2, 32).transpose(0, 1), torch.randn(2, 39, 32)
    real = torch.ops.aten._log_softmax_backward_data(grad, out, -1, torch.float32)
    with fv.record():
        fake = torch.ops.aten._log_softmax_backward_data(grad, out, -1, torch.float32)
    assert real.is_contiguous()
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)


def _ops_of(trace: fv.Trace) -> list[str]:
    return list(trace.ops["op"])


@pytest.mark.parametrize(
    ("target_dtype", "cudnn"), [(torch.int64, False), (torch.int32, True)], ids=["int64-native", "int32-cudnn"]
)
def test_fake_cuda_takes_the_kernel_a_cuda_build_takes(target_dtype: torch.dtype, cudnn: bool) -> None:
    with fv.record(device="cuda:0") as trace:
        loss = _ctc_step(target_dtype)
    assert trace.error is None, trace.error
    assert loss.device == torch.device("cuda:0")
    ops = _ops_of(trace)
    assert "aten._use_cudnn_ctc_loss.Tensor" in ops
    assert ("aten._cudnn_ctc_loss.Tensor" in ops) == cudnn
    assert ("aten._ctc_loss.Tensor" in ops) == (not cudnn)
    assert len(trace.fidelity()["fallbacks"]) == 0  # no real kernel run on zeros
    assumptions = " ".join(trace.fidelity()["assumptions"]["assumption"])
    # the lengths were made from Python numbers: known values, no assumption about them
    assert "assumed valid for cuDNN" not in assumptions
    if cudnn:
        assert "workspace" in assumptions  # what the record does not hold, named


def test_cudnn_ctc_outputs_are_the_kernels() -> None:
    with fv.record(device="cuda:0"):
        lp = torch.randn(T, B, C).log_softmax(-1)
        targets = torch.randint(1, C, (B * S,), dtype=torch.int32)
        il = torch.full((B,), T, dtype=torch.int32)
        tl = torch.full((B,), S, dtype=torch.int32)
        costs, grad = torch.ops.aten._cudnn_ctc_loss.Tensor(lp.transpose(0, 1).transpose(0, 1), targets, il, tl,
                                                            0, True, False)  # fmt: skip
        nl = torch.randn(T, B, C).log_softmax(-1).transpose(0, 1)  # [B, T, C] view: grad is still contiguous
        with pytest.raises(RuntimeError, match="blank must be label 0"):
            torch.ops.aten._cudnn_ctc_loss.Tensor(lp, targets, il, tl, 3, True, False)
        with pytest.raises(RuntimeError, match="scalar type Int"):
            torch.ops.aten._cudnn_ctc_loss.Tensor(lp, targets.long(), il, tl, 0, True, False)
        _, g2 = torch.ops.aten._cudnn_ctc_loss.Tensor(nl.transpose(0, 1), targets, il, tl, 0, True, False)
    assert costs.shape == (B,) and costs.dtype == torch.float32 and costs.device.type == "cuda"
    assert grad.shape == (T, B, C) and grad.is_contiguous()
    assert g2.is_contiguous()


def test_lengths_decide_cudnn_when_known() -> None:
    """Known lengths: cuDNN only when every target length is below 256 and within its input length."""
    with fv.record(device="cuda:0"):
        lp = torch.randn(300, 2, C).log_softmax(-1)
        t = torch.randint(1, C, (2 * 260,), dtype=torch.int32)
        ok = use_cudnn_ctc_loss(lp, t, torch.tensor([300, 300], dtype=torch.int32),
                                torch.tensor([255, 255], dtype=torch.int32), 0)  # fmt: skip
        long_target = use_cudnn_ctc_loss(lp, t, torch.tensor([300, 300], dtype=torch.int32),
                                         torch.tensor([256, 10], dtype=torch.int32), 0)  # fmt: skip
        past_input = use_cudnn_ctc_loss(lp, t, torch.tensor([300, 5], dtype=torch.int32),
                                        torch.tensor([10, 10], dtype=torch.int32), 0)  # fmt: skip
        blank = use_cudnn_ctc_loss(lp, t, torch.tensor([300, 300], dtype=torch.int32),
                                   torch.tensor([10, 10], dtype=torch.int32), 1)  # fmt: skip
        half = use_cudnn_ctc_loss(lp.half(), t, torch.tensor([300, 300], dtype=torch.int32),
                                  torch.tensor([10, 10], dtype=torch.int32), 0)  # fmt: skip
        with torch.backends.cudnn.flags(enabled=False):
            disabled = use_cudnn_ctc_loss(lp, t, torch.tensor([300, 300], dtype=torch.int32),
                                          torch.tensor([10, 10], dtype=torch.int32), 0)  # fmt: skip
        # the int-list overload (a plain tensor's call): cpu targets, every input length the full length
        lists = use_cudnn_ctc_loss(lp, t.cpu(), [300, 300], [10, 10], 0)
        short_input = use_cudnn_ctc_loss(lp, t.cpu(), [300, 299], [10, 10], 0)
    assert (ok, long_target, past_input, blank, half, disabled) == (True, False, False, False, False, False)
    assert (lists, short_input) == (True, False)


def test_unknown_lengths_are_an_assumption() -> None:
    with fv.record(device="cuda:0") as trace:
        lp = torch.randn(T, B, C).log_softmax(-1)
        targets = torch.randint(1, C, (B * S,), dtype=torch.int32)
        il = torch.randint(T - 5, T, (B,), dtype=torch.int32)  # a draw on the GPU: values unknown
        tl = torch.randint(1, S, (B,), dtype=torch.int32)
        F.ctc_loss(lp, targets, il, tl)
    assert trace.error is None, trace.error
    a = trace.fidelity()["assumptions"]
    assert any("assumed valid for cuDNN" in x for x in a["assumption"])
    assert "aten._cudnn_ctc_loss.Tensor" in _ops_of(trace)


def test_fidelity_names_the_rules() -> None:
    for op in FAKE_RULE_OPS:
        assert op_rule(op) == "fakeviz rule", op


def test_wav2vec2_on_fake_cuda_takes_the_native_kernel() -> None:
    """Wav2Vec2ForCTC passes int64 labels: a CUDA build runs the native kernel; the record says so."""
    with fv.record(device="cuda:0", dtype=torch.bfloat16) as trace:
        arch_zoo.run("wav2vec2", "tiny")
    assert trace.error is None, trace.error
    ops = _ops_of(trace)
    assert "aten._use_cudnn_ctc_loss.Tensor" in ops and "aten._ctc_loss.Tensor" in ops
    assert "aten._ctc_loss_backward.Tensor" in ops and "aten._cudnn_ctc_loss.Tensor" not in ops


def test_known_unequal_target_lengths_size_log_alpha_exactly() -> None:
    """log_alpha is [B, T, 2 * max(target_lengths) + 1]: with known lengths, the real size and no assumption."""

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        lp = torch.randn(T, B, C).log_softmax(-1)
        targets = torch.randint(1, C, (3 + 9 + 4,))
        return torch.ops.aten._ctc_loss.Tensor(lp, targets, torch.tensor([T] * B), torch.tensor([3, 9, 4]))

    _, real_alpha = step()
    with fv.record() as trace:
        _, fake_alpha = step()
    assert tuple(fake_alpha.shape) == tuple(real_alpha.shape) == (B, T, 19)
    assert not any("ctc_loss" in a for a in trace.fidelity()["assumptions"]["assumption"])
