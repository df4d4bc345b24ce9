"""Pre-quantized checkpoints: from_pretrained of bitsandbytes, GPTQ, AWQ, fp8 and compressed-tensors checkpoints,
read from their headers (sparse safetensors files: no tensor data), with their quantization_config."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from sparse_safetensors import write_sparse_safetensors

import fakeviz as fv
from fakeviz import models
from fakeviz._core.errors import ArgumentError, CheckpointError, FakeVizWarning
from fakeviz._engine import quant_kernels
from fakeviz._engine.checkpoint import read_checkpoint
from fakeviz.models import _prequantized as pq

transformers = pytest.importorskip("transformers")

H, FF, L, V = 64, 128, 2, 64  # hidden, intermediate, layers, vocabulary
KV = 32  # two key/value heads of 16
LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=V, hidden_size=H, intermediate_size=FF,
    num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=False,
)  # fmt: skip
LINEARS = {  # name -> (in, out)
    "self_attn.q_proj": (H, H), "self_attn.k_proj": (H, KV), "self_attn.v_proj": (H, KV), "self_attn.o_proj": (H, H),
    "mlp.gate_proj": (H, FF), "mlp.up_proj": (H, FF), "mlp.down_proj": (FF, H),
}  # fmt: skip
SIZE = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1}
DTYPE = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32, "I8": torch.int8,
         "U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn}  # fmt: skip


@pytest.fixture(autouse=True)
def _quiet():
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)


# ------------------------------------------------------------------------ the formats' layers, as published repos store them
def gptq(i: int, o: int, bits: int = 4, group: int = 32) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {"qweight": ("I32", (i * bits // 32, o)), "qzeros": ("I32", (i // group, o * bits // 32)),
            "scales": ("F16", (i // group, o)), "g_idx": ("I32", (i,))}  # fmt: skip


def awq(i: int, o: int, group: int = 32) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        "qweight": ("I32", (i, o // 8)),
        "qzeros": ("I32", (i // group, o // 8)),
        "scales": ("F16", (i // group, o)),
    }


def fp8_block(i: int, o: int, block: int = 32) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {"weight": ("F8_E4M3", (o, i)), "weight_scale_inv": ("F32", (-(-o // block), -(-i // block)))}


def ct_fp8(i: int, o: int) -> dict[str, tuple[str, tuple[int, ...]]]:  # channel scales, dynamic per-token input
    return {"weight": ("F8_E4M3", (o, i)), "weight_scale": ("BF16", (o, 1))}


def ct_int8(i: int, o: int) -> dict[str, tuple[str, tuple[int, ...]]]:  # channel scales, static input scale
    return {"weight": ("I8", (o, i)), "weight_scale": ("BF16", (o, 1)), "input_scale": ("BF16", (1,))}


def bnb4(quant_type: str, nested: bool) -> Any:
    def layer(i: int, o: int) -> dict[str, tuple[str, tuple[int, ...]]]:
        n, blocks = i * o, i * o // 64
        rest = {"quant_type": quant_type, "blocksize": 64, "dtype": "bfloat16", "shape": [o, i]}
        t = {"weight": ("U8", (n // 2, 1)), "weight.absmax": ("U8" if nested else "F32", (blocks,)),
             "weight.quant_map": ("F32", (16,))}  # fmt: skip
        if nested:
            rest.update(nested_blocksize=256, nested_dtype="float32", nested_offset=0.08713531494140625)
            t["weight.nested_absmax"] = ("F32", (-(-blocks // 256),))
            t["weight.nested_quant_map"] = ("F32", (256,))
        t[f"weight.quant_state.bitsandbytes__{quant_type}"] = ("U8", (len(json.dumps(rest)),))  # bitsandbytes' JSON
        return t

    return layer


def bnb8(i: int, o: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {"weight": ("I8", (o, i)), "SCB": ("F32", (o,)), "weight_format": ("U8", ())}


CT_GROUP = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                                               "dynamic": False}}  # fmt: skip
FORMATS: dict[str, tuple[dict[str, Any], Any, str]] = {  # name -> (quantization_config, layer, unquantized dtype)
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}, gptq, "F16"),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}, awq, "F16"),
    "fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32]}, fp8_block, "BF16"),
    "ct-fp8": ({"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {**CT_GROUP, "input_activations": {"num_bits": 8, "type": "float",
                                                                                 "strategy": "token", "dynamic": True}}}},
               ct_fp8, "BF16"),
    "ct-int8": ({"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
                 "config_groups": {"group_0": {**CT_GROUP, "weights": {**CT_GROUP["weights"], "type": "int"},
                                               "input_activations": {"num_bits": 8, "type": "int",
                                                                     "strategy": "tensor", "dynamic": False}}}},
                ct_int8, "BF16"),
    "nf4": ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
             "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}, bnb4("nf4", True), "BF16"),
    "fp4": ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "fp4",
             "bnb_4bit_use_double_quant": False, "bnb_4bit_compute_dtype": "bfloat16"}, bnb4("fp4", False), "BF16"),
    "int8": ({"quant_method": "bitsandbytes", "load_in_8bit": True, "llm_int8_threshold": 6.0}, bnb8, "F16"),
}  # fmt: skip
KERNEL = {"gptq": "fakeviz.gptq_gemm.default", "awq": "fakeviz.awq_gemm.default",
          "fp8": "fakeviz.scaled_matmul.default", "ct-fp8": "fakeviz.scaled_matmul.default",
          "ct-int8": "fakeviz.scaled_matmul.default"}  # fmt: skip
LAYER = {"gptq": "GPTQLinear", "awq": "AWQLinear", "fp8": "FineGrainedFP8Linear", "ct-fp8": "CompressedLinear",
         "ct-int8": "CompressedLinear", "nf4": "Linear4bit", "fp4": "Linear4bit", "int8": "Linear8bitLt"}  # fmt: skip


def write_checkpoint(folder: Path, fmt: str, qc: dict[str, Any] | None = None, dense: set[str] = frozenset()) -> Any:
    """A tiny Llama checkpoint in format ``fmt`` (a sparse safetensors file: headers only; the layers named in
    ``dense`` stored unquantized); returns its header."""
    qconf, lin, fdt = FORMATS[fmt]
    folder.mkdir(parents=True, exist_ok=True)
    dtype = {"F16": "float16", "BF16": "bfloat16"}[fdt]
    (folder / "config.json").write_text(json.dumps({**LLAMA, "torch_dtype": dtype, "quantization_config": qc or qconf}))
    spec: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": (fdt, (V, H)),
                                                    "model.norm.weight": (fdt, (H,)), "lm_head.weight": (fdt, (V, H))}  # fmt: skip
    for i in range(L):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            spec[f"model.layers.{i}.{norm}.weight"] = (fdt, (H,))
        for name, (n_in, n_out) in LINEARS.items():
            for k, v in (lin(n_in, n_out) if name not in dense else {"weight": ("BF16", (n_out, n_in))}).items():
                spec[f"model.layers.{i}.{name}.{k}"] = v
    write_sparse_safetensors(folder / "model.safetensors", {k: (c, s, SIZE[c]) for k, (c, s) in spec.items()})
    return spec


def load(tmp_path: Path, fmt: str, qc: dict[str, Any] | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    header = write_checkpoint(tmp_path / fmt, fmt, qc)
    if fmt in ("nf4", "fp4", "int8") and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed")  # (imported by from_pretrained, inside its fake session)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)  # names and shapes agree with the checkpoint
        model = models.from_pretrained(tmp_path / fmt, device="cuda:0", strict=True)
    return model, header


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of every tensor the model holds for its checkpoint: parameters, persistent buffers, bitsandbytes'
    quant-state tensors."""
    seen: dict[int, int] = {}
    persistent = model.state_dict(keep_vars=True)  # not the rotary embedding's inv_freq (non-persistent buffers)
    for t in [*model.parameters(), *(b for n, b in model.named_buffers() if n in persistent)]:
        seen[id(t)] = t.numel() * t.element_size()
        qs = getattr(t, "quant_state", None)
        if qs is not None:
            parts = [qs.absmax, qs.code, qs.offset] + ([qs.state2.absmax, qs.state2.code] if qs.nested else [])
            seen.update({id(p): p.numel() * p.element_size() for p in parts if p is not None})
        scb = getattr(t, "SCB", None)
        if scb is not None:
            seen[id(scb)] = scb.numel() * scb.element_size()
    return sum(seen.values())


