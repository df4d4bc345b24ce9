"""Per-op FLOPs (``fakeviz._engine.flops``) against ``torch.utils.flop_counter.FlopCounterMode``.

Models run on real CPU tensors under ``_FlopMode``, a TorchDispatchMode that
calls ``op_flops`` on every outermost op (the ops the recorder records), with
``FlopCounterMode`` below it for the whole run and a fresh one around each op.
Checked: every op the registry counts gets FlopCounterMode's number, per op and
in total; FlopCounterMode counts nothing on any other op; elementwise ops are
counted; the unknown ops of each model are pinned; a fake run gives the same
per-op FLOPs as the real one; added formulas match hand counts and stay
consistent across the optimizer implementations.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import zoo
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import fakeviz as fv
from fakeviz._analysis.flops import coverage
from fakeviz._engine.flops import FLOP_KINDS, flop_kind, op_flops, resolve_op
from fakeviz._engine.flops import classify as _classify
from fakeviz._engine.flops.formulas import ADDED_FORMULAS, first_tensor

aten = torch.ops.aten
# torch 2.15 counts the CPU flash SDPA itself (flop_registry has it, the CUDA flash formula); before, the formula was ours
CPU_FLASH = "registry" if aten._scaled_dot_product_flash_attention_for_cpu in flop_registry else "added"


# ----------------------------------------------------------------------------- helpers
class _Row:
    """One outermost op call: the op, our FLOPs, FlopCounterMode's FLOPs for this call alone."""

    __slots__ = ("func", "flops", "torch_flops", "out_numel", "scalar_operand")

    def __init__(self, func: Any, flops: int, torch_flops: int | None, out_numel: int, scalar_operand: bool) -> None:
        self.func = func
        self.flops = flops
        self.torch_flops = torch_flops
        self.out_numel = out_numel
        self.scalar_operand = scalar_operand


class _FlopMode(TorchDispatchMode):
    """Calls ``op_flops`` on every op it sees (the outermost dispatch, like the recorder).

    With ``per_op_torch`` each op also runs inside its own FlopCounterMode, so
    FlopCounterMode's count for that single call is known.
    """

    def __init__(self, per_op_torch: bool = False) -> None:
        super().__init__()
        self.per_op_torch = per_op_torch
        self.rows: list[_Row] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == "prim":  # the recorder never records prim.* ops
            return func(*args, **(kwargs or {}))
        torch_flops = None
        if self.per_op_torch:
            with FlopCounterMode(display=False) as fc:
                out = func(*args, **(kwargs or {}))
            torch_flops = fc.get_total_flops()
        else:
            out = func(*args, **(kwargs or {}))
        first_out = first_tensor(out)
        first_in = first_tensor(args)
        self.rows.append(
            _Row(
                func,
                op_flops(func, args, kwargs, out),
                torch_flops,
                first_out.numel() if first_out is not None else -1,
                first_in is not None and first_in.dim() == 0,
            )
        )
        return out


def _hf_model(kind: str, attn: str) -> torch.nn.Module:
    import transformers

    if kind == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=100, max_position_embeddings=32, attention_dropout=0.0,
            attn_implementation=attn,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation=attn,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def _hf_step(kind: str) -> Callable[[], None]:
    """A training step of a tiny Llama / GPT-2 with SDPA attention: fwd, bwd, AdamW."""

    def step() -> None:
        torch.manual_seed(0)
        model = _hf_model(kind, "sdpa")
        torch.manual_seed(1)
        ids = torch.randint(0, 100, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False).step()

    return step


CASES: dict[str, Callable[[], None]] = {name: (lambda name=name: zoo.run(name)) for name in zoo.ZOO}
CASES["llama_sdpa"] = _hf_step("llama")
CASES["gpt2_sdpa"] = _hf_step("gpt2")

#: Ops without a formula, per case (printed by the test; a new one must be looked at).
UNKNOWN_OPS: dict[str, set[str]] = {name: set() for name in CASES}

