"""bitsandbytes under fake tensors (Note: [bitsandbytes under fake tensors] in ``fakeviz/_engine/quant/bnb.py``):
a fake record equals the real CPU record op by op and byte by byte (bitsandbytes 0.50 runs NF4, FP4 and LLM.int8 on
the CPU), storage bytes follow the library's own formulas, quant state counts as the weight, paged optimizer state
is marked, and nothing stays patched."""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest
import torch
from oplog_diff import first_diff, window_diff

import fakeviz as fv
from fakeviz._engine import patches

bnb = pytest.importorskip("bitsandbytes")

STORAGE_COLS = ["storage", "device", "nbytes", "category", "roles", "name", "alloc_seq", "free_seq", "owner"]


@pytest.fixture(autouse=True, scope="module")
def _warm() -> None:
    # a process that has quantized before: bitsandbytes' dynamic map is cached (fake sessions put it there too)
    bnb.functional.name2qmap.setdefault("dynamic", bnb.functional.create_dynamic_map())


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return list(zip(*[df[c].astype(object).where(df[c].notna(), None).tolist() for c in STORAGE_COLS]))


def _pair(body: Any, device: str = "cpu") -> dict[bool, fv.Trace]:
    out = {}
    for fake in (False, True):
        torch.manual_seed(0)
        gc.collect()
        gc.disable()
        try:
            with fv.record(fake=fake, device=device) as t:
                body(device)
        finally:
            gc.enable()
        assert t.error is None, t.error
        out[fake] = t
    return out


def _assert_same(p: dict[bool, fv.Trace]) -> None:
    a, b = p[False].oplog_lines(), p[True].oplog_lines()
    i = first_diff(a, b)
    assert i is None, f"op logs differ at {i}:\n" + window_diff(a, b, i)
    r, f = _rows(p[False].storages), _rows(p[True].storages)
    i = first_diff(r, f)
    assert i is None, (
        f"storages differ at {i}: real {r[i] if i < len(r) else None}, fake {f[i] if i < len(f) else None}"
    )
    assert p[False].peak_bytes() == p[True].peak_bytes()


def _four_bit(quant_type: str, double: bool) -> Any:
    def body(dev: str) -> None:
        dense = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 64, bias=False)).to(torch.bfloat16)  # fmt: skip
        kw = dict(bias=False, quant_type=quant_type, compute_dtype=torch.bfloat16, compress_statistics=double)
        q = torch.nn.Sequential(bnb.nn.Linear4bit(64, 128, **kw), torch.nn.ReLU(), bnb.nn.Linear4bit(128, 64, **kw))
        q.load_state_dict(dense.state_dict())
        q = q.to(dev)
        x = torch.randn(4, 64, dtype=torch.bfloat16, device=dev, requires_grad=True)
        q(x).sum().backward()

    return body


@pytest.mark.parametrize(("quant_type", "double"), [("nf4", False), ("nf4", True), ("fp4", False)])
def test_4bit_fake_equals_real(quant_type: str, double: bool) -> None:
    p = _pair(_four_bit(quant_type, double))
    _assert_same(p)
    ops = p[True].ops["op"].tolist()
    for op in ("bitsandbytes.quantize_4bit.default", "bitsandbytes.gemm_4bit.default",
               "bitsandbytes.dequantize_4bit.default"):  # fmt: skip
        assert op in ops
    assert ("bitsandbytes.quantize_blockwise.default" in ops) == double


@pytest.mark.parametrize("train", [True, False])
def test_int8_fake_equals_real(train: bool) -> None:
    def body(dev: str) -> None:
        dense = torch.nn.Sequential(torch.nn.Linear(64, 128, dtype=torch.float16), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 64, dtype=torch.float16))  # fmt: skip
        q = torch.nn.Sequential(bnb.nn.Linear8bitLt(64, 128, has_fp16_weights=False, threshold=6.0), torch.nn.ReLU(),
                                bnb.nn.Linear8bitLt(128, 64, has_fp16_weights=False, threshold=6.0))  # fmt: skip
        q.load_state_dict(dense.state_dict())
        q = q.to(dev).train(train)
        x = torch.randn(4, 64, dtype=torch.float16, device=dev, requires_grad=True)
        q(x).float().sum().backward()

    p = _pair(body)
    _assert_same(p)
    assert "bitsandbytes.int8_vectorwise_quant.default" in p[True].ops["op"].tolist()


def _bytes_of(name_prefix: str, t: fv.Trace) -> dict[str, int]:
    s = t.storages
    live = s[(s.free_seq < 0) & (s.category == "Parameter")]
    return {n: int(b) for n, b in live.groupby("name").nbytes.sum().items() if str(n).startswith(name_prefix)}


