"""Mixture of experts under fake tensors (Note: [grouped_mm under fake tensors] in ``fakeviz._engine.moe``).

Tiny transformers MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3) run one training step
(forward with labels, backward) on fake cpu in float32, bfloat16 and float16, the dtypes the real
``_grouped_mm`` kernels accept, and the fake record equals the real CPU run's: op log, every output's
metadata, storages, peak and its attribution. ``aten._grouped_mm`` itself: the fake rule gives the real
kernel's output (padded strides included) and its errors, logs nothing, and leaves other FakeTensorModes as
torch made them.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fakeviz as fv
from fakeviz._engine import moe

transformers = pytest.importorskip("transformers")

_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=64,
    attn_implementation="eager",
)
#: name -> (model class, config class, config kwargs): 4 experts, top-2, hidden 64, 2 layers.
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(intermediate_size=128, num_local_experts=4,
                                                            num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(intermediate_size=128, moe_intermediate_size=32,
                  shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(intermediate_size=128, moe_intermediate_size=32,
                  num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, head_dim=16)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                                      eos_token_id=None)),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(intermediate_size=128, moe_intermediate_size=32,
                    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                    first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                    v_head_dim=16, num_key_value_heads=4)),
}  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def config(name: str, **overrides: Any) -> Any:
    _, config_cls, kwargs = MODELS[name]
    return getattr(transformers, config_cls)(**{**_COMMON, **kwargs, **overrides})


def step(name: str, *, backward: bool = True, **overrides: Any) -> Callable[[], Any]:
    """One training step of tiny model ``name``: build (seeded), forward with labels, backward."""

    def run() -> Any:
        torch.manual_seed(0)
        model = getattr(transformers, MODELS[name][0])(config(name, **overrides))
        ids = torch.randint(0, 100, (2, 8))
        out = model(input_ids=ids, labels=ids)
        if backward:
            out.loss.backward()
        return model

    return run


def record(fn: Callable[[], Any], **kwargs: Any) -> tuple[fv.Trace, Any]:
    # cyclic garbage is collected when the collector decides to: collect before, not during (as the zoo tests do)
    gc.collect()
    gc.disable()
    try:
        with fv.record(**kwargs) as trace:
            out = fn()
    finally:
        gc.enable()
    assert trace.error is None, trace.error
    return trace, out


class _Errors(logging.Handler):
    """Collects ERROR records of torch's loggers."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> _Errors:
        for name in ("torch", "torch._subclasses.fake_tensor"):
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in ("torch", "torch._subclasses.fake_tensor"):
            logging.getLogger(name).removeHandler(self)


OUTPUT_COLS = ["seq", "shape", "stride", "dtype", "device", "storage", "storage_offset", "nbytes"]
STORAGE_COLS = ["storage", "device", "nbytes", "category", "roles", "name", "alloc_seq", "free_seq", "owner"]
OPS_COLS = ["seq", "op", "phase", "module", "user_line"]


def _rows(df: Any, cols: list[str]) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in df[cols].astype(str).itertuples(index=False)]


def assert_same_record(real: fv.Trace, fake: fv.Trace) -> None:
    """The fake record is the real one: op log, outputs, storages, ops' phase/module/line, peak."""
    a, b = real.oplog_lines(), fake.oplog_lines()
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), (
        f"op logs differ at {first}: real {a[first] if first is not None else len(a)!r}, "
        f"fake {b[first] if first is not None else len(b)!r}"
    )
    assert _rows(real.outputs, OUTPUT_COLS) == _rows(fake.outputs, OUTPUT_COLS)
    assert _rows(real.storages, STORAGE_COLS) == _rows(fake.storages, STORAGE_COLS)
    assert _rows(real.ops, OPS_COLS) == _rows(fake.ops, OPS_COLS)
    assert {d: p["bytes"] for d, p in fake.peak_bytes().items()} == {
        d: p["bytes"] for d, p in real.peak_bytes().items()
    }
    assert {d: p.to_dict() for d, p in fake.peak().items()} == {d: p.to_dict() for d, p in real.peak().items()}