_RUNS: dict[str, tuple[list[_Row], FlopCounterMode]] = {}


def _run_real(name: str) -> tuple[list[_Row], FlopCounterMode]:
    """One real run of ``CASES[name]`` under FlopCounterMode and a per-op ``_FlopMode`` (cached)."""
    if name not in _RUNS:
        with FlopCounterMode(display=False) as fc, _FlopMode(per_op_torch=True) as mode:
            CASES[name]()
        _RUNS[name] = (mode.rows, fc)
    return _RUNS[name]


# ----------------------------------------------------------------- agreement with torch
@pytest.mark.parametrize("name", list(CASES))
def test_registry_ops_agree_with_flop_counter_mode(name: str) -> None:
    rows, fc = _run_real(name)
    by_packet: dict[Any, int] = collections.defaultdict(int)
    for row in rows:
        kind = flop_kind(row.func)
        if kind == "registry":
            assert row.flops == row.torch_flops, f"{row.func}: ours {row.flops}, FlopCounterMode {row.torch_flops}"
            by_packet[row.func._overloadpacket] += row.flops
        else:
            # FlopCounterMode counts nothing (not even through a decomposition) on any other op
            assert row.torch_flops == 0, f"{row.func} ({kind}): FlopCounterMode counts {row.torch_flops}"
    assert by_packet, "every case runs a matmul or a convolution"
    assert dict(by_packet) == fc.get_flop_counts()["Global"]
    assert sum(by_packet.values()) == fc.get_total_flops()


@pytest.mark.parametrize("name", list(CASES))
def test_every_op_classified_and_unknown_ops_pinned(name: str) -> None:
    rows, _ = _run_real(name)
    kinds: dict[str, set[str]] = collections.defaultdict(set)
    pointwise: set[str] = set()
    for row in rows:
        kind = flop_kind(row.func)
        kinds[kind].add(str(row.func))
        assert kind in FLOP_KINDS
        assert (row.flops == -1) == (kind == "unknown"), f"{row.func}: kind {kind}, flops {row.flops}"
        if kind == "zero":
            assert row.flops == 0, row.func
        if torch.Tag.pointwise in row.func.tags and kind == "added":
            # elementwise arithmetic is counted (FlopCounterMode leaves it at 0): 1 FLOP per output element
            assert row.flops == row.out_numel > 0, f"pointwise {row.func}"
            pointwise.add(str(row.func))
    print(f"\n{name}: unknown ops: {sorted(kinds['unknown'])}")
    assert kinds["unknown"] == UNKNOWN_OPS[name]
    assert "aten.add.Tensor" in pointwise or "aten.add_.Tensor" in pointwise
    # the coverage table of the run lists the same kinds
    table = coverage([str(r.func) for r in rows])
    assert set(table.loc[table["kind"] == "unknown", "op"]) == UNKNOWN_OPS[name]
    assert table["count"].sum() == len(rows)


def test_hf_sdpa_runs_use_and_count_the_cpu_flash_op() -> None:
    for name in ("llama_sdpa", "gpt2_sdpa"):
        rows, _ = _run_real(name)
        flash = [r for r in rows if r.func is aten._scaled_dot_product_flash_attention_for_cpu.default]
        flash_bwd = [r for r in rows if r.func is aten._scaled_dot_product_flash_attention_for_cpu_backward.default]
        assert len(flash) == len(flash_bwd) == 2, name  # two layers
        assert all(r.flops > 0 for r in flash + flash_bwd)
        if CPU_FLASH == "added":  # torch counts nothing for it
            assert all(r.torch_flops == 0 for r in flash + flash_bwd)
        else:  # torch's own count, the same number
            assert all(r.torch_flops == r.flops for r in flash + flash_bwd)


