"""Fake cuda on each kind of torch build (fakeviz._engine.cuda_shim): a CPU-only build, a CUDA build that sees no
GPU (Note: [fake cuda on a CUDA build without a GPU]) and a CUDA build with GPUs (torch's own guard).

The suite runs on the pinned CPU wheel and, in CI, on the newest default wheel (a CUDA build, no GPU here):
each test checks what holds on the build it runs on, and the status must name that build."""

from __future__ import annotations

import linecache
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

import fakeviz as fv
from fakeviz._engine import cuda_shim, patches, session

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


def _gpus_here(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """A CUDA build that sees ``count`` GPUs, simulated by the status alone (nothing else reads it); the fake cuda
    devices themselves stay the shim's (loaded first), so only fakeviz's own checks can refuse an index."""
    fv.fake_cuda_status()
    native = cuda_shim.ShimStatus(mode="native", device_count=count, backward_max_index=count - 1, build="cuda",
                                  real_gpus=count)  # fmt: skip
    monkeypatch.setattr(cuda_shim, "_status", native)


def test_with_real_gpus_indices_past_them_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA build with 2 GPUs torch's own guard serves cuda:0 and cuda:1 only: a larger index is a short
    error before anything runs."""
    _gpus_here(monkeypatch, 2)
    session.check_device("cuda:1")
    with pytest.raises(session.GPUIndexError, match=r"^cuda:2 is past this machine's 2 GPUs: .* cuda:0 \.\. cuda:1"):
        session.check_device("cuda:2")
    with pytest.raises(ValueError, match=r"^cuda:63 is past this machine's 2 GPUs") as info:
        with fv.record(device="cuda:63"):
            pass
    assert info.value.device == torch.device("cuda:63") and "fv.simulate" in str(info.value)


# Note: [cuda indices past the GPUs]: every way a user names a device, each on the user's line below
def _factory() -> None:
    torch.ones(2, device="cuda:7")


def _to() -> None:
    torch.ones(2).to("cuda:7")


def _module_cuda() -> None:
    torch.nn.Linear(3, 4).cuda(7)


def _device_context() -> None:
    with torch.device("cuda:7"):
        torch.nn.Linear(3, 4)


def _to_empty() -> None:
    torch.nn.Linear(3, 4, device="meta").to_empty(device="cuda:7")


def _tensor() -> None:
    torch.tensor([1.0, 2.0], device="cuda:7")


_WAYS = {f.__name__[1:]: f for f in (_factory, _to, _module_cuda, _device_context, _to_empty, _tensor)}


def _first_line_of(fn: Any) -> tuple[str, str]:
    """The user line a fakeviz error names for the last line of ``fn``, and that line's source."""
    code = fn.__code__
    last = max(line for _, _, line in code.co_lines() if line is not None)
    src = linecache.getline(code.co_filename, last).strip()
    return f"{code.co_filename}:{last} in {code.co_name}", src


def _assert_short(err: BaseException, fn: Any, device: str, count: int) -> None:
    line, src = _first_line_of(fn)
    lines = str(err).splitlines()
    assert isinstance(err, session.GPUIndexError) and isinstance(err, fv.FakeVizError) and isinstance(err, ValueError)
    assert lines[0].startswith(f"{line}: {device} is past this machine's {count} GPU"), lines[0]
    assert lines[1].strip() == src and len(lines) == 3, lines
    assert f"cuda:0 .. cuda:{count - 1} only" in lines[2] and "fv.simulate" in lines[2]
    assert "CPU wheel" in lines[2] and "cuda:0 .. cuda:63" in lines[2]
    assert err.device == torch.device(device) and err.user_line == line


@pytest.mark.parametrize("way", list(_WAYS))
def test_with_real_gpus_a_tensor_past_them_is_one_short_error(
    monkeypatch: pytest.MonkeyPatch, recorder: str, way: str
) -> None:
    """In a record an op that puts a tensor on cuda:7 of a 1-GPU machine raises fakeviz's short error (the user's
    line first; here the recorder's check of each new output device refuses it, on a GPU machine torch's own guard
    refuses it first: the next tests), and leaves nothing patched."""
    before = patches.active()
    _gpus_here(monkeypatch, 1)
    with pytest.raises(session.GPUIndexError) as info:
        with fv.record() as trace:
            _WAYS[way]()
    if REAL_GPUS > 0 and way == "tensor":
        # torch.tensor(data, device=) moves its data before any dispatch: no op, and no frame holds the index (H100)
        line, _ = _first_line_of(_WAYS[way])
        assert str(info.value).startswith(f"{line}: a cuda index is past this machine's 1 GPU"), str(info.value)
    else:
        _assert_short(info.value, _WAYS[way], "cuda:7", 1)
        assert "(op aten." in str(info.value).splitlines()[0] and ", phase init, module <top level>)" in str(info.value)
    assert info.value.trace is trace and trace.error["type"] == "GPUIndexError"
    assert trace.meta["recorder_core"] == recorder
    assert patches.active() == before and torch._guards.detect_fake_mode() is None
    assert not fv.is_fake(torch.ones(1))
    with fv.record() as trace:  # the GPU the machine has still works
        torch.ones(2, device="cuda:0")
    assert trace.error is None and "cuda:0" in set(map(str, trace.ops.device))


# torch's own refusal, as its CUDA guard gives it on a machine with fewer GPUs (FakeTensor's ``init_gpu_context``
# runs ``torch.empty(1, device=device)`` for real): an op whose kernels raise torch's error with the device in their
# locals. Compiled under a "<frozen ...>" name: like torch's guard, they are not the user's code.
_LIB = torch.library.Library("fvgpus_test", "FRAGMENT")
_LIB.define("place(Tensor x, Device device) -> Tensor")
_GUARD: dict[str, Any] = {"torch": torch}
exec(  # noqa: S102 - our own two lines
    compile(
        "def refused(x, device):\n"
        "    raise torch.AcceleratorError('CUDA error: invalid device ordinal\\nGPU device may be out of range, do you"
        " have enough GPUs?\\n')\n",
        "<frozen torch's CUDA guard, played by test_cuda_builds>",
        "exec",
    ),
    _GUARD,
)
_LIB.impl("place", _GUARD["refused"], "Meta")
_LIB.impl("place", _GUARD["refused"], "CPU")  # a record runs an op on small known values for real (values.py)


def _place() -> None:
    torch.ops.fvgpus_test.place(torch.ones(2), torch.device("cuda:7"))


def _raised_outside_dispatch() -> None:
    raise torch.AcceleratorError("CUDA error: invalid device ordinal")  # torch.tensor(data, device=) on a GPU


def test_with_real_gpus_torchs_refusal_becomes_the_short_error_in_fake_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    if fv.fake_cuda_status().mode != "native":
        with pytest.raises(torch.AcceleratorError):  # where fakeviz fakes every index, torch's error is left alone
            with fv.fake_mode():
                _place()
    before = patches.active()
    _gpus_here(monkeypatch, 1)
    with pytest.raises(session.GPUIndexError) as info:
        with fv.fake_mode():
            _place()
    _assert_short(info.value, _place, "cuda:7", 1)
    assert "(op fvgpus_test.place.default)" in str(info.value).splitlines()[0]
    assert isinstance(info.value.__cause__, torch.AcceleratorError)
    with pytest.raises(session.GPUIndexError, match=r"in _raised_outside_dispatch: a cuda index is past this machine"):
        with fv.fake_mode():
            _raised_outside_dispatch()
    assert patches.active() == before and torch._guards.detect_fake_mode() is None


def test_with_real_gpus_torchs_refusal_becomes_the_short_error_in_a_record(
    monkeypatch: pytest.MonkeyPatch, recorder: str
) -> None:
    if fv.fake_cuda_status().mode != "native":
        with pytest.raises(torch.AcceleratorError):  # where fakeviz fakes every index, torch's error is left alone
            with fv.record():
                _place()
    before = patches.active()
    _gpus_here(monkeypatch, 1)
    with pytest.raises(session.GPUIndexError) as info:
        with fv.record() as trace:
            _place()
    _assert_short(info.value, _place, "cuda:7", 1)
    assert "(op fvgpus_test.place.default, phase init, module <top level>)" in str(info.value).splitlines()[0]
    assert isinstance(info.value.__cause__, torch.AcceleratorError) and trace.meta["recorder_core"] == recorder
    assert trace.error["op"] == "fvgpus_test.place.default" and trace.error["type"] == "GPUIndexError"
    assert patches.active() == before and torch._guards.detect_fake_mode() is None


def test_with_real_gpus_a_refusal_outside_dispatch_leaves_a_record_as_the_short_error(
    monkeypatch: pytest.MonkeyPatch, recorder: str
) -> None:
    """On a machine with GPUs torch.tensor(data, device=) moves its real tensor to the device before any dispatch, so
    torch's refusal reaches the record's __exit__, which gives the short error (the user's innermost line)."""
    before = patches.active()
    _gpus_here(monkeypatch, 1)
    with pytest.raises(session.GPUIndexError, match=r"in _raised_outside_dispatch: a cuda index is past this machine"):
        with fv.record() as trace:
            _raised_outside_dispatch()
    assert trace.error["type"] == "GPUIndexError" and "_raised_outside_dispatch" in trace.error["user_line"]
    assert patches.active() == before and torch._guards.detect_fake_mode() is None
