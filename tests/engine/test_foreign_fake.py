"""KNOWN BUG (strict xfails): a model built in an earlier fake mode (``models.build`` / ``fv.fake_mode()`` outside
the record), then recorded. The record's mode converts its tensors into its own at their use, and the
converted tensor's storage is not the one the record registered for the original: every view of a weight
(``Linear``'s ``weight.t()``) is counted as a new storage. A 2-layer Llama-3.1-8B forward shows 1 GB of
temporaries where the real run has 17 MB; ``fakeviz report`` (which builds before recording) is inflated
by it. ``fv.plan``, ``%%fake`` and a model built inside the ``record`` block are not affected. A first
attempt (mapping a foreign fake tensor to ``from_real_tensor``'s memoised conversion in
``StoragesMixin.storage_id``) made it worse (13 storages for one Linear): the conversion torch does in
dispatch is not found through the converter's memo from there."""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv


def _run(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))


def _summary(trace) -> tuple[int, int, list[str]]:
    st = trace.storages
    return len(st), int(st.nbytes.sum()), list(trace.ops.op)


@pytest.mark.xfail(strict=True, reason="known bug: views of a foreign fake tensor are new storages")
def test_views_of_a_model_built_in_another_fake_mode_share_its_storages() -> None:
    torch.manual_seed(0)
    real_model = _model()
    with fv.record(fake=False) as real:
        _run(real_model, torch.randn(8, 32))
    with fv.fake_mode():
        fake_model = _model()
        x = torch.randn(8, 32)
    with fv.record() as fake:
        _run(fake_model, x)
    assert fake.error is None
    assert _summary(fake) == _summary(real)
    assert fake.peak().peak.sum() == real.peak().peak.sum()


@pytest.mark.xfail(strict=True, reason="known bug: views of a foreign fake tensor are new storages")
def test_a_view_of_a_foreign_fake_tensor_is_no_new_storage() -> None:
    with fv.fake_mode(device="cuda:0"):
        w = torch.empty(64, 64)
    with fv.record(device="cuda:0") as t:
        w.t()
        w + 1
    assert len(t.storages) == 2  # w (existing before) and the sum