# ------------------------------------------------------------------------ the layers hold the headers' tensors
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_layers_hold_the_checkpoint_tensors_as_stored(tmp_path, fmt):
    model, header = load(tmp_path, fmt)
    layer = model.model.layers[1].mlp.down_proj
    assert type(layer).__name__ == LAYER[fmt]
    if fmt == "fp8":  # transformers' own layer, built by its constructor
        from transformers.integrations.finegrained_fp8 import FP8Linear

        assert isinstance(layer, FP8Linear) and layer.block_size == (32, 32)
    # names, dtypes and shapes: the state dict is the header, tensor for tensor
    got = {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}
    assert got == {k: (DTYPE[c], s) for k, (c, s) in header.items()}
    held = [*model.parameters(), *model.buffers()]  # (bitsandbytes' state dict packs new tensors, outside any mode)
    assert all(fv.is_fake(t) and t.device == torch.device("cuda:0") for t in held)
    # the unquantized tensors at the checkpoint's dtype; the quantized ones frozen
    assert model.model.embed_tokens.weight.dtype == DTYPE[FORMATS[fmt][2]]
    assert not any(t.requires_grad for t in layer.parameters())

    # bytes held = the file's tensor bytes; bitsandbytes parses its packed JSON tensor (not held) into a QuantState
    # whose nested offset is a float32 scalar tensor (held)
    ckpt = read_checkpoint(tmp_path / fmt)
    expected = ckpt.nbytes()
    if fmt in ("nf4", "fp4"):
        packed = [t for k, t in ckpt.tensors.items() if ".quant_state.bitsandbytes__" in k]
        expected += -sum(t.numel for t in packed) + (4 * len(packed) if fmt == "nf4" else 0)
    if fmt == "int8":  # LLM.int8's weight_format (0 = row-major) is written back by its state dict, not held
        expected -= sum(t.numel for k, t in ckpt.tensors.items() if k.endswith("weight_format"))
    assert held_bytes(model) == expected


