"""Note: [threads] (``fakeviz/_engine/patches.py``): a record belongs to the thread that opened it. Another thread
running real CPU code meanwhile gets torch's own answers and numbers, its modules and ops stay out of the trace;
a second record in another thread is refused with one line; a fake session in another thread answers as its own
GPU; nothing is left patched."""

from __future__ import annotations

import copy
import sys
import threading
from importlib import import_module
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_patches import OWNERS  # the modules and classes fakeviz changes something of

import fakeviz as fv
from fakeviz._engine import patches

_KEEP: list[Any] = []  # keeps every snapshotted value alive, so `is` compares objects, never recycled ids


def _snapshot() -> dict[str, Any]:
    """Every attribute of test_patches' owners, the foreach type lists and the fake-rule table (as test_patches'
    child process snapshots them; here in this process, fakeviz imported)."""
    out: dict[str, Any] = {}
    for path in OWNERS:
        parts = path.split(".")
        obj: Any = None
        for i in range(len(parts), 0, -1):
            try:
                obj = import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for part in parts[i:]:
                obj = getattr(obj, part)
            break
        if obj is None:
            continue
        for k, v in list(vars(obj).items()):
            if isinstance(obj, type) and k.startswith("cache_") and isinstance(v, int):
                continue  # torch's own dispatch-cache counters
            _KEEP.append(v)
            out[f"{path}.{k}"] = v
    for i, lst in enumerate((sys.modules["torch.optim.optimizer"]._foreach_supported_types,
                             sys.modules["torch.utils._foreach_utils"]._foreach_supported_types)):  # fmt: skip
        out[f"foreach-list-{i}"] = tuple(lst)
    out.update({f"fake-rule:{op}": rule for op, rule in torch._subclasses.fake_impls.op_implementations_dict.items()})
    return out


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    keys = set(before) | set(after)
    return sorted(
        k for k in keys if k not in before or k not in after or (before[k] is not after[k] and before[k] != after[k])
    )