# ------------------------------------------------------------------------ models: fake == real
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(MODELS))
def test_moe_training_step_fake_equals_real(name: str, dtype: str) -> None:
    with _Errors() as errors:
        real, real_model = record(step(name), device="cpu", fake=False, dtype=DTYPES[dtype])
        fake, fake_model = record(step(name), device="cpu", dtype=DTYPES[dtype])
    assert not errors.records, [r.getMessage() for r in errors.records]
    # both runs take transformers' grouped_mm experts, through aten._grouped_mm
    assert real_model.config._experts_implementation == fake_model.config._experts_implementation == "grouped_mm"
    grouped = fake.ops[fake.ops.op == "aten._grouped_mm.default"]
    n_moe = len([m for m in fake_model.modules() if type(m).__name__.endswith("Experts")])
    assert n_moe >= 1 and len(grouped) == 6 * n_moe  # per layer: 2 forward, 4 backward (input and weight grads)
    out = fake.outputs
    assert set(out[out.seq.isin(grouped.seq)].dtype) == {str(DTYPES[dtype])}
    assert fake.meta["fake"] and not real.meta["fake"]
    assert all(fv.is_fake(p) for p in fake_model.parameters())
    assert_same_record(real, fake)


def test_batched_mm_experts_fake_equals_real() -> None:
    """The other experts implementation transformers offers on every device: a bmm per (token, expert) pair."""
    real, model = record(step("mixtral", experts_implementation="batched_mm"), device="cpu", fake=False)
    fake, _ = record(step("mixtral", experts_implementation="batched_mm"), device="cpu")
    assert model.config._experts_implementation == "batched_mm"
    assert "aten.bmm.default" in set(fake.ops.op) and "aten._grouped_mm.default" not in set(fake.ops.op)
    assert_same_record(real, fake)


def test_symbolic_session_runs_the_grouped_mm_rule() -> None:
    fake, _ = record(step("mixtral"), device="cpu", symbolic=True)
    real, _ = record(step("mixtral"), device="cpu", fake=False)
    assert fake.oplog_lines() == real.oplog_lines()


# ------------------------------------------------------------------ aten._grouped_mm on its own
_OFFS = [3, 5, 9, 10]


def _layouts(dtype: torch.dtype) -> dict[str, Callable[[], torch.Tensor]]:
    """Each operand layout the kernel takes; two with an output last dimension (21) that needs padding."""

    def offs() -> torch.Tensor:
        return torch.tensor(_OFFS, dtype=torch.int32)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype)

    return {
        "2d_3d": lambda: torch._grouped_mm(r(10, 16), r(4, 16, 24), offs=offs()),
        "2d_3d_transposed_padded": lambda: torch._grouped_mm(r(10, 16), r(4, 21, 16).transpose(-2, -1), offs=offs()),
        "2d_2d": lambda: torch._grouped_mm(r(32, 16).t(), r(32, 24), offs=offs()),
        "3d_2d": lambda: torch._grouped_mm(r(4, 5, 16), r(16, 24), offs=offs()),
        "3d_3d_padded": lambda: torch._grouped_mm(r(4, 5, 16), r(4, 21, 16).transpose(-1, -2)),
    }


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", list(_layouts(torch.float32)))
def test_grouped_mm_output_is_the_real_kernels(layout: str, dtype: str) -> None:
    fn = _layouts(DTYPES[dtype])[layout]
    real, out_real = record(fn, fake=False)
    with _Errors() as errors:
        fake, out_fake = record(fn)
    assert not errors.records
    assert fv.is_fake(out_fake) and not fv.is_fake(out_real)
    assert (out_fake.shape, out_fake.stride(), out_fake.dtype) == (out_real.shape, out_real.stride(), out_real.dtype)
    assert out_fake.untyped_storage().nbytes() == out_real.untyped_storage().nbytes()
    assert_same_record(real, fake)
    if "padded" in layout:  # the kernel pads the last dimension's stride to 16 bytes
        assert out_real.stride()[-2] > out_real.shape[-1]