def test_quantized_layers_come_from_the_headers_not_the_config(tmp_path):
    """A layer the checkpoint stores dense in a quantized model (o_proj here, lm_head everywhere) stays a dense
    nn.Linear at the checkpoint's dtype."""
    header = write_checkpoint(tmp_path, "gptq", dense={"self_attn.o_proj"})
    model = models.from_pretrained(tmp_path, strict=True)
    attn = model.model.layers[0].self_attn
    assert type(attn.q_proj).__name__ == "GPTQLinear" and type(attn.o_proj) is torch.nn.Linear
    assert attn.o_proj.weight.dtype == torch.bfloat16
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == torch.float16
    assert set(model.state_dict()) == set(header)


# ------------------------------------------------------------------------ forward and backward record
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_forward_records_with_the_right_shapes(tmp_path, fmt):
    # LLM.int8's outlier columns (threshold 6.0, as published repos have) depend on the activations' values: a
    # question for the bitsandbytes layer under fake tensors (Note: [bitsandbytes under fake tensors]), not for
    # reading the checkpoint; without outlier decomposition (threshold 0) its forward records
    model, _ = load(tmp_path, fmt, {**FORMATS[fmt][0], "llm_int8_threshold": 0.0} if fmt == "int8" else None)
    with fv.record(device="cuda:0") as trace:
        logits = model(input_ids=torch.randint(0, V, (2, 40))).logits
    assert trace.error is None
    assert tuple(logits.shape) == (2, 40, V) and logits.dtype == DTYPE[FORMATS[fmt][2]]
    f = trace.fidelity()
    ops = f["ops"].set_index("op")
    if fmt in KERNEL:  # the kernel's fake rule, 7 linear layers x 2
        assert ops.loc[KERNEL[fmt], "count"] == 7 * L and ops.loc[KERNEL[fmt], "rule"] == "fakeviz rule"
        rows = f["assumptions"][f["assumptions"].op == KERNEL[fmt]]
        assert len(rows) == 1 and rows.assumption.iloc[0].startswith("recorded through a fake rule, not the library's")
        assert rows.calls.iloc[0] == 7 * L
        # their FLOPs: the matmul each computes, 2 * rows * in * out
        names = list(trace.string_tables()["ops"])
        flops = trace.col("flops")[trace.col("op") == names.index(KERNEL[fmt])]
        assert int(flops.sum()) == L * sum(2 * 80 * n_in * n_out for n_in, n_out in LINEARS.values())
    else:  # bitsandbytes' own ops
        assert any(op.startswith("bitsandbytes.") for op in ops.index)
        assert not any(op.startswith("fakeviz.") for op in ops.index)


