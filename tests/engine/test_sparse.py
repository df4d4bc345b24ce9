"""Sparse tensors in the record, fake against real (Note: [sparse tensors in the record], Note: [sparse conversions
under fake tensors], Note: [sparse results under fake tensors]), and ops without a fake rule on fake cuda (Note:
[fallback kernels on fake devices]).

Each workload runs on real CPU tensors (``fv.record(fake=False)``) and on fake ones from the same seed; the op logs,
output rows, storage rows and live bytes must be equal, and where the fake run cannot know (nnz of a conversion of
unknown values, two sparse inputs) ``fidelity()["assumptions"]`` must say so.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from oplog_diff import first_diff, window_diff

import fakeviz as fv
from fakeviz._engine import device_fallback, sparse, values
from fakeviz._engine.sparse import sparse_parts

pytestmark = pytest.mark.filterwarnings("ignore:Sparse:UserWarning")

OUT = ["seq", "shape", "stride", "dtype", "device", "storage", "storage_offset", "nbytes"]
ST = ["storage", "device", "nbytes", "category", "roles", "alloc_seq", "free_seq", "owner"]


def _rows(df: Any, cols: list[str]) -> list[tuple[Any, ...]]:
    return list(zip(*[df[c].astype(object).where(df[c].notna(), None).tolist() for c in cols]))


def _record(work: Callable[[], Any], fake: bool, **kw: Any) -> tuple[fv.Trace, Any]:
    torch.manual_seed(0)
    gc.collect()
    gc.disable()  # storage frees at the same op in both runs
    try:
        with warnings.catch_warnings(), fv.record(fake=fake, **kw) as trace:
            warnings.simplefilter("ignore")
            out = work()
    finally:
        gc.enable()
    assert trace.error is None and not trace.meta.get("recorder_errors"), trace.meta.get("first_recorder_error")
    return trace, out


def _same(real: fv.Trace, fake: fv.Trace) -> None:
    a, b = real.oplog_lines(), fake.oplog_lines()
    i = first_diff(a, b)
    assert i is None, "op logs differ:\n" + window_diff(a, b, i)
    for what, cols in (("outputs", OUT), ("storages", ST)):
        r, f = _rows(getattr(real, what), cols), _rows(getattr(fake, what), cols)
        j = first_diff(r, f)
        assert j is None, (
            f"{what} differ at row {j}: real {r[j] if j < len(r) else None}, fake {f[j] if j < len(f) else None}"
        )
    for dev, live in real.live_bytes().items():
        assert live.tolist() == fake.live_bytes()[dev].tolist()


def _pair(work: Callable[[], Any], **kw: Any) -> tuple[fv.Trace, fv.Trace, Any, Any]:
    real, real_out = _record(work, False)
    fake, fake_out = _record(work, True, **kw)
    return real, fake, real_out, fake_out


def _parts(t: torch.Tensor) -> list[tuple[tuple[int, ...], torch.dtype, int]]:
    return [(tuple(p.shape), p.dtype, p.untyped_storage().nbytes()) for p in sparse_parts(t)]


def _assumptions(trace: fv.Trace) -> list[str]:
    return trace.fidelity()["assumptions"].assumption.tolist()


# ------------------------------------------------------------------------------------------- the cases
def test_small_to_sparse_is_recorded_with_its_indices_and_values(recorder: str) -> None:
    """``torch.ones(5, 5).to_sparse()`` raised ``Cannot access storage of SparseTensorImpl`` (values layer)."""
    real, fake, r, f = _pair(lambda: torch.ones(5, 5).to_sparse())
    _same(real, fake)
    assert fake.oplog_lines()[-1] == "$1: f32[5, 5] cpu = aten._to_sparse.default($0)"
    out = fake.outputs.iloc[-1]
    assert out["nbytes"] == 2 * 25 * 8 + 25 * 4 and out["stride"] == "sparse_coo"  # int64 [2, 25] indices, f32 values
    assert sorted(fake.storages.nbytes.tolist()) == [100, 100, 400]
    assert _parts(f) == _parts(r) and f.is_sparse and fv.is_fake(f)
    assert not _assumptions(fake)  # the values were known: exact


def test_large_conversions_are_recorded_with_their_bytes(recorder: str) -> None:
    """Larger ``to_sparse()`` / ``to_sparse_csr()`` were ``<not recorded>``, their memory missing (``nbytes is not
    defined for sparse tensors``). Values beyond VALUE_LIMIT: unknown, every element assumed nonzero (randn: true)."""
    n = 300  # 90,000 elements > VALUE_LIMIT
    real, fake, _, _ = _pair(lambda: (torch.randn(n, n).to_sparse(), torch.randn(n, n).to_sparse_csr()))
    _same(real, fake)
    assert "<not recorded>" not in fake.oplog()
    assert fake.peak_bytes()["cpu"]["bytes"] == real.peak_bytes()["cpu"]["bytes"]
    nnz = n * n
    assert fake.outputs.nbytes.tolist()[1] == 2 * nnz * 8 + nnz * 4
    said = _assumptions(fake)
    assert len(said) == 2 and all("assumed every element nonzero" in s for s in said)
    assert f"nnz {nnz}, sparse_coo" in said[0] and f"nnz {nnz}, sparse_csr" in said[1]


_CONVERSIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "coo": lambda x: x.to_sparse(),
    "coo_sparse_dim": lambda x: x.to_sparse(1),
    "csr": lambda x: x.to_sparse_csr(),
    "csc": lambda x: x.to_sparse_csc(),
    "bsr": lambda x: x.to_sparse_bsr((2, 4)),
    "bsc": lambda x: x.to_sparse_bsc((4, 2)),
    "csr_dense_dim": lambda x: x.unsqueeze(-1).to_sparse_csr(dense_dim=1),
    "batched_csr": lambda x: x.reshape(2, 4, 16).to_sparse_csr(),
    "to_sparse_layout": lambda x: x.to_sparse(layout=torch.sparse_bsc, blocksize=(2, 2)),
}


@pytest.mark.parametrize("name", sorted(_CONVERSIONS))
def test_conversion_of_known_values_is_exact(name: str) -> None:
    """Known values with zeros: the real kernel runs on them, nnz and every part (storage sizes included) exact."""
    conv = _CONVERSIONS[name]

    def work() -> torch.Tensor:
        x = torch.tensor([[float((i * 7 + j) % 3 == 0) for j in range(16)] for i in range(8)])
        return conv(torch.cat([x[:4], x[:4]]) if name == "batched_csr" else x)  # batches: the same nnz each

    real, fake, r, f = _pair(work)
    _same(real, fake)
    assert _parts(f) == _parts(r) and f.layout == r.layout and f._nnz() == r._nnz() < 128
    assert not _assumptions(fake)


@pytest.mark.parametrize("probe", ["full", "small"])
@pytest.mark.parametrize("name", sorted(_CONVERSIONS))
def test_conversion_of_unknown_values_assumes_every_element_kept(
    name: str, probe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``small``: the real kernel's checks run on a small stand-in of the input (what a large input gets)."""
    conv = _CONVERSIONS[name]
    monkeypatch.setattr(values, "VALUE_LIMIT", 4)  # values unknown, as a full-size model's are
    if probe == "small":
        monkeypatch.setattr(sparse, "PROBE_LIMIT", 4)
    work = lambda: conv(torch.randn(8, 16))  # noqa: E731 - randn: every element nonzero in the real run too
    real, fake, r, f = _pair(work)
    _same(real, fake)
    assert _parts(f) == _parts(r)
    assert len(_assumptions(fake)) == 1 and "assumed every element nonzero" in _assumptions(fake)[0]
    if name == "batched_csr":
        return  # with zeros its batches keep different counts, which a real batched CSR refuses
    # with zeros in the input the real run keeps fewer: the fake record is the largest it can be, never less
    zeros = lambda: conv(torch.randn(8, 16).clamp(min=1.5) - 1.5)  # noqa: E731 - about 7 % nonzero
    real, fake, r, f = _pair(zeros)
    assert f._nnz() > r._nnz() and fake.peak_bytes()["cpu"]["bytes"] > real.peak_bytes()["cpu"]["bytes"]
    assert f.layout == r.layout and [p[1] for p in _parts(f)] == [p[1] for p in _parts(r)]


