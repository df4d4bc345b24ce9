"""Checkpoints without their data: safetensors headers, torch files as meta tensors, from_pretrained."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import warnings
from pathlib import Path

import pytest
import torch
from sparse_safetensors import counting_open, write_sparse_safetensors

import fakeviz as fv
from fakeviz import models
from fakeviz._core.errors import CheckpointError, CheckpointMismatchError, FakeVizWarning
from fakeviz._engine import checkpoint as ck

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TINY_LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="bfloat16", vocab_size=64, hidden_size=32,
    intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=32, tie_word_embeddings=False,
)  # fmt: skip
TINY_GPT2 = dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", torch_dtype="float32", vocab_size=64,
                 n_positions=16, n_embd=32, n_layer=2, n_head=2)  # fmt: skip
TINY_MIXTRAL = dict(
    architectures=["MixtralForCausalLM"], model_type="mixtral", torch_dtype="bfloat16", vocab_size=64,
    hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32, tie_word_embeddings=False,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _quiet():
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)


def real_model(cfg: dict, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    c = dict(cfg)
    arch = c.pop("architectures")[0]
    c.pop("torch_dtype")
    config = transformers.AutoConfig.for_model(c.pop("model_type"), **c)
    torch.manual_seed(0)
    return getattr(transformers, arch)(config).to(dtype)


def write_config(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def layout(model: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    return {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}


@contextlib.contextmanager
def strict_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)
        yield


# -------------------------------------------------------------------------------- header reader
def test_header_reader_agrees_with_safetensors(tmp_path):
    tensors = {
        "a": torch.randn(3, 4, dtype=torch.bfloat16), "b": torch.zeros(5, dtype=torch.float32),
        "c": torch.arange(6, dtype=torch.int64).view(2, 3), "d": torch.ones(2, 2, dtype=torch.bool),
        "e": torch.zeros(4, 8).to(torch.float8_e4m3fn), "f": torch.zeros(0, 3, dtype=torch.float16),
        "g": torch.tensor(1.5, dtype=torch.float64),
    }  # fmt: skip
    path = tmp_path / "x.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    found, meta, nbytes = ck.read_safetensors_header(path)
    assert {k: (v.dtype, v.shape) for k, v in found.items()} == {
        k: (t.dtype, tuple(t.shape)) for k, t in tensors.items()
    }
    assert meta == {"format": "pt"}
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert nbytes == 8 + n
    assert all(v.file == "x.safetensors" for v in found.values())


def test_from_pretrained_safetensors_equals_the_real_model(tmp_path):
    real = real_model(TINY_LLAMA)
    real.save_pretrained(tmp_path)  # transformers' own writer: config.json + model.safetensors
    assert (tmp_path / "model.safetensors").is_file()
    with strict_warnings():
        fake = models.from_pretrained(tmp_path)
    assert layout(fake) == layout(real)
    assert all(fv.is_fake(p) for p in fake.parameters())


def test_sharded_index_and_device(tmp_path):
    real = real_model(TINY_LLAMA)
    sd = {k: v.contiguous() for k, v in real.state_dict().items()}
    names = list(sd)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}  # fmt: skip
    for file, keys in shards.items():
        safetensors_torch.save_file({k: sd[k] for k in keys}, str(tmp_path / file))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    write_config(tmp_path, TINY_LLAMA)
    ckpt = ck.read_checkpoint(tmp_path)
    assert [f.name for f in ckpt.files] == list(shards) and ckpt.format == "safetensors"
    assert ckpt.nbytes() == sum(v.numel() * v.element_size() for v in sd.values())
    with strict_warnings():
        fake = models.from_pretrained(tmp_path, device="cuda:0")
    assert layout(fake) == layout(real)
    assert next(fake.parameters()).device == torch.device("cuda:0")


@pytest.mark.parametrize("file", ["pytorch_model.bin", "model.pt"])
def test_torch_files_are_read_as_meta(tmp_path, file):
    real = real_model(TINY_LLAMA)
    torch.save(real.state_dict(), tmp_path / file)
    write_config(tmp_path, TINY_LLAMA)
    ckpt = ck.read_checkpoint(tmp_path)
    assert ckpt.format == "torch"
    with strict_warnings():
        fake = models.from_pretrained(tmp_path)
    assert layout(fake) == layout(real)


def test_sharded_torch_index(tmp_path):
    real = real_model(TINY_LLAMA)
    sd = real.state_dict()
    names = list(sd)
    torch.save({k: sd[k] for k in names[:5]}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({k: sd[k] for k in names[5:]}, tmp_path / "pytorch_model-00002-of-00002.bin")
    wm = {k: ("pytorch_model-00001-of-00002.bin" if i < 5 else "pytorch_model-00002-of-00002.bin")
          for i, k in enumerate(names)}  # fmt: skip
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": wm}))
    write_config(tmp_path, TINY_LLAMA)
    with strict_warnings():
        assert layout(models.from_pretrained(tmp_path)) == layout(real)


def test_dtypes_come_from_the_checkpoint(tmp_path):
    real = real_model(TINY_LLAMA)
    sd = {k: (v.float() if "norm" in k else v).contiguous() for k, v in real.state_dict().items()}
    safetensors_torch.save_file(sd, str(tmp_path / "model.safetensors"))
    write_config(tmp_path, {**TINY_LLAMA, "torch_dtype": "float32"})  # the config's dtype does not decide
    fake = models.from_pretrained(tmp_path)
    assert layout(fake) == {k: (v.dtype, tuple(v.shape)) for k, v in sd.items()}
    assert fake.model.norm.weight.dtype == torch.float32 and fake.lm_head.weight.dtype == torch.bfloat16
    assert fake.model.norm.weight.requires_grad
    fp16 = models.from_pretrained(tmp_path, dtype="fp16")  # an explicit dtype wins for every floating tensor
    assert {p.dtype for p in fp16.parameters()} == {torch.float16}


def test_tied_weights_are_not_missing(tmp_path):
    real = real_model(TINY_GPT2, torch.float32)
    real.save_pretrained(tmp_path)  # writes the tied lm_head once
    ckpt = ck.read_checkpoint(tmp_path)
    assert "lm_head.weight" not in ckpt.tensors
    with strict_warnings():
        fake = models.from_pretrained(tmp_path)
    assert fake.lm_head.weight is fake.transformer.wte.weight


def test_moe_checkpoint_with_per_expert_names(tmp_path):
    """Mixtral checkpoints name each expert (block_sparse_moe.experts.3.w1); transformers fuses them on load."""
    real = real_model(TINY_MIXTRAL)
    real.save_pretrained(tmp_path)  # transformers writes the published per-expert names back
    ckpt = ck.read_checkpoint(tmp_path)
    assert any(".experts.3.w1.weight" in k for k in ckpt.tensors)
    with strict_warnings():
        fake = models.from_pretrained(tmp_path)
    assert layout(fake) == layout(real)


def test_mismatches_are_named(tmp_path):
    real = real_model(TINY_LLAMA)
    sd = {k: v.contiguous() for k, v in real.state_dict().items()}
    del sd["model.layers.1.mlp.up_proj.weight"]
    sd["model.layers.0.extra.weight"] = torch.zeros(2)
    sd["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(7, 32, dtype=torch.bfloat16)
    safetensors_torch.save_file(sd, str(tmp_path / "model.safetensors"))
    write_config(tmp_path, TINY_LLAMA)
    with pytest.warns(FakeVizWarning) as rec:
        fake = models.from_pretrained(tmp_path)
    msg = str(rec[0].message)
    assert "model.layers.1.mlp.up_proj.weight" in msg and "model.layers.0.extra.weight" in msg
    assert "model.layers.0.self_attn.q_proj.weight (checkpoint [7, 32], model [32, 32])" in msg
    assert fake.model.layers[0].self_attn.q_proj.weight.shape == (32, 32)  # the config's shape is kept
    with pytest.raises(CheckpointMismatchError) as ei:
        models.from_pretrained(tmp_path, strict=True)
    err = ei.value
    assert isinstance(err, ValueError)
    assert err.missing == ("model.layers.1.mlp.up_proj.weight",)
    assert err.unexpected == ("model.layers.0.extra.weight",)
    assert err.shapes == {"model.layers.0.self_attn.q_proj.weight": ((7, 32), (32, 32))}
    assert len(str(err).splitlines()) <= 25
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    assert not _get_current_dispatch_mode_stack()  # no fake mode left active after the error


# ------------------------------------------------------------------------------------ bad files
def test_bad_files_get_clear_errors(tmp_path):
    write_config(tmp_path, TINY_LLAMA)
    with pytest.raises(CheckpointError, match="no weights found"):
        models.from_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="too short"):
        ck.read_checkpoint(tmp_path)
    f.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointError, match="header length 1,000,000,000,000 does not fit"):
        ck.read_checkpoint(tmp_path)
    f.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(CheckpointError, match="not JSON"):
        ck.read_checkpoint(tmp_path)
    safetensors_torch.save_file({"w": torch.zeros(64, 64)}, str(f))
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated") as ei:
        ck.read_checkpoint(tmp_path)
    assert str(f) in str(ei.value)
    header = json.dumps({"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}).encode()
    f.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(CheckpointError, match="dtype 'Q9'"):
        ck.read_checkpoint(tmp_path)
    f.unlink()
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    with pytest.raises(CheckpointError, match="missing: gone.safetensors"):
        ck.read_checkpoint(tmp_path)
    safetensors_torch.save_file({"w": torch.zeros(2)}, str(tmp_path / "gone.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "gone.safetensors", "v": "gone.safetensors"}}))  # fmt: skip
    with pytest.raises(CheckpointError, match="not in the shard the index names: v"):
        ck.read_checkpoint(tmp_path)
    (tmp_path / "pickle.bin").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="not a torch.save file"):
        ck.read_checkpoint(tmp_path / "pickle.bin")
    (tmp_path / "evil.bin").write_bytes(__import__("pickle").dumps({"w": print}, protocol=2))
    with pytest.warns(FakeVizWarning, match="legacy"), pytest.raises(CheckpointError, match="weights_only"):
        ck.read_checkpoint(tmp_path / "evil.bin")
    with pytest.raises(CheckpointError, match="no config.json"):
        models.from_pretrained(tmp_path / "nowhere")


# ------------------------------------------------------------------- no tensor data is ever read
def sparse_checkpoint(folder: Path, cfg: dict, shards: int) -> int:
    """A sharded checkpoint of ``cfg``'s model (bf16) with holes for data: returns the bytes of all shards."""
    write_config(folder, cfg)
    meta = models.build(folder, device="meta", dtype=torch.bfloat16)
    sd = meta.state_dict()
    names = list(sd)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * per : (i + 1) * per]
        total += write_sparse_safetensors(folder / file, {k: ("BF16", tuple(sd[k].shape), 2) for k in part})
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return total