def _workspaces(trace: Any, op: str) -> list[tuple[int, int]]:
    """(bytes, lifetime in ops) of each storage ``op`` made that was freed within the record."""
    st = trace.storages
    st = st[(st.op == op) & (st.free_seq >= 0)]
    return sorted({(int(b), int(f - a)) for b, a, f in zip(st.nbytes, st.alloc_seq, st.free_seq)})


@pytest.mark.parametrize(("rows", "dequantized"), [(80, True), (40, False)])
def test_gptq_workspace_is_exllamas_dequantized_weight(tmp_path, rows, dequantized):
    model, _ = load(tmp_path, "gptq")
    with fv.record(device="cuda:0") as trace:
        model(input_ids=torch.randint(0, V, (1, rows)))
    spaces = _workspaces(trace, "fakeviz.gptq_gemm.default")
    # above 50 rows ExLlamaV2 reconstructs the float16 weight [in, out]; the layer drops it at once
    want = {(n_in * n_out * 2, 1) for n_in, n_out in LINEARS.values()} if dequantized else set()
    assert {s for s in spaces if s[1] == 1 and s[0]} == want  # (a call without workspace returns an empty one)


def test_awq_workspace_is_the_split_k_partial_sums(tmp_path):
    model, _ = load(tmp_path, "awq")
    with fv.record(device="cuda:0") as trace:
        model(input_ids=torch.randint(0, V, (2, 20)))
    spaces = _workspaces(trace, "fakeviz.awq_gemm.default")
    assert {(8 * 40 * n_out * 2, 1) for _, n_out in LINEARS.values()} <= set(spaces)