def test_a_refused_block_size_is_refused_on_a_small_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "VALUE_LIMIT", 4)
    monkeypatch.setattr(sparse, "PROBE_LIMIT", 4)
    for fake in (False, True):
        with pytest.raises(RuntimeError, match="divisible by given blocksize") as info:
            with fv.record(fake=fake):
                torch.randn(8, 18).to_sparse_bsr((4, 4))
        notes = " ".join(getattr(info.value, "__notes__", []))
        assert ("stand-in for the [8, 18] input" in notes) == fake


# ------------------------------------------------------------------------------------------- ops on sparse tensors
def _sparse_ops() -> tuple[torch.Tensor, ...]:
    x = torch.randn(6, 8)
    x[x < 0] = 0
    s = x.to_sparse()
    w = torch.randn(8, 4)
    csr = x.to_sparse_csr()
    return (s.clone(), s.t(), s * 2, -s, s + s, s.coalesce(), s.to_sparse_csr(), s.detach(), torch.sparse.mm(s, w),
            s.to_dense(), csr @ w, csr.to_dense(), csr.to_sparse_coo(), s.t().coalesce())  # fmt: skip


def test_ops_on_sparse_tensors_keep_nnz_and_sharing(recorder: str) -> None:
    """torch's fake rules give every sparse result nnz 0; the fake run's stand-ins give the real nnz, parts and
    sharing (``t`` keeps its input's values storage)."""
    real, fake, r, f = _pair(_sparse_ops)
    _same(real, fake)
    for a, b in zip(r, f):
        assert a.layout == b.layout and a.shape == b.shape
        if a.layout != torch.strided:
            assert _parts(a) == _parts(b) and a._nnz() == b._nnz() > 0
    # one sparse input each: exact; coalescing t()'s (uncoalesced) result assumes no two elements at one position
    said = fake.fidelity()["assumptions"]
    assert said.op.tolist() == ["aten._coalesce.default"] and "no two elements" in said.assumption[0]


