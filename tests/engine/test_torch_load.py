"""``torch.load`` inside a record: Note: [torch.load under fake tensors] (``fakeviz/_engine/session.py``) and the
text of a storage argument (``recorder/ops._fmt_arg``)."""

from __future__ import annotations

import io

import torch

import fakeviz as fv


def _checkpoint() -> io.BytesIO:
    buf = io.BytesIO()
    torch.save({"w": torch.randn(512, 512), "b": torch.randn(512), "tied": None}, buf)
    return buf


def _load_and_use(buf: io.BytesIO, **kw: object) -> dict:
    buf.seek(0)
    sd = torch.load(buf, **kw)
    sd["y"] = sd["w"] @ sd["w"] + sd["b"]
    return sd


def test_fake_load_records_what_a_real_load_records() -> None:
    buf = _checkpoint()
    with fv.record() as fake:
        sd = _load_and_use(buf)
    with fv.record(fake=False) as real:
        _load_and_use(buf)
    assert fake.error is None and real.error is None
    assert fake.oplog_lines() == real.oplog_lines()
    cols = ["device", "nbytes"]
    assert fake.storages[cols].values.tolist() == real.storages[cols].values.tolist()
    assert list(fake.peak()) == ["cpu"]  # no meta device
    assert fake.peak()["cpu"].bytes == real.peak()["cpu"].bytes
    assert sd["w"].device == torch.device("cpu")


def test_a_storage_argument_is_its_size_not_its_bytes() -> None:
    """str() of a storage prints every byte (about 8 characters per byte): a checkpoint's weights as text."""
    buf = _checkpoint()
    with fv.record(fake=False) as real:
        _load_and_use(buf)
    sets = [line for line in real.oplog_lines() if "aten.set_" in line]
    assert len(sets) == 2
    assert "Storage(1048576 bytes)" in sets[0] and len(sets[0]) < 200


def test_map_location_puts_the_storages_on_that_device() -> None:
    buf = _checkpoint()
    with fv.record(device="cuda:0") as t:
        sd = _load_and_use(buf, map_location="cuda:0")
    assert sd["w"].device == torch.device("cuda:0")
    assert set(t.storages.device) == {"cuda:0"}
    assert t.storages.nbytes.max() == 512 * 512 * 4


def test_a_real_load_after_a_record_is_untouched() -> None:
    buf = _checkpoint()
    with fv.record():
        _load_and_use(buf)
    buf.seek(0)
    sd = torch.load(buf)
    assert type(sd["w"]) is torch.Tensor and torch.isfinite(sd["w"]).all()
    assert torch._utils._rebuild_tensor.__module__ == "torch._utils"