def test_fp8_workspace_is_the_quantized_activation(tmp_path):
    model, _ = load(tmp_path, "fp8")
    with fv.record(device="cuda:0") as trace:
        model(input_ids=torch.randint(0, V, (2, 20)))
    spaces = set(_workspaces(trace, "fakeviz.scaled_matmul.default"))
    for n_in in {i for i, _ in LINEARS.values()}:
        assert (40 * n_in, 1) in spaces  # float8 activation, 1 byte each
        assert (40 * (n_in // 32) * 4, 1) in spaces  # float32 scale per 1 x 32 group


@pytest.mark.parametrize("fmt", list(KERNEL))
def test_backward_reaches_the_trainable_parameters_through_quantized_layers(tmp_path, fmt):
    model, _ = load(tmp_path, fmt)
    with fv.record(device="cuda:0") as trace:
        ids = torch.randint(0, V, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
    assert trace.error is None
    assert model.model.embed_tokens.weight.grad is not None  # through every quantized layer's input gradient
    assert all(t.grad is None for t in model.model.layers[0].mlp.up_proj.parameters())


# ------------------------------------------------------------------------ the fake rules against the ops run for real
def _layer_run(fmt: str, fake: bool, rows: int) -> Any:
    qc, lin, _ = FORMATS[fmt]
    tensors = {k: _info(c, s) for k, (c, s) in lin(FF, H).items()}
    with fv.record(fake=fake) as trace:
        torch.manual_seed(0)
        cpu = torch.device("cpu")
        if fmt == "gptq":
            layer = pq.GPTQLinear(tensors, 4, 32, cpu)
            layer.qweight.random_(0, 2**31 - 1), layer.qzeros.random_(0, 2**31 - 1), layer.scales.uniform_(0, 1)
            layer.g_idx.copy_(torch.arange(FF, dtype=torch.int32) // 32)
        elif fmt == "awq":
            layer = pq.AWQLinear(tensors, 4, 32, cpu)
            layer.qweight.random_(0, 2**31 - 1), layer.qzeros.random_(0, 2**31 - 1), layer.scales.uniform_(0, 1)
        elif fmt == "fp8":  # transformers' FP8Linear, as from_pretrained makes it
            layer = pq.build_layer("fp8", qc, torch.nn.Linear(FF, H, bias=False, device="meta"), tensors, cpu)
            layer.weight.data.copy_(torch.randn(H, FF).to(layer.weight.dtype))
            layer.weight_scale_inv.data.uniform_(0, 1)
        else:
            layer = pq.CompressedLinear(tensors, None, True, cpu)
            layer.weight.data.copy_(torch.randn(H, FF).to(layer.weight.dtype)), layer.weight_scale.data.uniform_(0, 1)
        x = torch.randn(rows, FF, dtype=torch.float16 if fmt in ("gptq", "awq") else torch.bfloat16, requires_grad=True)
        y = layer(x)
        y.sum().backward()
    assert trace.error is None
    return trace


def _info(code: str, shape: tuple[int, ...]) -> Any:
    from fakeviz._engine.checkpoint import TensorInfo

    return TensorInfo(DTYPE[code], shape, "model.safetensors")


@pytest.mark.parametrize(
    ("fmt", "rows"), [("gptq", 60), ("gptq", 8), ("awq", 12), ("awq", 1100), ("fp8", 6), ("ct-fp8", 6)]
)
def test_fake_rules_equal_the_ops_run_for_real_on_cpu(fmt, rows):
    """Each op's real implementation (plain torch ops: unpack, dequantize, matmul) runs on the CPU: the fake record of a
    layer's forward and backward equals the real one op by op, output by output (shapes, dtypes, workspace bytes)."""
    real, fake = _layer_run(fmt, False, rows), _layer_run(fmt, True, rows)
    assert real.oplog_lines() == fake.oplog_lines()
    cols = ["nbytes", "alloc_seq", "free_seq", "op"]
    assert real.storages[cols].values.tolist() == fake.storages[cols].values.tolist()


def test_kernel_rules_are_named_in_fidelity():
    for op in quant_kernels.FAKE_RULE_OPS:
        from fakeviz._analysis.fidelity import op_rule

        assert op_rule(op) == "fakeviz rule"
        assert quant_kernels.op_assumption(op).startswith("recorded through a fake rule, not the library's kernel: ")
    assert quant_kernels.op_assumption("aten.mm.default") is None


# ------------------------------------------------------------------------ what is not read
@pytest.mark.parametrize(
    ("qc", "words"),
    [
        ({"quant_method": "hqq", "nbits": 4}, ["'hqq' is not supported", "bitsandbytes, gptq, awq, fp8"]),
        ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}, ["AWQ version 'gemv'", "GEMM"]),
        ({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "marlin"},
         ["GPTQ checkpoint_format 'marlin'", "'gptq' or 'gptq_v2'"]),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {}}},
         ["format 'pack-quantized' is not supported", "float-quantized"]),
    ],
)  # fmt: skip
def test_unsupported_quantization_is_a_short_error(tmp_path, qc, words):
    write_checkpoint(tmp_path, "gptq", qc=qc)
    with pytest.raises(CheckpointError) as e:
        models.from_pretrained(tmp_path)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    assert len(msg.splitlines()) <= 3 and "Traceback" not in msg


def test_quantization_config_without_quantized_tensors(tmp_path):
    write_checkpoint(tmp_path, "fp8", qc=FORMATS["gptq"][0])  # fp8 tensors, a GPTQ config
    with pytest.raises(CheckpointError, match=r"says gptq, but no tensor of the checkpoint is a quantized layer's "
                       r"\(\*\.qweight\)"):  # fmt: skip
        models.from_pretrained(tmp_path)


def test_quantized_tensors_of_no_linear_layer(tmp_path):
    header = write_checkpoint(tmp_path, "gptq")
    header["model.layers.0.mlp.experts.0.up_proj.qweight"] = ("I32", (8, 16))
    write_sparse_safetensors(tmp_path / "model.safetensors", {k: (c, s, SIZE[c]) for k, (c, s) in header.items()})
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.experts\.0\.up_proj\.\* \(gptq\) name no "
                       "linear layer of LlamaForCausalLM"):  # fmt: skip
        models.from_pretrained(tmp_path)