def test_sparse_backward(recorder: str) -> None:
    def work() -> None:
        s = torch.randn(6, 8).to_sparse()
        w = torch.randn(8, 4, requires_grad=True)
        torch.sparse.mm(s, w).sum().backward()

    real, fake, _, _ = _pair(work)
    _same(real, fake)


def test_sparse_embedding_gradients_and_sgd(recorder: str) -> None:
    """``nn.Embedding(sparse=True)``: sparse gradients (uncoalesced, repeated ids) that SGD applies; the fake
    record is the real one, with the gradients' memory in the Gradient category."""

    def work() -> None:
        emb = torch.nn.Embedding(100, 16, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)
        ids = torch.tensor([[1, 5, 7, 5], [2, 2, 9, 0]])
        for _ in range(2):
            emb(ids).sum().backward()
            opt.step()
            opt.zero_grad()

    real, fake, _, _ = _pair(work)
    _same(real, fake)
    grads = fake.storages[fake.storages.category == "Gradient"].nbytes.tolist()
    assert grads == [8 * 8, 8 * 16 * 4] * 2  # per step: indices [1, 8] int64, values [8, 16] f32
    assert not _assumptions(fake)  # cloning an uncoalesced gradient keeps its nnz whatever its positions


def test_two_sparse_inputs_are_an_assumption() -> None:
    def work() -> torch.Tensor:
        a = torch.randn(4, 4).clamp(min=0).to_sparse()
        b = torch.randn(4, 4).clamp(min=0).to_sparse()
        return a + b

    _, fake, _, out = _pair(work)
    said = [s for s in _assumptions(fake) if "same positions" in s]
    assert len(said) == 1 and f"nnz ({out._nnz()})" in said[0]


# ------------------------------------------------------------------------------------------------- fake cuda
def _on_device(device: str) -> tuple[torch.Tensor, ...]:
    x = torch.randn(8, 6, device=device)
    a, tau = torch.geqrf(x)
    s = x.to_sparse()
    c = x.to_sparse_csr()
    y = torch.sparse.mm(s, torch.randn(6, 3, device=device))
    return a, tau, s, c, s.to_sparse_csr(), y, s.t(), s.t().coalesce()