# 1.7 G parameters, 3.4 GB in bf16
BIG = dict(TINY_LLAMA, vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=8,
           num_attention_heads=32, num_key_value_heads=8)  # fmt: skip


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_sparse_multi_gb_checkpoint_reads_headers_only(tmp_path, monkeypatch):
    size = sparse_checkpoint(tmp_path, BIG, shards=4)
    assert size > 3 * 2**30
    on_disk = sum(os.stat(f).st_blocks * 512 for f in tmp_path.glob("*.safetensors"))
    assert on_disk < 2**20  # the data regions were never written: reading them would only return zeros

    # every byte the reader reads goes through open(): count them
    reads: list[int] = []
    monkeypatch.setattr(ck, "open", counting_open(reads), raising=False)
    before = rchar()
    ckpt = ck.read_checkpoint(tmp_path)
    read_syscalls = rchar() - before
    monkeypatch.undo()
    index_bytes = (tmp_path / "model.safetensors.index.json").stat().st_size  # read once, bounded
    assert sum(reads) == index_bytes + ckpt.header_bytes  # + 8 bytes and the JSON header of each shard, nothing more
    assert ckpt.header_bytes < 64 * 1024
    assert read_syscalls < 1 * 2**20  # the index and the headers; the 3.4 GB of data never
    assert ckpt.nbytes() > 3 * 2**30 and len(ckpt.files) == 4

    rss0 = rss()
    fake = models.from_pretrained(tmp_path, device="cuda:0")
    assert rss() - rss0 < 200 * 2**20  # far below the 3.4 GB of weights
    assert sum(p.numel() for p in fake.parameters()) * 2 == ckpt.nbytes()
    with fv.record(device="cuda:0") as trace:
        x = torch.randint(0, 32000, (1, 8))
        fake(input_ids=x)
    assert trace.peak()["cuda:0"].by_category["Parameter"] == ckpt.nbytes()


def test_torch_file_is_mapped_not_read(tmp_path):
    sd = {f"w{i}": torch.ones(1024, 1024, dtype=torch.float32) for i in range(16)}  # 64 MiB of data
    path = tmp_path / "pytorch_model.bin"
    torch.save(sd, path)
    del sd
    rss0 = rss()
    found = ck.read_torch_meta(path)
    assert rss() - rss0 < 16 * 2**20  # the 64 MiB of storages are neither read nor paged in
    assert found["w3"] == ck.TensorInfo(torch.float32, (1024, 1024), "pytorch_model.bin")