class _A(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.alpha = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha(x).relu()


class _B(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.beta = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.beta(x).tanh()


def _answer(f: Any) -> Any:
    try:
        return f()
    except Exception as exc:  # noqa: BLE001 - the answer of a build without CUDA may be an error
        return type(exc).__name__


def _real_step(model: _B, x: torch.Tensor) -> tuple[Any, ...]:
    """Real CPU work that touches what a record replaces: torch.cuda, deepcopy, backward, sdpa, storage resize_."""
    cuda = tuple(_answer(f) for f in (torch.cuda.is_available, torch.cuda.device_count, torch.cuda.is_initialized,
                                      torch.cuda.current_device, torch.cuda.is_bf16_supported))  # fmt: skip
    model.zero_grad()
    loss = model(x).sum()
    torch.autograd.backward(loss)
    twin = copy.deepcopy(model)
    q = x.reshape(1, 2, 4, 4)
    att = F.scaled_dot_product_attention(q, q, q)
    st = torch.zeros(4).untyped_storage()
    st.resize_(64)
    return (cuda, loss.item(), model.beta.weight.grad.sum().item(), type(twin.beta.weight).__name__,
            torch.equal(twin.beta.weight, model.beta.weight), att.sum().item(), st.nbytes(),
            type(loss).__name__)  # fmt: skip


def _make_real() -> tuple[_B, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)  # its own generator: the record draws from the process's
    model = _B()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return model, torch.randn(4, 8, generator=gen)


def _fake_steps(steps: int) -> Any:
    with fv.record(device="cuda:0") as trace:
        model = _A()
        for _ in range(steps):
            model(torch.randn(4, 16)).sum().backward()
    return trace


def _ops(trace: Any) -> list[tuple[Any, ...]]:
    cols = ["op", "phase", "module", "shape", "dtype", "device"]
    return [tuple(map(str, row)) for row in trace.ops[cols].itertuples(index=False)]


def test_a_real_cpu_loop_beside_a_record(recorder: str) -> None:
    before = _snapshot()
    model, x = _make_real()
    want = _real_step(model, x)  # the real thread's numbers and torch.cuda answers without any record
    assert want[0][0] is torch.cuda.is_available()
    opened, stop = threading.Event(), threading.Event()
    got: list[tuple[Any, ...]] = []
    errors: list[BaseException] = []

    def real() -> None:
        try:
            opened.wait(60)
            while not stop.is_set():
                got.append(_real_step(model, x))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=real, name="real-cpu")
    t.start()
    try:
        with fv.record(device="cuda:0") as trace:
            a = _A()
            opened.set()
            steps = 0
            # the record keeps running until the real thread has done 20 steps beside it
            while steps < 3 or (len(got) < 20 and not errors and steps < 5000):
                a(torch.randn(4, 16)).sum().backward()
                steps += 1
            inside = len(got)
            assert torch.cuda.is_available() and torch.cuda.get_device_name() == "NVIDIA H100 80GB HBM3"
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert inside >= 20 and set(got) == {want}  # the same numbers and torch.cuda answers, every step
    assert trace.error is None
    # the trace holds the record's own thread's ops only (its backward ran on autograd's cuda thread): the same
    # ops, phases, modules and devices as the same record run alone
    alone = _fake_steps(steps)
    assert _ops(trace) == _ops(alone)
    assert (trace.ops.phase == "backward").sum() > 0
    modules = set(trace.ops.module.dropna().astype(str))
    assert {"_A.alpha", "_A"} <= modules and not any("beta" in m or "_B" in m for m in modules)
    assert set(trace.storages.device.astype(str)) == set(alone.storages.device.astype(str))
    assert _changed(before, _snapshot()) == []  # nothing left patched
    assert {e for e, _, _ in patches.active()} <= {k for k, e in patches.ENTRIES.items() if e.scope == "import"}


def test_a_second_record_in_another_thread_is_refused(recorder: str) -> None:
    before = _snapshot()
    inside, release = threading.Event(), threading.Event()
    traces: list[Any] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with fv.record(device="cuda:0") as tr:
                model = _A()
                model(torch.randn(4, 16)).sum().backward()
                inside.set()
                release.wait(60)
                model(torch.randn(4, 16)).sum().backward()
            traces.append(tr)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            inside.set()

    t = threading.Thread(target=first, name="first-recorder")
    t.start()
    try:
        assert inside.wait(60) and not errors, errors
        during = patches.active()
        with pytest.raises(fv.FakeVizError) as err, fv.record(device="cuda:0"):
            pytest.fail("a second record ran beside the first")
        assert patches.active() == during  # refused before it changed anything
        assert not torch.cuda.is_available() or torch.cuda.device_count() > 0  # this thread: torch's own answers
    finally:
        release.set()
        t.join(60)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("fakeviz: another thread is recording (thread 'first-recorder'); ")
    assert "wait for that record to end, or record in another process" in msg
    assert not errors, errors
    # the first record is whole: the ops of the same block recorded alone
    assert _ops(traces[0]) == _ops(_fake_steps(2))
    with fv.record(device="cuda:0") as again:  # once it ended, this thread records
        _A()(torch.randn(4, 16)).sum().backward()
    assert again.error is None and len(again.ops) == len(_fake_steps(1).ops)
    assert _changed(before, _snapshot()) == []


def test_a_fake_session_in_another_thread_answers_as_its_own_gpu() -> None:
    before = _snapshot()
    seen: list[Any] = []
    errors: list[BaseException] = []
    ready, done = threading.Event(), threading.Event()

    def other() -> None:
        try:
            with fv.fake_mode(device="cuda:1"):
                lin = torch.nn.Linear(4, 4)
                ready.set()
                while not done.is_set() or not seen:
                    lin(torch.randn(2, 4)).sum().backward()  # on fake cuda:1: autograd's cuda:1 thread
                    seen.append((torch.cuda.device_count(), torch.cuda.get_device_name(),
                                 fv.is_fake(lin.weight.grad), str(lin.weight.grad.device)))  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            ready.set()

    t = threading.Thread(target=other, name="fake-session")
    try:
        with fv.record(device="cuda:0", gpu="A100") as trace:
            a = _A()
            a(torch.randn(4, 16)).sum().backward()
            t.start()
            assert ready.wait(60)
            a(torch.randn(4, 16)).sum().backward()  # beside the other session's steps
            mine = (torch.cuda.device_count(), torch.cuda.get_device_name())  # while the other session is open
    finally:
        done.set()
        t.join(60)
    assert not errors, errors
    assert mine == (1, "NVIDIA A100-SXM4-80GB")
    assert set(seen) == {(2, "NVIDIA H100 80GB HBM3", True, "cuda:1")}
    assert _ops(trace) == _ops(_fake_steps(2))  # the other session's modules and ops are not the record's
    assert _changed(before, _snapshot()) == []


@pytest.mark.parametrize("session", ["record", "fake_mode"])
def test_autograd_worker_thread_is_the_sessions_from_its_first_call(session: str) -> None:
    # a hook on the root of a backward on fake cuda runs on autograd's cuda:1 thread before any op of that backward
    # was dispatched there: the worker is found by the session's mode on its stack (patches.watch)
    seen: list[tuple[Any, ...]] = []

    def hook(grad: torch.Tensor) -> torch.Tensor:
        seen.append((threading.current_thread() is threading.main_thread(), torch.cuda.is_available(),
                     torch.cuda.current_device(), torch.cuda.get_device_name()))  # fmt: skip
        return grad

    ctx = fv.record(device="cuda:1", gpu="A100") if session == "record" else fv.fake_mode(device="cuda:1")
    with ctx:
        w = torch.randn(4, 4, requires_grad=True)
        y = (w * 2).sum()
        y.register_hook(hook)
        y.backward()
        torch.autograd.grad((w * 3).sum(), w)  # a second backward: another graph task on the same worker
    name = "NVIDIA A100-SXM4-80GB" if session == "record" else "NVIDIA H100 80GB HBM3"
    assert seen == [(False, True, 1, name)]
    assert torch.cuda.is_available() is False or torch.cuda.device_count() > 0  # after the block: torch's own