def test_fake_cuda_runs_what_fake_cpu_runs(recorder: str) -> None:
    """``geqrf`` and ``to_sparse`` raised "Could not run 'aten::empty_strided' ... 'CUDA' backend" on fake cuda: they
    run, and the record is the real CPU run's on cuda:0 (same ops, shapes, bytes, storages)."""
    if not fv.fake_cuda_status().cuda_ok:
        pytest.skip("no fake cuda here")
    real, real_out = _record(lambda: _on_device("cpu"), False)
    fake, fake_out = _record(lambda: _on_device("cuda:0"), True)
    assert [line.replace("cpu", "") for line in real.oplog_lines()] == [
        line.replace("cuda:0", "") for line in fake.oplog_lines()
    ]
    assert set(fake.storages.device.astype(str)) == {"cuda:0"}
    assert fake.storages.nbytes.tolist() == real.storages.nbytes.tolist()
    assert real.live_bytes()["cpu"].tolist() == fake.live_bytes()["cuda:0"].tolist()
    for r, f in zip(real_out, fake_out):
        assert f.device == torch.device("cuda:0") and (f.shape, f.dtype, f.layout) == (r.shape, r.dtype, r.layout)
        if r.layout == torch.strided:
            assert f.stride() == r.stride()
        else:
            assert _parts(f) == _parts(r)
    runs = fake.fidelity()["fallbacks"]
    assert runs.op.tolist().count("aten.geqrf.default") == 1  # one fallback run per call, not the failed one twice


@pytest.mark.parametrize(
    ("name", "op"),
    [("histogram", "aten.histogram.bin_ct"), ("histogramdd", "aten._histogramdd_bin_edges.default")],
)
def test_ops_without_a_cuda_kernel_fail_naming_op_and_line(name: str, op: str) -> None:
    """``histogram`` and ``histogramdd`` have CPU and MPS kernels only: a real GPU run fails too, and so does the fake
    one, with the op named and the user's line (not torch's ``empty_strided`` on the 'CUDA' backend)."""
    if not fv.fake_cuda_status().cuda_ok:
        pytest.skip("no fake cuda here")
    call = {
        "histogram": lambda x: torch.histogram(x, bins=4),
        "histogramdd": lambda x: torch.histogramdd(x, bins=[3, 3]),
    }
    with pytest.raises(NotImplementedError) as info:
        with fv.record(device="cuda:0") as trace:
            x = torch.randn(16, 2)
            call[name](x)  # the user's line
    msg = str(info.value)
    keys = ", ".join(device_fallback.kernel_keys(torch.ops.aten.histogram.bin_ct if name == "histogram" else
                                                 torch.ops.aten._histogramdd_bin_edges.default))  # fmt: skip
    # (CPU and MPS; torch 2.14 adds XPU)
    assert msg.startswith(f"{op} has no CUDA kernel in PyTorch (only {keys})") and len(msg.splitlines()) == 1
    assert keys.startswith("CPU, MPS")
    assert "empty_strided" not in msg and info.value.__cause__ is None and info.value.__suppress_context__
    assert trace.error["op"] == op and "test_sparse.py" in trace.error["user_line"]
    assert any("test_sparse.py" in n and op in n for n in info.value.__notes__)
    # on fake cpu the same op runs
    with fv.record(device="cpu") as trace:
        call[name](torch.randn(16, 2))
    assert trace.error is None


def test_which_ops_have_a_cuda_kernel() -> None:
    aten = torch.ops.aten
    assert device_fallback.has_kernel(aten.geqrf.default, "cuda") is True
    assert device_fallback.has_kernel(aten.histogram.bin_ct, "cuda") is False
    assert device_fallback.has_kernel(aten._histogramdd_bin_edges.default, "cuda") is False
    assert device_fallback.has_kernel(aten.add.Tensor, "cuda") is True
    assert device_fallback.kernel_keys(aten.histogram.bin_ct)[:2] == ("CPU", "MPS")  # torch 2.14 adds XPU
    assert "CUDA" not in device_fallback.kernel_keys(aten.histogram.bin_ct)
    assert device_fallback.kernel_keys(aten.geqrf.default)[:2] == ("CPU", "CUDA")  # torch 2.14 adds MPS