def _kinds_of(rows: list[_Row]) -> dict[str, list[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for row in rows:
        out[flop_kind(row.func)].add(str(row.func))
    return {k: sorted(v) for k, v in out.items()}


def test_hf_kinds_listed() -> None:
    """Print the classification of every op of the Llama and GPT-2 steps (for the report)."""
    for name in ("llama_sdpa", "gpt2_sdpa"):
        kinds = _kinds_of(_run_real(name)[0])
        print(f"\n{name}:")
        for kind in FLOP_KINDS:
            print(f"  {kind}: {kinds.get(kind, [])}")
        assert set(kinds) <= set(FLOP_KINDS)
        assert "aten.mm.default" in kinds["registry"]
        assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in kinds[CPU_FLASH]


# ------------------------------------------------------------------------------ SDPA
@pytest.mark.parametrize(("h_q", "h_kv", "causal"), [(4, 4, False), (4, 2, True)])
def test_cpu_flash_sdpa_gets_the_cuda_flash_formula(h_q: int, h_kv: int, causal: bool) -> None:
    b, l_q, l_k, e = 2, 8, 12, 16
    torch.manual_seed(0)
    q = torch.randn(b, h_q, l_q, e, requires_grad=True)
    k = torch.randn(b, h_kv, l_k, e, requires_grad=True)
    v = torch.randn(b, h_kv, l_k, e, requires_grad=True)
    with _FlopMode() as mode:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h_q != h_kv).sum().backward()
    fwd = [r for r in mode.rows if r.func is aten._scaled_dot_product_flash_attention_for_cpu.default]
    bwd = [r for r in mode.rows if r.func is aten._scaled_dot_product_flash_attention_for_cpu_backward.default]
    assert len(fwd) == len(bwd) == 1
    assert flop_kind(fwd[0].func) == flop_kind(bwd[0].func) == CPU_FLASH

    meta = {n: torch.empty(t.shape, device="meta") for n, t in (("q", q), ("k", k), ("v", v))}
    cuda_fwd = flop_registry[aten._scaled_dot_product_flash_attention](meta["q"], meta["k"], meta["v"], out_val=None)
    cuda_bwd = flop_registry[aten._scaled_dot_product_flash_attention_backward](
        torch.empty(q.shape, device="meta"), meta["q"], meta["k"], meta["v"], out_val=None
    )
    assert fwd[0].flops == cuda_fwd == 2 * (2 * b * h_q * l_q * l_k * e)  # q@k^T, p@v
    assert bwd[0].flops == cuda_bwd == 5 * (2 * b * h_q * l_q * l_k * e)  # recompute, dV, dP, dQ, dK


# ------------------------------------------------------------------------ fake == real
FAKE_CASES = ["mlp", "convnet_channels_last", "gpt2_tied", "llama", "views_inplace", "checkpointed", "llama_sdpa"]


def _arithmetic(ops: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The ops of kind other than "zero", in order, with their FLOPs.

    A fake run dispatches extra zero-FLOP ops (``detach`` when fake parameters
    are made, and around the recorder's module hooks), so only these are compared.
    """
    return [(op, n) for op, n in ops if flop_kind(op) != "zero"]


def _per_op(rows: list[_Row]) -> list[tuple[str, int]]:
    return _arithmetic([(str(r.func), r.flops) for r in rows])


@pytest.mark.parametrize("name", FAKE_CASES)
def test_fake_run_gives_the_real_per_op_flops(name: str) -> None:
    real = _per_op(_run_real(name)[0])
    with fv.record(device="cpu") as trace, _FlopMode() as mode:
        CASES[name]()
    fake = _per_op(mode.rows)
    assert fake == real
    assert sum(n for _, n in fake) > 0
    # the ops the mode saw are the ops the recorder recorded
    assert [op for op, _ in fake] == [op for op, _ in _arithmetic([(str(op), 0) for op in trace.ops["op"]])]


def test_fake_tensor_mode_gives_the_real_per_op_flops() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = _per_op(_run_real("llama_sdpa")[0])
    with FakeTensorMode(), _FlopMode() as mode:
        CASES["llama_sdpa"]()
    assert _per_op(mode.rows) == real


_FAKE_CUDA = fv.fake_cuda_status().mode in ("native", "shim")


@pytest.mark.skipif(not _FAKE_CUDA, reason="no fake cuda in this process (no C++ compiler for the shim)")
def test_fake_cuda_llama_step_has_no_unknown_ops() -> None:
    """The main use: a fake cuda bf16 Llama step with the default (foreach) AdamW."""
    with fv.record(device="cuda:0", dtype=torch.bfloat16):
        with FlopCounterMode(display=False) as fc, _FlopMode() as mode:
            torch.manual_seed(0)
            model = _hf_model("llama", "sdpa")
            ids = torch.randint(0, 100, (2, 8))
            model(input_ids=ids, labels=ids).loss.backward()
            torch.optim.AdamW(model.parameters(), foreach=True).step()
    kinds = _kinds_of(mode.rows)
    print(f"\nfake cuda llama: {kinds}")
    assert kinds.get("unknown", []) == []
    assert "aten._foreach_addcdiv_.ScalarList" in kinds["added"]
    assert all(r.flops > 0 for r in mode.rows if str(r.func).startswith("aten._foreach_") and not r.scalar_operand)
    registry = sum(r.flops for r in mode.rows if flop_kind(r.func) == "registry")
    assert registry == fc.get_total_flops() > 0


# ------------------------------------------------------------------------- symbolic sizes
def test_symbolic_sizes_use_backed_hints_and_refuse_unbacked() -> None:
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    dyn = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    a = mode.from_tensor(torch.randn(4, 3), source=ConstantSource("a"), symbolic_context=dyn)
    b = mode.from_tensor(torch.randn(3, 5))
    assert isinstance(a.shape[0], torch.SymInt)
    with mode, _FlopMode() as fm:
        mm = a @ b  # backed s0 = 4: counted with its hint
        a.exp()
        nz = b.nonzero()  # unbacked u0 rows
        nz.float().t() @ nz.float()
        nz.float().exp()
    flops = {str(r.func): r.flops for r in fm.rows}
    assert isinstance(mm.shape[0], torch.SymInt)
    assert flops["aten.mm.default"] == -1  # the last mm: unbacked sizes
    assert [r.flops for r in fm.rows if str(r.func) == "aten.mm.default"] == [2 * 4 * 3 * 5, -1]
    assert [r.flops for r in fm.rows if str(r.func) == "aten.exp.default"] == [12, -1]


# ------------------------------------------------------------------ kinds, coverage, tables
def test_kinds_of_typical_ops() -> None:
    expected = {
        aten.mm.default: "registry",
        aten.convolution_backward.default: "registry",
        aten._scaled_dot_product_efficient_attention.default: "registry",
        aten._scaled_dot_product_flash_attention_for_cpu.default: CPU_FLASH,
        aten.add.Tensor: "added",
        aten.add_.Tensor: "added",
        aten.masked_fill.Tensor: "added",  # untagged overload of a pointwise op
        aten.hardtanh_backward.default: "added",
        aten.sum.dim_IntList: "added",
        aten.var_mean.correction: "added",
        aten._foreach_add_.List: "added",
        aten._foreach_norm.Scalar: "added",
        aten._fused_adamw_.default: "added",
        aten.native_layer_norm.default: "added",
        aten.clone.default: "zero",  # tagged pointwise, but a copy
        aten._foreach_copy_.default: "zero",
        aten.view.default: "zero",
        aten.t.default: "zero",
        aten.split.Tensor: "zero",
        aten.as_strided_.default: "zero",
        aten.empty.memory_format: "zero",
        aten.randn.default: "zero",
        aten.zeros_like.default: "zero",
        aten.normal_.default: "zero",
        aten._to_copy.default: "zero",
        aten.embedding.default: "zero",
        aten._local_scalar_dense.default: "zero",
        aten._fused_sdp_choice.default: "zero",
        aten.sym_size.int: "zero",
        aten.sort.default: "unknown",
        aten.topk.default: "unknown",
        aten.upsample_nearest2d.default: "unknown",
    }
    got = {op: flop_kind(op) for op in expected}
    assert got == expected
    assert flop_kind("aten.mm.default") == "registry"


def test_custom_and_unresolvable_ops_are_unknown() -> None:
    lib = torch.library.Library("fvflops_test", "FRAGMENT")
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda x: x * 2, "CompositeExplicitAutograd")
    op = torch.ops.fvflops_test.scale.default
    x = torch.ones(3)
    with _FlopMode() as mode:
        op(x)
    assert [(str(r.func), r.flops) for r in mode.rows] == [("fvflops_test.scale.default", -1)]
    assert flop_kind(op) == "unknown"
    for name in ("fvflops_test.scale.default", "nolib.nothing.default", "aten.mm.nosuchoverload", "aten.mm", "junk"):
        assert flop_kind(name) == "unknown", name
    assert resolve_op("aten.mm.default") is aten.mm.default
    assert resolve_op("nolib.nothing.default") is None
    assert resolve_op("aten.mm.nosuchoverload") is None

    table = coverage(
        ["aten.mm.default", "nolib.nothing.default", "aten.view.default", "aten.add.Tensor", "aten.mm.default"],
        [3, 1, 5, 2, 4],
    )
    assert list(table.columns) == ["op", "kind", "count"]
    assert table.to_dict("records") == [
        {"op": "nolib.nothing.default", "kind": "unknown", "count": 1},
        {"op": "aten.add.Tensor", "kind": "added", "count": 2},
        {"op": "aten.mm.default", "kind": "registry", "count": 7},
        {"op": "aten.view.default", "kind": "zero", "count": 5},
    ]
    with pytest.raises(ValueError, match="counts"):
        coverage(["aten.mm.default"], [1, 2])


def test_added_tables_resolve_on_this_torch() -> None:
    """Every op the tables name exists here, and every overload builds its formula."""
    import bitsandbytes  # noqa: F401 - registers the bitsandbytes:: ops named in the table (the test extra has it)
    import transformers.integrations.moe  # noqa: F401 - registers the transformers:: ops named in the table

    for name in ADDED_FORMULAS:
        namespace, _, short = name.rpartition("::")
        packet = getattr(getattr(torch.ops, namespace or "aten"), short)
        # a newer torch's own formula comes first (torch 2.15: the CPU flash SDPA)
        kind = "registry" if packet in flop_registry else "added"
        for overload in packet.overloads():
            assert flop_kind(getattr(packet, overload)) == kind, f"{name}.{overload}"
    for name in _classify._ELEMENTWISE:
        packet = getattr(aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            takes_tensors = any("Tensor" in str(a.type) for a in op._schema.arguments)
            assert flop_kind(op) == ("added" if takes_tensors else "zero"), f"aten.{name}.{overload}"
    assert not [n for n in _classify._ZERO_NAMES if not hasattr(aten, n)]
    for name in _classify._ZERO_NAMES:
        packet = getattr(aten, name)
        for overload in packet.overloads():
            assert flop_kind(getattr(packet, overload)) == "zero", f"aten.{name}.{overload}"


def test_no_registry_op_is_shadowed() -> None:
    for packet in flop_registry:
        if isinstance(packet, torch._ops.OpOverloadPacket):
            for overload in packet.overloads():
                assert flop_kind(getattr(packet, overload)) == "registry"


# ------------------------------------------------------------------------ added formulas
def _flops_of(fn: Callable[[], Any]) -> dict[str, int]:
    with _FlopMode() as mode:
        fn()
    out: dict[str, int] = collections.defaultdict(int)
    for row in mode.rows:
        out[str(row.func)] += row.flops
    return dict(out)


def test_added_formulas_by_hand() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 6, 10)
    n = x.numel()
    w, b = torch.randn(10), torch.randn(10)
    assert _flops_of(lambda: F.layer_norm(x, (10,), w, b))["aten.native_layer_norm.default"] == 7 * n
    assert _flops_of(lambda: F.layer_norm(x, (10,)))["aten.native_layer_norm.default"] == 5 * n
    assert _flops_of(lambda: F.group_norm(x, 2, torch.randn(6)))["aten.native_group_norm.default"] == 6 * n
    assert _flops_of(lambda: torch.softmax(x, -1))["aten._softmax.default"] == 5 * n
    assert _flops_of(lambda: torch.log_softmax(x, -1))["aten._log_softmax.default"] == 5 * n
    assert _flops_of(lambda: x.sum(-1))["aten.sum.dim_IntList"] == n
    assert _flops_of(lambda: x.amax(-1))["aten.amax.default"] == n
    assert _flops_of(lambda: x.var(-1))["aten.var.correction"] == n
    assert _flops_of(lambda: x.cumsum(0))["aten.cumsum.default"] == n
    assert _flops_of(lambda: F.gelu(x))["aten.gelu.default"] == n
    assert _flops_of(lambda: F.hardtanh(x).sum())["aten.hardtanh.default"] == n

    xg = x.clone().requires_grad_()
    wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
    bwd = _flops_of(lambda: F.layer_norm(xg, (10,), wg, bg).sum().backward())
    assert bwd["aten.native_layer_norm_backward.default"] == (2 + 8 + 2 + 1) * n
    bn_in = torch.randn(4, 6, 5, 5, requires_grad=True)
    bn = torch.nn.BatchNorm2d(6)
    bn_fwd = _flops_of(lambda: bn(bn_in).sum().backward())
    assert bn_fwd["aten.native_batch_norm.default"] == 7 * bn_in.numel()
    assert bn_fwd["aten.native_batch_norm_backward.default"] == (2 + 8 + 2 + 1) * bn_in.numel()
    bn.eval()
    assert _flops_of(lambda: bn(bn_in.detach()))["aten.native_batch_norm.default"] == 4 * bn_in.numel()

    a, m2, v = torch.randn(5, 7), torch.randn(7, 3), torch.randn(7)
    assert _flops_of(lambda: torch.randn(5, 3).addmm_(a, m2))["aten.addmm_.default"] == 2 * 5 * 7 * 3
    assert _flops_of(lambda: a @ v)["aten.mv.default"] == 2 * 5 * 7
    assert _flops_of(lambda: v @ v)["aten.dot.default"] == 2 * 7
    assert _flops_of(lambda: torch.addr(torch.zeros(5, 7), torch.randn(5), v))["aten.addr.default"] == 2 * 5 * 7
    b1, b2 = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
    assert _flops_of(lambda: torch.addbmm(torch.zeros(5, 2), b1, b2))["aten.addbmm.default"] == 2 * 3 * 5 * 7 * 2

    logits, target = torch.randn(6, 11, requires_grad=True), torch.randint(0, 11, (6,))
    ce = _flops_of(lambda: F.cross_entropy(logits, target).backward())
    assert ce["aten.nll_loss_forward.default"] == ce["aten.nll_loss_backward.default"] == 6
    assert ce["aten._log_softmax.default"] == 5 * 66 and ce["aten._log_softmax_backward_data.default"] == 4 * 66

    table = torch.zeros(10, 4)
    idx, vals = torch.tensor([1, 3, 1]), torch.ones(3, 4)
    assert _flops_of(lambda: table.index_put_((idx,), vals, accumulate=True))["aten.index_put_.default"] == 12
    assert _flops_of(lambda: table.index_put_((idx,), vals))["aten.index_put_.default"] == 0
    assert _flops_of(lambda: table.index_add_(0, idx, vals))["aten.index_add_.default"] == 12
    emb = torch.nn.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 2], [0, 9, 1]])
    assert _flops_of(lambda: emb(ids).sum().backward())["aten.embedding_dense_backward.default"] == 6 * 4

    img = torch.randn(2, 3, 8, 8)
    assert _flops_of(lambda: F.avg_pool2d(img, 2))["aten.avg_pool2d.default"] == 2 * 3 * 4 * 4 * 4
    assert _flops_of(lambda: F.max_pool2d(img, 2))["aten.max_pool2d_with_indices.default"] == 2 * 3 * 4 * 4 * 4

    ts = [torch.randn(3, 4), torch.randn(5)]
    assert _flops_of(lambda: torch._foreach_add_(ts, ts))["aten._foreach_add_.List"] == 17
    assert _flops_of(lambda: torch._foreach_norm(ts))["aten._foreach_norm.Scalar"] == 17
    assert _flops_of(lambda: torch._foreach_sqrt(ts))["aten._foreach_sqrt.default"] == 17


def _optimizer_flops(make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]) -> list[int]:
    """FLOPs of two optimizer steps, leaving out the ops on 0-dim step counters."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    opt = make(params)
    totals = []
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        with _FlopMode() as mode:
            opt.step()
        assert all(r.flops >= 0 for r in mode.rows), [str(r.func) for r in mode.rows if r.flops < 0]
        totals.append(sum(r.flops for r in mode.rows if not r.scalar_operand))
    return totals


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (torch.optim.AdamW, {"lr": 0.1, "weight_decay": 0.01}),
        (torch.optim.Adam, {"lr": 0.1}),
        (torch.optim.Adam, {"lr": 0.1, "weight_decay": 0.1, "amsgrad": True, "maximize": True}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
        (torch.optim.SGD, {"lr": 0.1}),
    ],
)
def test_fused_foreach_and_single_tensor_optimizers_agree(cls: type, kwargs: dict[str, Any]) -> None:
    """The fused-optimizer constants equal the per-op counts of the unfused implementations."""
    single = _optimizer_flops(lambda ps: cls(ps, **kwargs, foreach=False))
    foreach = _optimizer_flops(lambda ps: cls(ps, **kwargs, foreach=True))
    fused = _optimizer_flops(lambda ps: cls(ps, **kwargs, fused=True))
    assert single == foreach == fused
    assert single[1] > 0


# ------------------------------------------------------------------ mixture of experts
def test_grouped_mm_flops_by_hand() -> None:
    """``_grouped_mm``: ``2 * m_g * k_g * n_g`` per group, summed, for each layout; transformers' fallback op."""
    import transformers.integrations.moe  # noqa: F401 - registers transformers::grouped_mm_fallback

    offs = torch.tensor([3, 5, 9, 10], dtype=torch.int32)
    sizes = [3, 2, 4, 1]  # rows (or columns, or contraction) per group

    def grouped(a: torch.Tensor, b: torch.Tensor, **kw: Any) -> int:
        return _flops_of(lambda: torch._grouped_mm(a, b, **kw))["aten._grouped_mm.default"]

    # [rows, K] x [G, K, N]: group g multiplies its m_g rows by its [K, N]
    assert grouped(torch.randn(10, 16), torch.randn(4, 16, 24), offs=offs) == sum(2 * m * 16 * 24 for m in sizes)
    # [M, K] x [K, N] with K split by offs: group g contracts its k_g (the weight gradient)
    assert grouped(torch.randn(10, 16).t(), torch.randn(10, 24), offs=offs) == sum(2 * 16 * k * 24 for k in sizes)
    # [G, M, K] x [K, N] with N split: group g makes its n_g columns
    assert grouped(torch.randn(4, 5, 16), torch.randn(16, 12), offs=offs) == sum(2 * 5 * 16 * n for n in [3, 2, 4, 3])
    # [G, M, K] x [G, K, N]: a bmm, as the registry counts it
    a3, b3 = torch.randn(4, 5, 16), torch.randn(4, 16, 24)
    assert grouped(a3, b3) == _flops_of(lambda: torch.bmm(a3, b3))["aten.bmm.default"] == 2 * 4 * 5 * 16 * 24
    assert flop_kind("aten._grouped_mm.default") == "added"

    x, w = torch.randn(10, 16, requires_grad=True), torch.randn(4, 16, 8, requires_grad=True)
    fb = _flops_of(lambda: torch.ops.transformers.grouped_mm_fallback(x, w, offs).sum().backward())
    assert fb["transformers.grouped_mm_fallback.default"] == 2 * 10 * 16 * 8
    assert fb["transformers.grouped_mm_fallback_backward.default"] == 2 * (2 * 10 * 16 * 8)  # input and weight grads
    # the same numbers as the grouped op's forward and its two backward products
    xg, wg = torch.randn(10, 16, requires_grad=True), torch.randn(4, 16, 8, requires_grad=True)
    gm = _flops_of(lambda: torch._grouped_mm(xg, wg, offs=offs).pow(2).sum().backward())  # a dense gradient
    assert gm["aten._grouped_mm.default"] == 3 * 2 * 10 * 16 * 8

    # the router's bookkeeping: tokens per expert (histc, an add per token) and token index // top_k
    ids = torch.randint(0, 4, (32,))
    assert _flops_of(lambda: torch.histc(ids.float(), bins=4, min=0, max=3))["aten.histc.default"] == 32
    assert _flops_of(lambda: ids // 2)["aten.floor_divide.default"] == 32


def _matmul_flops(trace: fv.Trace) -> int:
    """FLOPs of the matmul-like ops of a trace: every op the registry counts, and the grouped matmuls."""
    flops = trace.col("flops")
    return sum(
        int(flops[int(seq)])
        for seq, op in zip(trace.ops.seq, trace.ops.op)
        if flop_kind(op) == "registry" or op == "aten._grouped_mm.default"
    )


def test_moe_flops_equal_flop_counter_mode_on_a_per_expert_run() -> None:
    """Mixtral fwd+bwd: our count of the grouped run (fake and real) is FlopCounterMode's on the eager experts.

    transformers' eager experts run one ``linear`` per expert on its tokens (mm, which FlopCounterMode counts);
    the grouped run does the same products in ``_grouped_mm`` calls, which FlopCounterMode does not count.
    The two runs route the same tokens (same seed, same weights), and every row is routed in both.
    """
    from test_moe import record, step

    fake, _ = record(step("mixtral"), device="cpu")
    real, _ = record(step("mixtral"), device="cpu", fake=False)
    with FlopCounterMode(display=False) as fc:
        step("mixtral", experts_implementation="eager")()
    eager = fc.get_total_flops()
    assert _matmul_flops(fake) == _matmul_flops(real) == eager
    with FlopCounterMode(display=False) as fc_grouped:
        step("mixtral")()
    assert fc_grouped.get_total_flops() < eager  # what FlopCounterMode alone would miss: the experts


def test_moe_forward_flops_are_the_dense_rule() -> None:
    """Mixtral forward: matmul FLOPs = 2 * tokens * active matmul parameters + attention's two matmuls."""
    from test_moe import config, record, step

    trace, _ = record(step("mixtral", backward=False), device="cpu")
    c = config("mixtral")
    hidden, layers, inter = c.hidden_size, c.num_hidden_layers, c.intermediate_size
    heads, kv_heads, top_k = c.num_attention_heads, c.num_key_value_heads, c.num_experts_per_tok
    head_dim = hidden // heads
    batch, seq = 2, 8
    tokens = batch * seq
    per_layer = (
        hidden * heads * head_dim  # q
        + 2 * hidden * kv_heads * head_dim  # k, v
        + heads * head_dim * hidden  # o
        + c.num_local_experts * hidden  # router
        + top_k * 3 * hidden * inter  # the active experts' gate, up and down projections
    )
    active = layers * per_layer + c.vocab_size * hidden  # the lm head; the embedding is a lookup
    attention = layers * 2 * (2 * batch * heads * seq * seq * head_dim)  # q @ k^T and p @ v
    assert _matmul_flops(trace) == 2 * tokens * active + attention
