"""Fidelity: a fake run records exactly what the real run of the same code records.

Every model of ``tests/zoo.py`` runs one training step (seed, build, inputs,
forward, loss, backward, optionally an optimizer step) twice, inside
``fv.record(fake=False)`` and inside ``fv.record(fake=True)``. The two traces
must agree on

* the op log (``trace.oplog_lines()``: ops, arguments, ``$N`` tensor ids, output dtype/shape/device),
* every output's metadata (shape, stride, dtype, device, storage id, storage offset, nbytes),
* the storages table and the memory curves (``live_bytes()``, ``peak_bytes()``),
* the phase, module and user line of every op.

The comparisons are exact. The regression tests at the end pin the engine bugs
this file found (multi-output namedtuples, lift_fresh identity, ids across
swap_tensors, view replay after in-place ops on views).
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
import torch
import zoo
from oplog_diff import first_diff, window_diff

import fakeviz as fv

CHECKS = ("oplog", "outputs", "storages", "live_bytes", "peak_bytes", "phases_modules", "memory", "peak")


def _params(check: str) -> list[Any]:
    out = []
    for name in zoo.ZOO:
        out.append(pytest.param(name, id=name))
    return out


# ------------------------------------------------------------------------- recording
_CACHE: dict[str, Any] = {}


def _isolate(fake: bool) -> None:
    """Make a recording independent of what ran before it in this process.

    FakeTensorMode keeps a process-wide dispatch cache, and a cache miss returns
    namedtuples where a hit returns plain tuples; the recorder handles both, so
    nothing is cleared here on purpose: results must not depend on that state.
    """
    del fake  # results must not depend on FakeTensorMode's dispatch cache state


def _record(name: str, fake: bool) -> tuple[fv.Trace, dict[str, Any]]:
    _isolate(fake)
    # Cyclic garbage is collected when the collector decides to, which would make
    # storage free times differ between two identical runs: collect before, not during.
    gc.collect()
    gc.disable()
    try:
        with fv.record(fake=fake) as trace:
            out = zoo.run(name)
    finally:
        gc.enable()
    assert trace.error is None, trace.error
    return trace, out


def pair(name: str) -> dict[str, Any]:
    """Real and fake traces of zoo model ``name`` (recorded once per test session)."""
    if name not in _CACHE:
        try:
            real, real_out = _record(name, fake=False)
            fake, fake_out = _record(name, fake=True)
            _CACHE[name] = {"real": real, "fake": fake, "real_out": real_out, "fake_out": fake_out}
        except Exception as exc:  # noqa: BLE001 - re-raised by every test of this model
            _CACHE[name] = exc
    got = _CACHE[name]
    if isinstance(got, Exception):
        raise got
    return got


# --------------------------------------------------------------------- diff helpers


def _assert_same_rows(what: str, real: list[Any], fake: list[Any], cols: list[str], ctx: dict[str, Any]) -> None:
    i = first_diff(real, fake)
    if i is None:
        return
    msg = [f"{what}: first mismatch at row {i} ({len(real)} real rows, {len(fake)} fake rows)"]
    for side, rows in (("real", real), ("fake", fake)):
        row = rows[i] if i < len(rows) else "<missing>"
        msg.append(f"  {side}: " + (", ".join(f"{c}={v!r}" for c, v in zip(cols, row)) if row != "<missing>" else row))
    seq_col = cols.index("seq") if "seq" in cols else None
    if seq_col is not None:
        seqs = [rows[i][seq_col] for rows in (real, fake) if i < len(rows)]
        if seqs:
            s = int(min(seqs))
            msg.append("op log around it:")
            msg.append(window_diff(ctx["real"].oplog_lines(), ctx["fake"].oplog_lines(), s))
    pytest.fail("\n".join(msg), pytrace=False)


def _rows(df: Any, cols: list[str]) -> list[tuple[Any, ...]]:
    data = [df[c].astype(object).where(df[c].notna(), None).tolist() for c in cols]
    return list(zip(*data))


# ----------------------------------------------------------------------------- tests
# views_inplace_nograd: no known bug; every check is strict.


@pytest.mark.parametrize("name", _params("oplog"))
def test_oplog_identical(name: str) -> None:
    p = pair(name)
    a, b = p["real"].oplog_lines(), p["fake"].oplog_lines()
    i = first_diff(a, b)
    if i is not None:
        pytest.fail(
            f"op logs differ first at op {i} ({len(a)} real ops, {len(b)} fake ops):\n" + window_diff(a, b, i),
            pytrace=False,
        )


OUTPUT_COLS = ["seq", "shape", "stride", "dtype", "device", "storage", "storage_offset", "nbytes"]


@pytest.mark.parametrize("name", _params("outputs"))
def test_output_metadata_identical(name: str) -> None:
    p = pair(name)
    real, fake = _rows(p["real"].outputs, OUTPUT_COLS), _rows(p["fake"].outputs, OUTPUT_COLS)
    _assert_same_rows("outputs", real, fake, OUTPUT_COLS, p)


STORAGE_COLS = ["storage", "device", "nbytes", "category", "roles", "name", "alloc_seq", "free_seq", "owner"]


@pytest.mark.parametrize("name", _params("storages"))
def test_storages_identical(name: str) -> None:
    p = pair(name)
    real, fake = _rows(p["real"].storages, STORAGE_COLS), _rows(p["fake"].storages, STORAGE_COLS)
    _assert_same_rows("storages", real, fake, STORAGE_COLS, p)


@pytest.mark.parametrize("name", _params("live_bytes"))
def test_live_bytes_identical(name: str) -> None:
    p = pair(name)
    real, fake = p["real"].live_bytes(), p["fake"].live_bytes()
    assert sorted(real) == sorted(fake), f"devices differ: real {sorted(real)}, fake {sorted(fake)}"
    for dev in real:
        r, f = real[dev].tolist(), fake[dev].tolist()
        i = first_diff(r, f)
        if i is not None:
            pytest.fail(
                f"live bytes on {dev} differ first after op {i}: real {r[i] if i < len(r) else None}, "
                f"fake {f[i] if i < len(f) else None} ({len(r)} vs {len(f)} ops)\n"
                + window_diff(p["real"].oplog_lines(), p["fake"].oplog_lines(), i),
                pytrace=False,
            )


@pytest.mark.parametrize("name", _params("peak_bytes"))
def test_peak_bytes_identical(name: str) -> None:
    p = pair(name)
    real = {d: v["bytes"] for d, v in p["real"].peak_bytes().items()}
    fake = {d: v["bytes"] for d, v in p["fake"].peak_bytes().items()}
    assert real and all(v > 0 for v in real.values())
    assert fake == real


@pytest.mark.parametrize("name", _params("memory"))
def test_memory_by_category_identical(name: str) -> None:
    # every category's live bytes after every op, on every device
    p = pair(name)
    real, fake = p["real"].memory(allocator=False), p["fake"].memory(allocator=False)
    assert list(real.columns) == list(fake.columns)
    for col in fv.CATEGORIES:
        r, f = real[col].tolist(), fake[col].tolist()
        i = first_diff(r, f)
        if i is not None:
            pytest.fail(f"{col} bytes differ first at row {i}: real {r[i]}, fake {f[i]}", pytrace=False)
    # and the categories are really used: a training step has parameters, grads and activations
    totals = real[list(fv.CATEGORIES)].max()
    assert totals["Parameter"] > 0 and totals["Gradient"] > 0 and totals["Activation"] > 0, totals.to_dict()


@pytest.mark.parametrize("name", _params("peak"))
def test_peak_attribution_identical(name: str) -> None:
    p = pair(name)
    real, fake = p["real"].peak(), p["fake"].peak()
    assert sorted(real) == sorted(fake)
    for dev in real:
        r, f = real[dev].to_dict(), fake[dev].to_dict()
        assert f == r, dev
        assert r["bytes"] == sum(r["by_category"].values())


OPS_COLS = ["seq", "op", "phase", "module", "user_line"]


@pytest.mark.parametrize("name", _params("phases_modules"))
def test_phases_and_modules_identical(name: str) -> None:
    p = pair(name)
    real, fake = _rows(p["real"].ops, OPS_COLS), _rows(p["fake"].ops, OPS_COLS)
    _assert_same_rows("ops (phase/module/user line)", real, fake, OPS_COLS, p)
    phases = {row[2] for row in real}
    assert {"init", "forward", "backward"} <= phases, phases


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_fake_run_is_fake_and_real_run_is_real(name: str) -> None:
    p = pair(name)
    assert p["fake"].meta["fake"] is True and p["real"].meta["fake"] is False
    fake_params = list(p["fake_out"]["model"].parameters())
    real_params = list(p["real_out"]["model"].parameters())
    assert fake_params and len(fake_params) == len(real_params)
    assert all(fv.is_fake(t) for t in fake_params) and fv.is_fake(p["fake_out"]["loss"])
    assert not any(fv.is_fake(t) for t in real_params) and not fv.is_fake(p["real_out"]["loss"])
    # the real run computed something; the fake one has no data to compute with
    assert torch.isfinite(p["real_out"]["loss"]).item()
    assert all(t.grad is None or not fv.is_fake(t.grad) for t in real_params)
    assert all(t.grad is None or fv.is_fake(t.grad) for t in fake_params)


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
@pytest.mark.parametrize("name", ["mlp", "bert", "checkpointed"])
def test_runs_are_deterministic(name: str, fake: bool) -> None:
    # The fidelity comparisons are only meaningful if one mode is reproducible on its own.
    a, _ = _record(name, fake)
    b, _ = _record(name, fake)
    assert a.oplog_lines() == b.oplog_lines()
    for dev, curve in a.live_bytes().items():
        assert np.array_equal(curve, b.live_bytes()[dev])


# --------------------------------------------------------- minimal reproductions
def _logs(fn: Any) -> tuple[list[str], list[str]]:
    out = []
    for fake in (False, True):
        _isolate(fake)
        with fv.record(fake=fake) as t:
            fn()
        out.append(t.oplog_lines())
    return out[0], out[1]


def test_regression_multi_output_op_outputs_recorded():
    real, fake = _logs(lambda: torch.nn.functional.layer_norm(torch.ones(2, 4), (4,)))
    # real: ['$0: f32[2, 4] cpu = aten.ones...', '$1: f32[2, 4] cpu, $2: f32[2, 1] cpu, $3: ... = aten.native_layer_norm...']
    # fake: ['$0: f32[2, 4] cpu = aten.ones...', '_ = aten.native_layer_norm.default($0, [4], None, None, 1e-05)']
    assert fake == real


def test_regression_tensor_constant_lift_fresh():
    real, fake = _logs(lambda: torch.tensor([1.0, 2.0]) * 2)
    # real: ['$0: f32[2] cpu = aten.lift_fresh.default($0)', '$1: ... = aten.mul.Tensor($0, 2)']
    # fake: ['$0: f32[2] cpu = aten.lift_fresh.default($1)', '$2: ... = aten.mul.Tensor($0, 2)']
    assert fake == real


def test_regression_module_to_keeps_parameter_id():
    def step() -> None:
        m = torch.nn.Conv2d(2, 2, 1).to(memory_format=torch.channels_last)
        m.weight.sum()

    real, fake = _logs(step)
    # the last op reads the converted weight: real `aten.sum.default($0)` (the Parameter keeps its id),
    # fake `aten.sum.default($7)` (a fresh id after swap_tensors)
    assert fake == real


def test_regression_inplace_on_view_requiring_grad():
    def step() -> None:
        h = torch.ones(4, 3, requires_grad=True) * 1
        h[1:3].mul_(2)

    real, fake = _logs(step)
    # fake has one more line at the end: `$3: f32[2, 3] cpu = aten.slice.Tensor($1, 0, 1, 3)`
    assert fake == real


def test_regression_copyslices_backward_view():
    def step() -> None:
        h = torch.ones(4, 3, requires_grad=True) * 1
        h[1].mul_(2)
        h.sum().backward()

    traces = []
    for fake in (False, True):
        _isolate(fake)
        with fv.record(fake=fake) as t:
            step()
        traces.append(t)
    real, fake = ([op for op, ph in zip(t.ops["op"], t.ops["phase"]) if ph == "backward"] for t in traces)
    # real: [..., 'aten.as_strided.default', ...]; fake: [..., 'aten.select.int', ...]
    assert fake == real


def test_regression_constructor_cache_of_an_earlier_recording():
    # A fill_ whose tensor is aliased keeps no value, so its output is cached, under the recorder's fast key
    # (Note: [fast dispatch-cache key]). forget_cached_constructors dropped torch's keys only: a later recording's
    # fill_ of the same metadata hit that entry and its tensor got no value (after tiny Llama, Wav2Vec2's layer
    # norm weights, then its CTC loss's log_probs, had none: the loss took another path than when run alone).
    def aliased_fill() -> None:
        a = torch.empty(7, 3)
        v = a.view(21)  # noqa: F841 - the alias that keeps fill_ from giving `a` a value
        a.fill_(1.5)

    def fill_then_read() -> float:
        c = torch.empty(7, 3)
        c.fill_(2.0)
        return c.sum().item()

    with fv.record() as first:
        aliased_fill()
    assert first.error is None, first.error
    with fv.record() as second:
        got = fill_then_read()  # raised DataDependentError: the value of c was not known
    assert second.error is None, second.error
    assert got == 42.0


def test_regression_handled_op_error_keeps_no_frames_alive():
    # masked_select of a tensor with no value and a mask with one: the values layer runs the fake rule with the
    # mask's value hidden, which raises DynamicOutputShapeException through Values.dispatch, and then answers with
    # the all-selected assumption. The device fallback re-raised the exception from a frame that held it: a
    # reference cycle that kept every frame up the stack alive, so `tmp` (and everything the caller's frames held)
    # was never freed while the garbage collector is off (as in a real run, a storage is freed when its last
    # reference goes; the zoo tests record with gc disabled).
    def inner(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        tmp = x * 2
        return torch.masked_select(tmp, mask).sum()

    def step() -> torch.Tensor:
        x = torch.randn(300, 300)  # more than VALUE_LIMIT elements: no value
        mask = torch.ones(300, dtype=torch.bool)  # a value
        return inner(x, mask) + 1

    lifetimes = {}
    for fake in (False, True):
        gc.collect()
        gc.disable()
        try:
            with fv.record(fake=fake) as trace:
                step()
        finally:
            gc.enable()
        assert trace.error is None, trace.error
        st = trace.storages
        lifetimes[fake] = st[st.op == "aten.mul.Tensor"][["alloc_seq", "free_seq"]].values.tolist()
    assert lifetimes[False][0][1] >= 0  # freed when inner returns
    assert lifetimes[True] == lifetimes[False]  # fake: never freed (free_seq -1)