@pytest.mark.parametrize("shape", [(128, 64), (96, 200), (1000, 33), (64, 4096)])
@pytest.mark.parametrize("double", [False, True])
def test_4bit_bytes_follow_the_library_formula(shape: tuple[int, int], double: bool) -> None:
    out_f, in_f = shape
    with fv.record(device="cuda:0") as t:
        layer = bnb.nn.Linear4bit(in_f, out_f, bias=False, quant_type="nf4", compress_statistics=double,
                                  compute_dtype=torch.bfloat16).to(torch.bfloat16)  # fmt: skip
        layer = layer.to("cuda:0")
        layer(torch.randn(2, in_f, dtype=torch.bfloat16, device="cuda"))
    assert t.error is None
    n = out_f * in_f
    blocks = math.ceil(n / 64)
    packed = (n + 1) // 2
    code = 16 * 4
    if double:  # uint8 absmax, float32 nested absmax per 256 blocks, float32 offset, 256-value nested code
        stats = blocks + math.ceil(blocks / 256) * 4 + 4 + 256 * 4
    else:  # float32 absmax per block
        stats = blocks * 4
    assert _bytes_of("Linear4bit.weight", t) == {"Linear4bit.weight": packed + stats + code}
    w = layer.weight
    assert w.dtype == torch.uint8 and tuple(w.shape) == (packed, 1) and w.device.type == "cuda"
    assert fv.is_fake(w) and isinstance(w, bnb.nn.Params4bit)


@pytest.mark.parametrize("shape", [(128, 64), (300, 17)])
def test_int8_bytes_follow_the_library_formula(shape: tuple[int, int]) -> None:
    out_f, in_f = shape
    with fv.record(device="cuda:0") as t:
        layer = bnb.nn.Linear8bitLt(in_f, out_f, bias=False, has_fp16_weights=False, device="cpu")
        layer = layer.to("cuda:0")
        layer(torch.randn(2, in_f, dtype=torch.float16, device="cuda"))
    assert t.error is None
    assert _bytes_of("Linear8bitLt.weight", t) == {"Linear8bitLt.weight": out_f * in_f + out_f * 4}  # int8 + SCB


