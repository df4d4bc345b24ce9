"""Tensors the recording mode does not own: a model built in an earlier fake mode (``models.build`` /
``fv.fake_mode()`` outside the record, as ``fakeviz report`` does), or a real module, then recorded. The mode
converts each such tensor at its first use, and a view the op returns lives in the converted copy's storage
(Note: [converted tensors] in ``recorder/storages.py``). That storage is the source's: the fake record equals
the real one (it used to count every ``weight.t()`` of a Linear as a new storage: 1 GB of temporaries for a
2-layer Llama-3.1-8B forward whose real run has 17 MB, and an activation per saved weight of a real module)."""

from __future__ import annotations

import torch

import fakeviz as fv


def _run(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))


def _summary(trace) -> tuple[int, int, list[str]]:
    st = trace.storages
    return len(st), int(st.nbytes.sum()), list(trace.ops.op)


def test_views_of_a_model_built_in_another_fake_mode_share_its_storages() -> None:
    torch.manual_seed(0)
    real_model, real_x = _model(), torch.randn(8, 32)
    with fv.record(fake=False) as real:
        _run(real_model, real_x)
    with fv.fake_mode():
        fake_model = _model()
        x = torch.randn(8, 32)
    with fv.record() as fake:
        _run(fake_model, x)
    assert fake.error is None
    assert _summary(fake) == _summary(real)
    assert fake.peak()["cpu"].bytes == real.peak()["cpu"].bytes


def test_a_view_of_a_foreign_fake_tensor_is_no_new_storage() -> None:
    with fv.fake_mode(device="cuda:0"):
        w = torch.empty(64, 64)
    with fv.record(device="cuda:0") as t:
        w.t()
        w + 1
    assert len(t.storages) == 2  # w (existing before) and the sum


def test_a_real_module_recorded_fake_equals_its_real_run() -> None:
    torch.manual_seed(0)
    fake_model, real_model = _model(), _model()
    real_model.load_state_dict(fake_model.state_dict())
    x = torch.randn(8, 32)
    with fv.record() as fake:
        _run(fake_model, x.clone().requires_grad_())
    with fv.record(fake=False) as real:
        _run(real_model, x.clone().requires_grad_())
    assert fake.error is None
    assert _summary(fake) == _summary(real)
    assert fake.peak()["cpu"].by_category == real.peak()["cpu"].by_category
    assert fake.peak()["cpu"].by_category["Activation"] == real.peak()["cpu"].by_category["Activation"]


def test_a_big_real_weight_is_one_storage() -> None:
    """Above the values layer's limit a real tensor is converted by FakeTensorMode itself (not kept with its
    values): its views are still its storage."""
    w = torch.empty(512, 512)  # 262,144 elements
    with fv.record() as t:
        w.t()
        w.view(-1)
    assert len(t.storages) == 1 and list(t.storages.nbytes) == [w.untyped_storage().nbytes()]


def test_a_real_module_keeps_its_real_gradients() -> None:
    """Note: [real leaves in a fake record]: a fake record leaves no FakeTensor gradient on real parameters; a
    later real backward accumulates as if the record had not run."""
    torch.manual_seed(0)
    model, x = _model(), torch.randn(8, 32)
    fresh = _model()
    with fv.record() as t:
        _run(model, x)
        _run(fresh, x)
    assert t.peak()["cpu"].by_category["Gradient"] > 0  # the record saw the gradients
    assert all(p.grad is None for p in model.parameters()) and all(p.grad is None for p in fresh.parameters())
    assert t.meta["real_state_restored"] == 8
    _run(model, x)
    first = [p.grad.clone() for p in model.parameters()]
    with fv.record():
        _run(model, x)
    assert all(type(p.grad) is torch.Tensor for p in model.parameters())
    _run(model, x)
    assert all(torch.allclose(p.grad, 2 * g) for p, g in zip(model.parameters(), first))


def test_a_real_optimizer_keeps_its_real_state() -> None:
    """A real AdamW stepped in a fake record: its state is what it was before (none, or the real step's), and a
    real step afterwards updates the weights exactly as without the record."""
    torch.manual_seed(0)
    model, x = _model(), torch.randn(8, 32)
    twin = _model()
    twin.load_state_dict(model.state_dict())
    opt, opt_twin = torch.optim.AdamW(model.parameters()), torch.optim.AdamW(twin.parameters())
    with fv.record() as t:
        _run(model, x)
        opt.step()
    assert t.peak()["cpu"].by_category["Optimizer state"] > 0
    assert len(opt.state) == 0 and t.meta["real_state_restored"] == 4 + 4
    for m, o in ((model, opt), (twin, opt_twin)):  # a real step on each: the same result
        _run(m, x)
        o.step()
    with fv.record():  # a record after a real step: the real state is kept as it was
        _run(model, x)
        opt.step()
    for m, o in ((model, opt), (twin, opt_twin)):
        o.zero_grad()
        _run(m, x)
        o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert type(p.grad) is torch.Tensor and torch.equal(p, q)
    assert all(type(v) is torch.Tensor for st in opt.state.values() for v in st.values())