def _bnb_saved(folder: Path, fmt: str) -> torch.nn.Module:
    """A tiny Llama quantized by bitsandbytes itself on the CPU (real bytes) and saved with its quantization_config,
    as transformers' save_pretrained of a quantized model writes it; returns the real model."""
    bnb = pytest.importorskip("bitsandbytes")
    safetensors = pytest.importorskip("safetensors.torch")
    qc = dict(FORMATS[fmt][0], **({"llm_int8_threshold": 0.0} if fmt == "int8" else {}))
    dtype = DTYPE[FORMATS[fmt][2]]
    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    real = transformers.LlamaForCausalLM._from_config(config, dtype=dtype)  # as from_pretrained builds it
    for name, lin in [(n, m) for n, m in real.named_modules() if isinstance(m, torch.nn.Linear) and "layers" in n]:
        if fmt == "int8":
            q = bnb.nn.Linear8bitLt(
                lin.in_features, lin.out_features, bias=False, has_fp16_weights=False, threshold=0.0
            )
            q.weight = bnb.nn.Int8Params(lin.weight.data, requires_grad=False, has_fp16_weights=False)
        else:
            nested = qc["bnb_4bit_use_double_quant"]
            q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, compute_dtype=torch.bfloat16,
                                  compress_statistics=nested, quant_type=fmt)  # fmt: skip
            q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, compress_statistics=nested,
                                         quant_type=fmt, module=q)  # fmt: skip
        real.set_submodule(name, q.to("cpu"))  # quantized here, by bitsandbytes
    folder.mkdir(parents=True, exist_ok=True)
    safetensors.save_file({k: v.contiguous() for k, v in real.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**LLAMA, "torch_dtype": str(dtype).removeprefix("torch."),
                                                    "quantization_config": qc}))  # fmt: skip
    return real