def test_adamw8bit_state_bytes_fake_equal_real() -> None:
    def body(dev: str) -> None:
        m = torch.nn.Sequential(torch.nn.Linear(128, 256, dtype=torch.bfloat16), torch.nn.ReLU(),
                                torch.nn.Linear(256, 16, dtype=torch.bfloat16))  # fmt: skip
        opt = bnb.optim.AdamW8bit(m.parameters(), lr=1e-3)
        m(torch.randn(4, 128, dtype=torch.bfloat16, device=dev)).float().sum().backward()
        opt.step()

    p = _pair(body)

    def state(t: fv.Trace) -> list[tuple[int, str]]:
        s = t.storages
        return sorted((int(b), d) for b, d in s[s.category == "Optimizer state"][["nbytes", "device"]].values)

    assert state(p[True]) == state(p[False])
    # 8-bit state for the 128x256 weight: two uint8 states, two float32 absmax per 256 values, the two 256-value maps
    assert (128 * 256, "cpu") in state(p[True]) and (128 * 256 // 256 * 4, "cpu") in state(p[True])
    _assert_same(p)  # the optimizer's 8-bit maps made with .tolist() too (Note: [tolist of known values])
    assert "bitsandbytes.optimizer_update_8bit_blockwise.default" in p[True].ops["op"].tolist()


def test_paged_adamw8bit_state_is_marked_paged() -> None:
    with fv.record(device="cuda:0") as t:
        m = torch.nn.Linear(512, 512, dtype=torch.bfloat16, device="cuda")
        opt = bnb.optim.PagedAdamW8bit(m.parameters(), lr=1e-3)
        m(torch.randn(4, 512, dtype=torch.bfloat16, device="cuda")).float().sum().backward()
        opt.step()
    assert t.error is None
    paged = t.meta["paged"]
    s = t.storages.set_index("storage")
    assert sorted(int(s.loc[i, "nbytes"]) for i in paged) == [512 * 512, 512 * 512]  # uint8 state1, state2
    assert all(s.loc[i, "category"] == "Optimizer state" and s.loc[i, "device"] == "cuda:0" for i in paged)
    said = t.fidelity()["assumptions"]
    assert (said["op"] == "bitsandbytes.get_paged").sum() == 2


def test_fake_mode_builds_and_quantizes() -> None:
    with fv.fake_mode(device="cuda:0"):
        layer = bnb.nn.Linear4bit(64, 32, bias=False, quant_type="fp4").to(torch.bfloat16).to("cuda")
        y = layer(torch.randn(3, 64, dtype=torch.bfloat16, device="cuda"))
    assert fv.is_fake(layer.weight) and layer.weight.dtype == torch.uint8 and tuple(y.shape) == (3, 32)


def test_nothing_stays_patched() -> None:
    before = {k: getattr(bnb.functional, k) for k in ("get_paged", "elementwise_func", "prefetch_tensor")}
    qmap = bnb.functional.name2qmap.get("dynamic")
    with fv.record(device="cuda:0"):
        mine = {e for e, _, _ in patches.active()}
        assert {"fake-param-subclass", "bnb-qmap", "bnb-paged"} <= mine
        bnb.nn.Linear4bit(64, 64, bias=False).to(torch.bfloat16).to("cuda")
    assert not {e for e, _, _ in patches.active()} & {"fake-param-subclass", "bnb-qmap", "bnb-paged"}
    assert "_make_subclass" not in vars(torch.Tensor)
    assert {k: getattr(bnb.functional, k) for k in before} == before
    assert bnb.functional.name2qmap.get("dynamic") is qmap
    assert not fv.is_fake(qmap)


@pytest.mark.parametrize(("rows", "double"), [(2, False), (16, False), (16, True)])
def test_4bit_matmul_workspace_on_fake_cuda(rows: int, double: bool) -> None:
    # Note: [4-bit matmul workspace on cuda]: past 4 rows the CUDA kernel dequantizes the weight inside the op
    with fv.record(device="cuda:0") as t:
        layer = bnb.nn.Linear4bit(256, 128, bias=False, quant_type="nf4", compress_statistics=double,
                                  compute_dtype=torch.bfloat16).to(torch.bfloat16).to("cuda")  # fmt: skip
        n0 = len(t.ops)
        layer(torch.randn(rows, 256, dtype=torch.bfloat16, device="cuda"))
    assert t.error is None
    ops = t.ops.iloc[n0:]
    gemm = int(ops.index[ops["op"] == "bitsandbytes.gemm_4bit.default"][0])
    s = t.storages
    across = s[(s.alloc_seq < gemm) & (s.alloc_seq >= n0) & (s.free_seq > gemm) & (s.category == "Temporary")]
    got = sorted(int(b) for b in across.nbytes)
    assumptions = t.fidelity()["assumptions"]
    if rows <= 4:
        assert got == [] and len(assumptions) == 0
    else:
        blocks = 256 * 128 // 64
        assert got == sorted([128 * 256 * 2] + ([blocks * 4, blocks * 4] if double else []))
        assert len(assumptions) == 1 and "dequantize + F.linear" in assumptions["assumption"].iloc[0]


def test_import_inside_a_fake_cuda_record(tmp_path: Any) -> None:
    # bitsandbytes first imported inside a fake cuda session: real import (no CUDA backend on a CPU build), patched
    import subprocess
    import sys

    code = (
        "import torch, fakeviz as fv, sys\n"
        "with fv.record(device='cuda:0') as t:\n"
        "    from fakeviz._engine.quant.bnb import import_bitsandbytes\n"
        "    bnb = import_bitsandbytes()\n"
        "    layer = bnb.nn.Linear4bit(64, 64, bias=False).to(torch.bfloat16).to('cuda')\n"
        "    layer(torch.randn(8, 64, dtype=torch.bfloat16, device='cuda'))\n"
        "    print('PATCHED', bnb.matmul_4bit.__module__)\n"
        "print('ERROR', t.error)\n"
        "print('AFTER', bnb.matmul_4bit.__module__, type(bnb.functional.name2qmap.get('dynamic')).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "PATCHED fakeviz._engine.quant.bnb" in out.stdout
    assert "ERROR None" in out.stdout
    assert "AFTER bitsandbytes.autograd._functions NoneType" in out.stdout


def test_users_first_import_inside_a_fake_cuda_record() -> None:
    # a cell that starts with `import peft` (which imports bitsandbytes) inside %%fake --device cuda:0: the package
    # executes as at the top of a script (no CUDA backend on a CPU build), and its layers then run on fake cuda
    import subprocess
    import sys

    code = (
        "import torch, fakeviz as fv\n"
        "with fv.record(device='cuda:0') as t:\n"
        "    import peft\n"
        "    import bitsandbytes as bnb\n"
        "    layer = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16).to('cuda')\n"
        "    y = layer(torch.randn(2, 64, dtype=torch.bfloat16, device='cuda'))\n"
        "print('ERROR', t.error, tuple(y.shape), y.device, layer.weight.quant_type)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERROR None (2, 64) cuda:0 fp4" in out.stdout  # Linear4bit's default quant_type


def test_quantized_matmuls_count_their_flops() -> None:
    with fv.record(device="cuda:0") as t:
        four = bnb.nn.Linear4bit(256, 128, bias=False, compute_dtype=torch.bfloat16).to(torch.bfloat16).to("cuda")
        eight = bnb.nn.Linear8bitLt(256, 128, bias=False, has_fp16_weights=False, device="cpu").to("cuda").eval()
        x = torch.randn(2, 16, 256, dtype=torch.bfloat16, device="cuda")
        four(x)
        eight(x.half())
    c = t.flop_coverage().set_index("op")
    for op in ("bitsandbytes.gemm_4bit.default", "bitsandbytes.int8_scaled_mm.default"):
        assert c.loc[op, "kind"] == "added" and int(c.loc[op, "flops"]) == 2 * 2 * 16 * 256 * 128