_BAD: dict[str, Callable[[], Any]] = {
    "float64": lambda: torch._grouped_mm(torch.randn(10, 16, dtype=torch.float64), torch.randn(4, 16, 8),
                                         offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "int32_b": lambda: torch._grouped_mm(torch.randn(10, 16), torch.ones(4, 16, 8, dtype=torch.int32),
                                         offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "mixed_2d": lambda: torch._grouped_mm(torch.randn(10, 16), torch.randn(4, 16, 8, dtype=torch.bfloat16),
                                          offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "mixed_3d": lambda: torch._grouped_mm(torch.randn(4, 5, 16, dtype=torch.float16),
                                          torch.randn(4, 16, 8, dtype=torch.bfloat16)),
    "1d": lambda: torch._grouped_mm(torch.randn(16), torch.randn(4, 16, 8), offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "contraction": lambda: torch._grouped_mm(torch.randn(10, 8), torch.randn(4, 16, 8),
                                             offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "no_offs": lambda: torch._grouped_mm(torch.randn(10, 16), torch.randn(4, 16, 8)),
    "offs_3d_3d": lambda: torch._grouped_mm(torch.randn(4, 5, 16), torch.randn(4, 16, 8),
                                            offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "offs_2d": lambda: torch._grouped_mm(torch.randn(10, 16), torch.randn(4, 16, 8),
                                         offs=torch.tensor(_OFFS, dtype=torch.int32).view(2, 2)),
    "offs_int64": lambda: torch._grouped_mm(torch.randn(10, 16), torch.randn(4, 16, 8), offs=torch.tensor(_OFFS)),
    "bias": lambda: torch._grouped_mm(torch.randn(10, 16), torch.randn(4, 16, 8),
                                      offs=torch.tensor(_OFFS, dtype=torch.int32), bias=torch.randn(4, 8)),
    "out_dtype": lambda: torch._grouped_mm(torch.randn(10, 16), torch.randn(4, 16, 8),
                                           offs=torch.tensor(_OFFS, dtype=torch.int32), out_dtype=torch.bfloat16),
    "groups": lambda: torch._grouped_mm(torch.randn(10, 16), torch.randn(3, 16, 8),
                                        offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "batch": lambda: torch._grouped_mm(torch.randn(3, 5, 16), torch.randn(4, 16, 8)),
    "stride_unaligned": lambda: torch._grouped_mm(torch.randn(10, 18)[:, :16], torch.randn(4, 16, 8),
                                                  offs=torch.tensor(_OFFS, dtype=torch.int32)),
    "stride_invalid": lambda: torch._grouped_mm(torch.randn(10, 16)[:, ::2], torch.randn(4, 8, 8),
                                                offs=torch.tensor(_OFFS, dtype=torch.int32)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(_BAD))
def test_grouped_mm_errors_are_the_real_kernels(case: str) -> None:
    with pytest.raises(RuntimeError) as real:
        with fv.record(fake=False):
            _BAD[case]()
    with _Errors() as errors, pytest.raises(RuntimeError) as fake:
        with fv.record() as trace:
            _BAD[case]()
    assert not errors.records  # torch's meta kernel would log a traceback at ERROR for each failure
    assert str(real.value).splitlines()[0] == str(fake.value).splitlines()[0]
    assert trace.error is not None and trace.error["op"] == "aten._grouped_mm.default"
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None  # no fake mode left active


def test_fake_cuda_checks_the_data_pointer_alignment() -> None:
    """On CUDA the kernel wants 16-byte aligned operands (storages start 512-byte aligned: the offset decides)."""
    offs = [3, 5, 9, 10]
    with fv.record(device="cuda:0") as trace:
        a = torch.randn(11, 16, dtype=torch.bfloat16)
        b = torch.randn(4, 16, 8, dtype=torch.bfloat16)
        out = torch._grouped_mm(a[1:], b, offs=torch.tensor(offs, dtype=torch.int32))  # offset 16 elements: aligned
        with pytest.raises(RuntimeError, match="expected data_ptr to be aligned to 16 bytes"):
            torch._grouped_mm(a.view(-1)[4:164].view(10, 16), b, offs=torch.tensor(offs, dtype=torch.int32))
    assert out.device == torch.device("cuda:0") and out.shape == (10, 8) and out.stride() == (8, 1)
    assert trace.error is None or trace.error["op"] == "aten._grouped_mm.default"
    with fv.record(device="cpu", fake=False):  # the CPU kernel does not check the pointer
        a = torch.randn(11 * 16, dtype=torch.bfloat16)
        torch._grouped_mm(a[4:164].view(10, 16), torch.randn(4, 16, 8, dtype=torch.bfloat16),
                          offs=torch.tensor(offs, dtype=torch.int32))  # fmt: skip


def _torchs_meta_kernel(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor | str:
    """What torch's meta kernel of ``_grouped_mm`` does on meta copies of the operands: its output or its error."""
    on_meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (a, b, offs)]
    try:
        return torch._grouped_mm(on_meta[0], on_meta[1], offs=on_meta[2])
    except RuntimeError as e:
        return str(e)


def test_other_fake_modes_keep_torchs_rule() -> None:
    """The rule is fakeviz's modes' only: a plain FakeTensorMode runs torch's meta kernel, whatever it does on this
    torch (2.13, 2.14: bfloat16 only, float32 refused; 2.15 takes float32 too)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    assert not moe.adopted(mode)
    # shapes no other test uses (one dispatch cache)
    torchs = _torchs_meta_kernel(torch.empty(6, 32), torch.empty(2, 32, 16), torch.empty(2, dtype=torch.int32))
    with mode:
        a, b = torch.randn(6, 32), torch.randn(2, 32, 16)
        offs = torch.tensor([2, 6], dtype=torch.int32)
        # torch's words: 2.13 "Expected inputs of BF16 type", 2.14 "Expected mat_a to be BFloat16 or ..."
        if isinstance(torchs, str):
            with _Errors() as errors, pytest.raises(RuntimeError, match=re.escape(torchs)):
                torch._grouped_mm(a, b, offs=offs)
            assert errors.records  # torch logs its meta kernel's failure; the handler sees what a test above would
        else:
            out = torch._grouped_mm(a, b, offs=offs)
            assert (out.shape, out.stride(), out.dtype) == (torchs.shape, torchs.stride(), torchs.dtype)
    assert moe._grouped_mm_rule(mode, torch.ops.aten._grouped_mm.default, a, b, offs) is NotImplemented
    with fv.fake_mode() as ours:
        assert moe.adopted(ours)
        out = torch._grouped_mm(
            torch.randn(6, 32), torch.randn(2, 32, 16), offs=torch.tensor([2, 6], dtype=torch.int32)
        )
    assert out.shape == (6, 16) and out.dtype == torch.float32


def test_fidelity_names_the_rule_and_the_routing_assumption() -> None:
    trace, _ = record(step("mixtral"), device="cpu")
    rep = trace.fidelity()
    ops = rep["ops"].set_index("op")
    assert ops.loc["aten._grouped_mm.default", "rule"] == "fakeviz rule"
    assert "aten._grouped_mm.default" not in set(rep["without_meta"].op)
    rows = rep["assumptions"]
    grouped = rows[rows.op == "aten._grouped_mm.default"]
    assert len(grouped) == 1 and grouped.calls.iloc[0] == ops.loc["aten._grouped_mm.default", "count"] == 12
    assert grouped.seq.iloc[0] == ops.loc["aten._grouped_mm.default", "first_seq"]
    assert "every row is routed" in grouped.assumption.iloc[0]


def test_transformers_fallback_op_fake_equals_real() -> None:
    """``transformers::grouped_mm_fallback`` (taken on GPUs below sm80 and under torch.compile): one op each way."""
    import transformers.integrations.moe  # noqa: F401 - registers the custom ops

    def run() -> None:
        torch.manual_seed(0)
        x = torch.randn(10, 16, requires_grad=True)
        w = torch.randn(4, 16, 8, requires_grad=True)
        torch.ops.transformers.grouped_mm_fallback(x, w, torch.tensor(_OFFS, dtype=torch.int32)).sum().backward()

    real, _ = record(run, fake=False)
    fake, _ = record(run)
    assert {"transformers.grouped_mm_fallback.default", "transformers.grouped_mm_fallback_backward.default"} <= set(
        fake.ops.op
    )
    assert_same_record(real, fake)


# ------------------------------------------------------------------------------- fake cuda
_CUDA_API = importlib.util.find_spec("fakeviz._engine.cuda_api") is not None
needs_cuda_api = pytest.mark.xfail(
    not _CUDA_API,
    reason="needs torch.cuda answers inside fake cuda sessions (fakeviz/_engine/cuda_api.py, not yet in the tree): "
    "transformers asks torch.cuda.get_device_capability before choosing grouped_mm and gets 'Torch not compiled "
    "with CUDA enabled'",
    raises=(AssertionError, RuntimeError, AttributeError),
    strict=True,
)


@needs_cuda_api
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_mixtral_on_fake_cuda_h100(dtype: str) -> None:
    with _Errors() as errors:
        trace, model = record(step("mixtral"), device="cuda:0", gpu="H100", dtype=DTYPES[dtype])
    assert not errors.records
    assert model.config._experts_implementation == "grouped_mm"
    grouped = trace.ops[trace.ops.op == "aten._grouped_mm.default"]
    assert len(grouped) == 12
    out = trace.outputs[trace.outputs.seq.isin(grouped.seq)]
    assert set(out.device) == {"cuda:0"}
    flops = trace.col("flops")
    assert all(flops[int(seq)] > 0 for seq in grouped.seq)
    # the cuda kernel makes the cpu kernel's output (create_grouped_gemm_output_tensor): same shapes and strides
    cpu, _ = record(step("mixtral"), device="cpu", dtype=DTYPES[dtype])
    cpu_out = cpu.outputs[cpu.outputs.seq.isin(cpu.ops[cpu.ops.op == "aten._grouped_mm.default"].seq)]
    assert _rows(out, ["shape", "stride", "dtype", "nbytes"]) == _rows(cpu_out, ["shape", "stride", "dtype", "nbytes"])


@needs_cuda_api
def test_mixtral_on_fake_cuda_v100_takes_transformers_fallback() -> None:
    """Below sm80 transformers does not call torch._grouped_mm but its own per-expert loop (a custom op)."""
    trace, _ = record(step("mixtral"), device="cuda:0", gpu="V100 32GB")
    ops = set(trace.ops.op)
    assert "transformers.grouped_mm_fallback.default" in ops and "aten._grouped_mm.default" not in ops
    flops = trace.col("flops")
    assert all(flops[int(seq)] > 0 for seq in trace.ops[trace.ops.op.str.startswith("transformers.")].seq)


# ------------------------------------------------------------------ routing (Note: [values under fake tensors], 4.)
def _forced_step(name: str, routing: str | None, **overrides: Any) -> Callable[[], Any]:
    """``step`` with eager experts; with ``routing``, every router's top-k indices are replaced (a forward hook)
    by :func:`fakeviz._engine.values.routing_indices`: a real run routed as the assumption says."""
    from fakeviz._engine.values import routing_indices

    def run() -> Any:
        torch.manual_seed(0)
        model = getattr(transformers, MODELS[name][0])(config(name, experts_implementation="eager", **overrides))
        if routing is not None:

            def force(mod: Any, args: Any, out: Any) -> Any:
                logits, scores, idx = out
                forced = routing_indices(idx.shape[0], idx.shape[1], logits.shape[-1], routing)
                return logits, scores, forced

            for mod in model.modules():
                if type(mod).__name__.endswith("TopKRouter"):
                    mod.register_forward_hook(force)
        ids = torch.randint(0, 100, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        return model

    return run


def _expert_matmuls(trace: fv.Trace, phase: str | None = None) -> list[str]:
    """The matmuls inside the experts modules, as 'dtype[shape] op' in order: their sizes are the tokens each
    expert got."""
    out = []
    for line, module, ph in zip(trace.oplog_lines(), trace.ops["module"], trace.ops["phase"]):
        if phase is not None and ph != phase:
            continue
        if isinstance(module, str) and module.endswith(".experts") and " aten.mm." in f" {line.split(' = ', 1)[1]}":
            lhs, rhs = line.split(" = ", 1)
            out.append(f"{lhs.split(': ', 1)[1]} {rhs.split('(', 1)[0]}")
    return out


@pytest.mark.parametrize("routing", ["balanced", "skewed"])
@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_assumed_routing_equals_a_real_run_routed_so(name: str, routing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values of the hidden states unknown (as at full size): the eager experts' matmuls follow the assumed
    routing exactly as a real run whose routers pick those experts."""
    from fakeviz._engine import values

    real, _ = record(_forced_step(name, routing), device="cpu", fake=False)
    monkeypatch.setattr(values, "VALUE_LIMIT", 16)  # router scores [16, 4] unknown; arange(5) still known
    fake, model = record(_forced_step(name, None), device="cpu", routing=routing)
    assert model.config._experts_implementation == "eager"
    a, b = _expert_matmuls(real), _expert_matmuls(fake)
    assert a and a == b
    fwd = _expert_matmuls(fake, phase="forward")
    rows = {int(x.split("[", 1)[1].split(",")[0]) for x in fwd}
    assert rows == ({8} if routing == "balanced" else {16})  # 16 tokens x top-2 over 4 experts; all to 2 experts
    table = fake.fidelity()["assumptions"]
    routed = table[table.op == "aten.topk.default"]
    n_layers = config(name).num_hidden_layers
    assert len(routed) == n_layers and all(f"assumed {routing}" in t for t in routed.assumption)
    assert routed.module.str.endswith("gate").all()


def test_skewed_routing_loads_one_expert_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skewed: the largest per-expert matmul (tokens of the busiest expert) is the most any routing gives; the
    rows saved for backward (tokens x k) are as many as balanced routing's."""
    from fakeviz._engine import values

    monkeypatch.setattr(values, "VALUE_LIMIT", 16)
    rows = {}
    for routing in ("balanced", "skewed"):
        fake, _ = record(_forced_step("mixtral", None), device="cpu", routing=routing)
        fwd = _expert_matmuls(fake, phase="forward")
        sizes = [int(x.split("[", 1)[1].split(",")[0]) for x in fwd]
        rows[routing] = (max(sizes), sum(sizes))
    assert rows["skewed"][0] == 2 * 8 == 2 * rows["balanced"][0]  # all 16 tokens vs 16 * 2 / 4
    assert rows["skewed"][1] == rows["balanced"][1]


def test_no_routing_assumption_stops_at_the_read_and_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    """routing=None: nothing assumed of the router; the eager experts read the routing (which experts were
    hit) and the run stops there, naming the line and the option."""
    from fakeviz._engine import values

    monkeypatch.setattr(values, "VALUE_LIMIT", 16)
    gc.collect()
    with pytest.raises(fv.DataDependentError) as info:
        with fv.record(device="cpu", routing=None) as fake:
            _forced_step("mixtral", None)()
    text = str(info.value)
    assert "if expert_idx == self.num_experts" in text and "record(routing='balanced')" in text
    assert len(text.splitlines()) <= 25
    assert fake.meta["routing"] is None and fake.error is not None


def test_routing_on_the_grouped_path_changes_nothing_but_the_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' default grouped_mm experts: the record is the same whatever the routing."""
    from fakeviz._engine import values

    monkeypatch.setattr(values, "VALUE_LIMIT", 16)
    logs = {r: record(step("mixtral"), device="cpu", routing=r)[0].oplog_lines() for r in ("balanced", "skewed")}
    assert logs["balanced"] == logs["skewed"]


def test_bad_routing_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="routing='even': use 'balanced'"):
        fv.record(routing="even")