@pytest.mark.parametrize("fmt", ["nf4", "fp4", "int8"])
def test_real_bitsandbytes_checkpoint_fake_equals_real(tmp_path, fmt):
    """A checkpoint bitsandbytes quantized and saved: the fake model read from its headers has exactly its state
    dict's names, dtypes and shapes (the packed quant-state JSON included) and quant states, and a training step of
    it records what the real model's step records on the CPU, op by op and byte by byte."""
    real = _bnb_saved(tmp_path, fmt)
    fake = models.from_pretrained(tmp_path, device="cpu", strict=True)
    sd = real.state_dict()
    assert {k: (v.dtype, tuple(v.shape)) for k, v in fake.state_dict().items()} == {
        k: (v.dtype, tuple(v.shape)) for k, v in sd.items()
    }
    w, rw = fake.model.layers[0].mlp.down_proj.weight, real.model.layers[0].mlp.down_proj.weight
    if fmt != "int8":
        for attr in ("blocksize", "quant_type", "dtype", "shape", "nested"):
            assert getattr(w.quant_state, attr) == getattr(rw.quant_state, attr), attr
    ids = torch.randint(0, V, (2, 8))
    traces = []
    for model, is_fake in ((real, False), (fake, True)):
        with fv.record(fake=is_fake, device="cpu") as trace:
            model(input_ids=ids.clone(), labels=ids.clone()).loss.backward()
        assert trace.error is None
        traces.append(trace)
    assert traces[0].oplog_lines() == traces[1].oplog_lines()
    cols = ["nbytes", "alloc_seq", "free_seq", "op", "category"]
    assert traces[0].storages[cols].values.tolist() == traces[1].storages[cols].values.tolist()
    assert traces[0].peak()["cpu"].bytes == traces[1].peak()["cpu"].bytes


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_lora_on_a_pre_quantized_model(tmp_path, fmt):
    """peft wraps the quantized layers with LoRA as it wraps gptqmodel's (their output plus the adapter's); after
    prepare_model_for_kbit_training (which leaves a GPTQ model's tensors alone) only the adapters train."""
    peft = pytest.importorskip("peft")
    model, _ = load(tmp_path, fmt)
    assert model.quantization_method == fmt
    with fv.record(device="cuda:0") as trace:
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"]))
        ids = torch.randint(0, V, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
    assert trace.error is None
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert type(layer.base_layer).__name__ == LAYER[fmt] and layer.base_layer.qweight.dtype == torch.int32
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all(".lora_" in n for n in trained)
    assert len(trained) == 2 * 3 * L  # lora_A and lora_B of three layers per decoder layer
    assert trace.fidelity()["ops"].set_index("op").loc[KERNEL[fmt], "count"] == 7 * L


@pytest.mark.parametrize("fmt", ["gptq", "nf4"])
def test_pre_quantized_hub_repo_reads_headers_only(tmp_path, monkeypatch, fmt):
    """A pre-quantized repo on the hub (a stand-in of its HTTP API, tests/hub_stub.py, with the real client): the
    same model as from the local folder, and every byte of the weight file sent is its header's."""
    pytest.importorskip("huggingface_hub")
    from hub_stub import HubStub
    from huggingface_hub import constants

    header = write_checkpoint(tmp_path / "repo", fmt)
    with HubStub() as stub:
        stub.add("stub-org/tiny-quantized", tmp_path / "repo")
        monkeypatch.setattr(constants, "ENDPOINT", stub.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            stub.url + "/{repo_id}/resolve/{revision}/{filename}")  # fmt: skip
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            monkeypatch.delenv(var, raising=False)
        fetched = models.from_pretrained("stub-org/tiny-quantized", strict=True)
        gets = stub.served(".safetensors")
    local = models.from_pretrained(tmp_path / "repo", strict=True)
    layout = {k: (v.dtype, tuple(v.shape)) for k, v in fetched.state_dict().items()}
    assert layout == {k: (v.dtype, tuple(v.shape)) for k, v in local.state_dict().items()}
    assert layout == {k: (DTYPE[c], s) for k, (c, s) in header.items()}
    assert type(fetched.model.layers[0].mlp.up_proj).__name__ == LAYER[fmt]
    with open(tmp_path / "repo" / "model.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    assert sum(r.sent for r in gets) == 8 + n  # the header, no weight byte


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_build_from_the_config_alone_gives_the_checkpoints_layers(tmp_path, fmt):
    """models.build reads config.json only (a hub id's too): the quantized layers its quantization_config describes
    are the ones a checkpoint of that config stores, tensor for tensor (Note: [pre-quantized layers from a config])."""
    if fmt in ("nf4", "fp4", "int8") and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed")
    header = write_checkpoint(tmp_path, fmt)
    model = models.build(tmp_path, device="cuda:0")
    assert type(model.model.layers[1].self_attn.k_proj).__name__ == LAYER[fmt]
    assert type(model.lm_head) is torch.nn.Linear  # the output head stays unquantized, as the quantizers leave it
    assert {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()} == {
        k: (DTYPE[c], s) for k, (c, s) in header.items()
    }
    if fmt != "int8":  # LLM.int8's outlier columns at threshold 6.0: see test_forward_records_with_the_right_shapes
        with fv.record(device="cuda:0") as trace:
            model(input_ids=torch.randint(0, V, (1, 8)))
        assert trace.error is None
    with pytest.raises(ArgumentError, match="already quantized"):
        models.build(tmp_path, quantization="nf4")


def test_build_follows_the_configs_skip_list(tmp_path):
    qc = {**FORMATS["fp8"][0], "modules_to_not_convert": ["mlp.down_proj"]}
    write_checkpoint(tmp_path, "fp8", qc=qc)
    model = models.build(tmp_path)
    layer = model.model.layers[0]
    assert type(layer.mlp.down_proj) is torch.nn.Linear and type(layer.mlp.up_proj).__name__ == "FineGrainedFP8Linear"


def test_build_warns_that_fused_experts_stay_unquantized(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    mixtral = dict(LLAMA, architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4,
                   num_experts_per_tok=2, torch_dtype="bfloat16", quantization_config=FORMATS["fp8"][0])  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(mixtral))
    with pytest.warns(FakeVizWarning, match=r"the 2 mixture-of-experts blocks \(model\.layers\.0\.mlp\.experts, "
                      r"\.\.\.\) stay unquantized at torch\.bfloat16"):  # fmt: skip
        model = models.build(tmp_path)
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "FineGrainedFP8Linear"
