"""``copy.deepcopy`` while recording: EMA copies, reference models and ``nn.TransformerEncoder`` (which deep-copies
its layer) run under fake tensors, the copies get new storages recorded and categorised like any other, and the
memory equals a real CPU run of the same code (Note: [deepcopy of recorded tensors])."""

from __future__ import annotations

import copy

import pytest
import torch

import fakeviz as fv


def _ema_step() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    ema = copy.deepcopy(m)
    (m(torch.randn(2, 4)).sum() + ema(torch.randn(2, 4)).sum()).backward()
    return m, ema


def _by_category(trace: fv.Trace) -> dict[str, int]:
    return trace.storages.groupby("category", observed=True).nbytes.sum().to_dict()


def test_ema_copy_records_new_storages_like_a_real_run() -> None:
    deepcopy = torch.Tensor.__deepcopy__
    with fv.record(device="cpu") as fake:
        m, ema = _ema_step()
    with fv.record(device="cpu", fake=False) as real:
        _ema_step()
    assert torch.Tensor.__deepcopy__ is deepcopy  # the recording's patch is undone
    assert _by_category(fake) == _by_category(real)
    assert {d: p["bytes"] for d, p in fake.peak_bytes().items()} == {
        d: p["bytes"] for d, p in real.peak_bytes().items()
    }
    for a, b in zip(m.parameters(), ema.parameters()):
        assert fv.is_fake(b) and b.fake_mode is a.fake_mode
        assert b.untyped_storage()._cdata != a.untyped_storage()._cdata


def test_copy_keeps_its_own_tensor_id() -> None:
    """Ops on the copy name the copy (the clone's output), not the tensor it was copied from."""
    with fv.record(device="cpu") as trace:
        m = torch.nn.Linear(4, 4)
        ema = copy.deepcopy(m)
        ema(torch.randn(2, 4))
    ops = trace.ops
    clones = ops[ops.op == "aten.clone.default"]
    assert len(clones) == 2
    out = trace.outputs
    clone_ids = set(out[out.seq.isin(clones.seq)].tensor)
    t = ops[ops.op == "aten.t.default"].iloc[0]
    (src,) = (int(a[1:]) for a in t.args.strip("()").split(", ") if a.startswith("$"))
    assert src in clone_ids  # the copy's weight, not the original's
    dc = trace.fidelity()["deepcopies"]
    assert sorted(dc.tensor) == sorted(clone_ids)


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_transformer_encoder_deep_copies_its_layer(device: str) -> None:
    def run() -> None:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        enc(torch.randn(2, 5, 16)).sum().backward()

    with fv.record(device=device) as fake:
        run()
    assert fake.error is None and len(fake.fidelity()["deepcopies"]) > 0
    assert _by_category(fake)["Parameter"] > 0
    if device == "cpu":
        with fv.record(device="cpu", fake=False) as real:
            run()
        assert _by_category(fake) == _by_category(real)


def test_patch_is_undone_after_an_error() -> None:
    deepcopy = torch.Tensor.__deepcopy__
    with pytest.raises(ZeroDivisionError), fv.record(device="cpu"):
        copy.deepcopy(torch.nn.Linear(2, 2))
        1 / 0  # noqa: B018
    assert torch.Tensor.__deepcopy__ is deepcopy
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
