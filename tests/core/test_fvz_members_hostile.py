"""A .fvz with a member twice, and capacities past the largest job (issue 42): refused, never read silently."""

from __future__ import annotations

import warnings
import zipfile

import pytest
import torch

import fakeviz as fv
from fakeviz._core.errors import ArgumentError, TraceFormatError
from fakeviz._core.gpus import MAX_JOB_BYTES, Capacity, read_gpus


def _trace(tmp_path):
    with fv.record(device="cuda:0", gpu="H100") as tr:
        torch.ones(4, 4) @ torch.ones(4, 4)
    f = tmp_path / "t.fvz"
    tr.save(f)
    return tr, f


@pytest.mark.parametrize("name", ["fakeviz.json", "columns/op_seq.npy"])
def test_a_member_named_twice_is_refused(tmp_path, name):
    _, f = _trace(tmp_path)
    with zipfile.ZipFile(f) as zf:
        if name not in zf.namelist():
            name = next(n for n in zf.namelist() if n.startswith("columns/"))
        data = zf.read(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name"
        with zipfile.ZipFile(f, "a") as zf:
            zf.writestr(name, data)
    with pytest.raises(TraceFormatError, match=f"two members are named {name!r}"):
        fv.load(f)


def test_a_trace_loads_when_each_member_is_there_once(tmp_path):
    tr, f = _trace(tmp_path)
    assert len(fv.load(f).ops) == len(tr.ops) > 0


@pytest.mark.parametrize("spec", ["1e30GB", 1e30, "20PB", float("nan")])
def test_a_capacity_past_the_largest_job_is_refused(spec):
    with pytest.raises(ValueError, match="largest job|capacity|unknown"):
        Capacity.parse(spec)
    with pytest.raises(ArgumentError, match="gpus="):
        read_gpus(spec) if not isinstance(spec, float) else read_gpus(str(spec) + "GB")


def test_the_largest_capacity_saves_and_loads(tmp_path):
    assert Capacity.parse(MAX_JOB_BYTES).bytes == MAX_JOB_BYTES
    cfg = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=4, vocab_size=256)  # fmt: skip
    p = fv.plan(cfg, gpus=Capacity.parse(MAX_JOB_BYTES), batch=1, seq=16)
    p.trace.save(tmp_path / "big.fvz")
    assert fv.load(tmp_path / "big.fvz").meta["capacity"] == p.trace.meta["capacity"]
