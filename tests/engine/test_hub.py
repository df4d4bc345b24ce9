"""Hub ids (``owner/name``) through the real ``huggingface_hub`` client, against a stand-in of the hub's HTTP API
(``tests/hub_stub.py``) on 127.0.0.1 serving the catalog's published configs and sparse safetensors files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hub_stub import GOOD_TOKEN, NO_ACCESS_TOKEN, HubStub, point_at
from sparse_safetensors import write_raw_safetensors, write_sparse_safetensors

import fakeviz as fv
from fakeviz import models
from fakeviz._core.errors import ArgumentError, CheckpointError, FakeVizWarning, HubError, UnknownModelError
from fakeviz._engine import checkpoint as ck

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")
ROOT = Path(__file__).resolve().parents[2]
_CODES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}

QWEN, LLAMA = "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B"  # catalog entries whose published configs are served
REMOTE_CONFIG = """
from transformers import PretrainedConfig


class StubNetConfig(PretrainedConfig):
    model_type = "stubnet"

    def __init__(self, width=64, depth=2, vocab=128, **kw):
        self.width, self.depth, self.vocab = width, depth, vocab
        super().__init__(**kw)
"""
REMOTE_MODEL = """
import torch
from transformers import PreTrainedModel

from .configuration_stubnet import StubNetConfig


class StubNetModel(PreTrainedModel):
    config_class = StubNetConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab, config.width)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(config.width, config.width) for _ in range(config.depth))
        self.post_init()

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for b in self.blocks:
            x = torch.relu(b(x))
        return x
"""


HOSTILE = {  # safetensors headers the local reader refuses (tests/engine/test_checkpoint_hostile.py has more)
    "overlap": {"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
                "b": {"dtype": "F32", "shape": [8], "data_offsets": [16, 48]}},
    "gap": {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [32, 48]}},
    "not-json": b"{'a': 1}",
    "shape": {"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 64]}},
    "too-long": {"a": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}},
}  # fmt: skip


def _catalog_config(name: str) -> dict:
    """The published config.json values of a catalog entry, as its JSON file holds them."""
    return dict(models.resolve(name).config)


def _write_repo(folder: Path, config: dict, shards: list[dict[str, torch.Tensor]]) -> Path:
    """config.json + sparse safetensors files of ``shards`` (one: model.safetensors; more: an index)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    layout = [{k: (_CODES[t.dtype], tuple(t.shape), t.dtype.itemsize) for k, t in s.items()} for s in shards]
    if len(shards) == 1:
        write_sparse_safetensors(folder / "model.safetensors", layout[0])
        return folder
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, tensors in zip(names, layout):
        write_sparse_safetensors(folder / name, tensors)
    wm = {k: name for name, tensors in zip(names, layout) for k in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return folder


def _state(name: str | dict) -> dict[str, torch.Tensor]:
    """The model's state dict (fake tensors), tied copies once, as save_pretrained writes it."""
    model = models.build(name)
    seen, out = set(), {}
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) not in seen:
            seen.add(id(v))
            out[k] = v
    return out


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    hub = HubStub()
    qwen = _state(QWEN)
    assert "lm_head.weight" not in qwen  # tied to the embedding: the published checkpoint holds it once
    hub.add("stub-org/qwen-copy", _write_repo(root / "qwen", _catalog_config(QWEN), [qwen]))
    hub.add(QWEN, root / "qwen")  # the catalog entry's own id: from_pretrained reads its checkpoint from the hub
    hub.add("stub-org/no-ranges", root / "qwen", ignore_range=True)
    for case, header in HOSTILE.items():
        folder = root / "hostile" / case
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(_catalog_config(QWEN)))
        write_raw_safetensors(folder / "model.safetensors", header, 64)
        hub.add(f"stub-org/hostile-{case}", folder)
    llama = {k: (v.float() if k.endswith("norm.weight") else v) for k, v in _state(LLAMA).items()}  # mixed dtypes
    del llama["model.layers.3.mlp.up_proj.weight"]  # a tensor the checkpoint lacks
    keys = list(llama)
    half = len(keys) // 2
    shards = [{k: llama[k] for k in keys[:half]}, {k: llama[k] for k in keys[half:]}]
    hub.add("stub-org/llama-sharded", _write_repo(root / "llama", _catalog_config(LLAMA), shards))
    hub.add("stub-org/gated-qwen", _write_repo(root / "gated", _catalog_config(QWEN), [qwen]), gated=True)
    remote = root / "remote"
    remote_cfg = {"architectures": ["StubNetModel"], "model_type": "stubnet", "width": 64, "depth": 3, "vocab": 128,
                  "torch_dtype": "bfloat16", "auto_map": {"AutoConfig": "configuration_stubnet.StubNetConfig",
                                                          "AutoModel": "modeling_stubnet.StubNetModel"}}  # fmt: skip
    w = {"embed.weight": torch.empty(128, 64, dtype=torch.bfloat16, device="meta")}
    for i in range(3):
        w[f"blocks.{i}.weight"] = torch.empty(64, 64, dtype=torch.bfloat16, device="meta")
        w[f"blocks.{i}.bias"] = torch.empty(64, dtype=torch.bfloat16, device="meta")
    _write_repo(remote, remote_cfg, [w])
    (remote / "configuration_stubnet.py").write_text(REMOTE_CONFIG)
    (remote / "modeling_stubnet.py").write_text(REMOTE_MODEL)
    hub.add("stub-org/remote-net", remote)
    big = root / "big-config"
    big.mkdir()
    with open(big / "config.json", "wb") as f:
        f.truncate(ck.MAX_INDEX_BYTES + 1)  # a hole: no disk, and never downloaded
    hub.add("stub-org/big-config", big)
    huge = root / "huge-header"
    huge.mkdir()
    (huge / "config.json").write_text(json.dumps(_catalog_config(QWEN)))
    write_raw_safetensors(huge / "model.safetensors", b"{}", 2**30, length=ck.MAX_HEADER_BYTES + 1)
    hub.add("stub-org/huge-header", huge)
    tiny = {**_catalog_config(LLAMA), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}  # fmt: skip
    hub.add("stub-org/tiny-llama", _write_repo(root / "tiny", tiny, [_state(tiny)]))
    noconfig = root / "no-config"
    noconfig.mkdir()
    (noconfig / "README.md").write_text("weights elsewhere")
    hub.add("stub-org/no-config", noconfig)
    binonly = root / "bin-only"
    binonly.mkdir()
    (binonly / "config.json").write_text(json.dumps(_catalog_config(QWEN)))
    (binonly / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not read")
    hub.add("stub-org/bin-only", binonly)
    with hub:
        yield hub


@pytest.fixture
def hub(stub, monkeypatch, tmp_path):
    """``huggingface_hub`` pointed at the stand-in, with a cache and token store of this test's own (``point_at``;
    ``test_cli_report_of_a_hub_id`` sets the environment of a fresh process instead)."""
    point_at(stub, monkeypatch, tmp_path / "hf")
    return stub


def _layout(model: torch.nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    return {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}


def _header_length(file: Path) -> int:
    with open(file, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _short(err: BaseException) -> str:
    text = str(err)
    assert len(text.splitlines()) <= 4 and len(text) < 700, text
    assert "Traceback" not in text and "huggingface_hub" not in type(err).__module__
    return text


# ---------------------------------------------------------------------------------------------- build / config
def test_build_of_a_hub_id_equals_the_catalogs(hub):
    fetched = models.build("stub-org/qwen-copy")
    assert [r.file for r in hub.log if r.file] == ["config.json"] * len([r for r in hub.log if r.file])
    assert not hub.requests(".safetensors")  # build reads config.json only
    catalog = models.build(QWEN)
    assert _layout(fetched) == _layout(catalog)
    assert [n for n, _ in fetched.named_parameters()] == [n for n, _ in catalog.named_parameters()]
    assert _count(fetched) == _count(catalog) == models.resolve(QWEN).parameters
    assert type(fetched) is type(catalog) and fetched.config.name_or_path == "stub-org/qwen-copy"
    a, b = models.config("stub-org/qwen-copy").to_dict(), models.config(QWEN).to_dict()
    assert {k: v for k, v in a.items() if k != "_name_or_path"} == {k: v for k, v in b.items() if k != "_name_or_path"}
    small = models.build("stub-org/qwen-copy", num_hidden_layers=2)  # overrides work as for catalog names
    assert small.config.num_hidden_layers == 2


def test_catalog_names_win_and_stay_offline(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    models.build(QWEN, num_hidden_layers=1)
    models.build("qwen2.5-0.5b", num_hidden_layers=1)
    assert hub.log == []  # not one request


def test_config_is_cached_and_used_offline(hub, monkeypatch):
    from huggingface_hub import constants

    models.config("stub-org/qwen-copy")
    assert len(hub.log) > 0
    hub.log.clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert models.config("stub-org/qwen-copy").num_hidden_layers == 24  # from the hub cache
    assert hub.log == []


def test_revision(hub):
    sha = hub.repos["stub-org/qwen-copy"].sha
    assert models.config("stub-org/qwen-copy", revision=sha).hidden_size == 896
    assert all(sha in r.path for r in hub.log if r.file)
    with pytest.raises(ArgumentError, match="revision='main': a revision names a hub repo's files"):
        models.build(models.config(QWEN), revision="main")  # refused, never ignored
    with pytest.raises(ArgumentError, match="revision='main'"):
        models.from_pretrained(hub.repos["stub-org/qwen-copy"].folder, revision="main")
    with pytest.raises(HubError) as ei:
        models.config("stub-org/qwen-copy", revision="no-such-branch")
    text = _short(ei.value)
    assert "no revision 'no-such-branch'" in text and "revision=" in text


# ---------------------------------------------------------------------------------------------- from_pretrained
def test_from_pretrained_reads_headers_only_and_equals_the_local_folder(hub):
    repo = hub.repos["stub-org/qwen-copy"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)  # nothing missing: the tied lm_head is not reported
        fetched = models.from_pretrained("stub-org/qwen-copy")
        local = models.from_pretrained(repo.folder)
    assert _layout(fetched) == _layout(local) == _layout(models.build(QWEN))
    assert fetched.lm_head.weight is fetched.model.embed_tokens.weight  # tied, as the local folder's
    gets = hub.served(".safetensors")
    n = _header_length(repo.folder / "model.safetensors")
    assert [r.range for r in gets] == ["bytes=0-7", f"bytes=8-{7 + n}"]  # the header's length, then the header
    assert all(r.path.startswith("/cdn/") for r in gets)  # an LFS file: the hub's redirect followed, Range kept
    assert sum(r.sent for r in gets) == 8 + n  # every byte sent is the header's
    size = (repo.folder / "model.safetensors").stat().st_size
    assert 8 + n < 40_000 and size > 900_000_000  # 0.5B bf16 parameters: nearly a GB of weights, none sent


def test_sharded_from_pretrained_matches_the_local_folder(hub):
    repo = hub.repos["stub-org/llama-sharded"]
    with pytest.warns(FakeVizWarning) as remote_w:
        fetched = models.from_pretrained("stub-org/llama-sharded")
    with pytest.warns(FakeVizWarning) as local_w:
        local = models.from_pretrained(repo.folder)
    assert _layout(fetched) == _layout(local)
    assert fetched.model.norm.weight.dtype == torch.float32 and fetched.lm_head.weight.dtype == torch.bfloat16
    r_msg, l_msg = str(remote_w[0].message), str(local_w[0].message)
    assert "1 tensor(s) missing from the checkpoint: model.layers.3.mlp.up_proj.weight" in r_msg
    assert r_msg.split("\n", 1)[1] == l_msg.split("\n", 1)[1]  # the same report, named by hub id / folder
    assert r_msg.startswith("stub-org/llama-sharded:")
    shards = sorted(repo.folder.glob("*.safetensors"))
    headers = sum(8 + _header_length(s) for s in shards)
    gets = hub.served(".safetensors")
    assert len(gets) == 2 * len(shards) and all(r.range for r in gets)
    assert sum(r.sent for r in gets) == headers < 100_000
    assert sum(s.stat().st_size for s in shards) > 2_000_000_000


def test_catalog_name_with_revision_or_from_pretrained_reads_the_hub(hub):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)
        model = models.from_pretrained("qwen2.5-0.5b")  # a catalog alias: its hub id's checkpoint
    assert all(f"/{QWEN}/" in r.path for r in hub.log if r.file)
    assert _layout(model) == _layout(models.build(QWEN))
    hub.log.clear()
    models.build(QWEN, num_hidden_layers=1)
    assert hub.log == []  # the catalog's copy of the config
    models.build(QWEN, revision="main", num_hidden_layers=1)
    assert hub.log and {r.file for r in hub.log} == {"config.json"}  # a revision asks the hub (cached: HEADs)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_refused_as_in_a_local_folder(hub, case):
    """A header read over HTTP goes through the local reader's checks: the same error, named by the hub file."""
    folder = hub.repos[f"stub-org/hostile-{case}"].folder
    with pytest.raises(CheckpointError) as local:
        ck.read_checkpoint(folder)
    with pytest.raises(CheckpointError) as remote:
        models.from_pretrained(f"stub-org/hostile-{case}")
    mine = str(local.value).split(": ", 1)[1]
    assert str(remote.value) == f"stub-org/hostile-{case}:model.safetensors: {mine}"


def test_a_server_that_ignores_ranges_sends_little(hub):
    """A server answering a range request with the whole file (HTTP 200): the response is read as a stream and
    cut at the bytes asked for, so the read stays bounded (the server's writes stop when the client hangs up)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)
        model = models.from_pretrained("stub-org/no-ranges")
    assert _layout(model) == _layout(models.build(QWEN))
    gets = hub.served(".safetensors")
    assert [r.status for r in gets] == [200, 200]
    size = (hub.repos["stub-org/no-ranges"].folder / "model.safetensors").stat().st_size
    assert sum(r.sent for r in gets) < size / 20


def test_offline_from_pretrained_without_cached_weights(hub, monkeypatch):
    from huggingface_hub import constants

    models.config("stub-org/llama-sharded")  # config.json is cached, the weights are not
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError) as ei:
        models.from_pretrained("stub-org/llama-sharded")
    text = _short(ei.value)
    assert "HF_HUB_OFFLINE" in text and "not in the hub cache" in text and "from_pretrained('/path/to/folder')" in text
    assert ei.value.offline


def test_offline_from_pretrained_reads_cached_weights(hub, monkeypatch):
    """Weights downloaded before (``hf download``) are read offline from the hub cache, headers only."""
    from huggingface_hub import constants, hf_hub_download

    online = models.from_pretrained("stub-org/tiny-llama")
    for file in ("config.json", "model.safetensors"):
        hf_hub_download("stub-org/tiny-llama", file)
    hub.log.clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)
        offline = models.from_pretrained("stub-org/tiny-llama")
    assert hub.log == [] and _layout(offline) == _layout(online)


# ---------------------------------------------------------------------------------------------- errors
def test_offline_and_not_cached(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(fv.HubError) as ei:  # public, and a CheckpointError
        models.build("stub-org/qwen-copy")
    assert isinstance(ei.value, fv.CheckpointError) and ei.value.repo == "stub-org/qwen-copy"
    text = _short(ei.value)
    assert "stub-org/qwen-copy" in text and "HF_HUB_OFFLINE is set" in text and "config.json" in text
    assert "build('/path/to/folder')" in text and "hf download stub-org/qwen-copy config.json" in text
    assert ei.value.__cause__ is not None and hub.log == []


def test_unreachable_endpoint(hub, monkeypatch):
    import socket

    from huggingface_hub import constants

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", dead + "/{repo_id}/resolve/{revision}/{filename}")
    with pytest.raises(HubError) as ei:
        models.build("stub-org/qwen-copy")
    text = _short(ei.value)
    assert f"{dead} could not be reached for config.json of stub-org/qwen-copy (ConnectError:" in text
    assert "HF_ENDPOINT" in text and "build('/path/to/folder')" in text and not ei.value.offline


def test_unreachable_endpoint_with_a_cached_config(hub, monkeypatch):
    """As hf_hub_download: when the hub cannot be reached, the cached config.json is used."""
    from huggingface_hub import constants

    expected = _layout(models.build("stub-org/qwen-copy", num_hidden_layers=1))
    dead = "http://127.0.0.1:9"  # the discard port: nothing answers
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", dead + "/{repo_id}/resolve/{revision}/{filename}")
    assert _layout(models.build("stub-org/qwen-copy", num_hidden_layers=1)) == expected


def test_unknown_repo_suggests_catalog_names(hub):
    with pytest.raises(UnknownModelError) as ei:
        models.build("Qwen/Qwen2.5-0.5B-Instructt")
    text = _short(ei.value)
    assert "unknown on the hub at " + hub.url in text and "'Qwen/Qwen2.5-0.5B'" in text
    assert QWEN in ei.value.suggestions
    with pytest.raises(UnknownModelError):
        models.from_pretrained("nobody/nothing")


def test_gated_repo_needs_hf_token(hub, monkeypatch):
    with pytest.raises(HubError) as ei:
        models.build("stub-org/gated-qwen")
    text = _short(ei.value)
    assert "gated" in text and "Accept the license" in text and "HF_TOKEN" in text and "401" in text
    monkeypatch.setenv("HF_TOKEN", NO_ACCESS_TOKEN)
    with pytest.raises(HubError) as ei:
        models.build("stub-org/gated-qwen")
    assert "403" in str(ei.value) and "your token has no access" in str(ei.value)
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)  # huggingface_hub sends it: the config and the headers are served
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)
        model = models.from_pretrained("stub-org/gated-qwen")
    assert _count(model) == models.resolve(QWEN).parameters


def test_oversized_config_and_header_are_refused_before_reading(hub):
    with pytest.raises(CheckpointError, match="over the 16 MiB fakeviz reads"):
        models.build("stub-org/big-config")
    assert all(r.method == "HEAD" for r in hub.requests("config.json"))  # sized, never downloaded
    hub.log.clear()
    with pytest.raises(CheckpointError, match="larger than fakeviz reads"):
        models.from_pretrained("stub-org/huge-header")
    gets = hub.served(".safetensors")
    assert [r.range for r in gets] == ["bytes=0-7"] and sum(r.sent for r in gets) == 8


def test_no_safetensors_in_the_repo(hub):
    with pytest.raises(CheckpointError) as ei:
        models.from_pretrained("stub-org/bin-only")
    text = _short(ei.value)
    assert "no model.safetensors or model.safetensors.index.json" in text and "build('stub-org/bin-only')" in text
    assert not hub.requests(".bin")
    assert _count(models.build("stub-org/bin-only")) == models.resolve(QWEN).parameters


def test_no_config_json_in_the_repo(hub):
    with pytest.raises(CheckpointError) as ei:
        models.build("stub-org/no-config")
    text = _short(ei.value)
    assert text.startswith("stub-org/no-config: the repo has no config.json") and "/path/to/folder" in text


def test_remote_code_is_refused_unless_trusted(hub):
    with pytest.raises(HubError) as ei:
        models.build("stub-org/remote-net")
    text = _short(ei.value)
    assert "needs the repo's own Python code" in text and "trust_remote_code=True" in text
    assert not hub.requests(".py")  # nothing of its code fetched
    model = models.build("stub-org/remote-net", trust_remote_code=True)
    assert type(model).__name__ == "StubNetModel" and type(model).__module__.startswith("transformers_modules")
    assert len(model.blocks) == 3 and model.embed.weight.dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error", FakeVizWarning)
        loaded = models.from_pretrained("stub-org/remote-net", trust_remote_code=True)
    assert _layout(loaded) == _layout(model)


# ---------------------------------------------------------------------------------------------- command line
def test_cli_report_of_a_hub_id(stub, tmp_path):
    """``fakeviz report owner/name`` in a fresh process that reads HF_ENDPOINT and HF_HOME from its environment,
    as a user's shell sets them: the same figures as the catalog entry whose config the stand-in serves."""
    from fakeviz._frontends.cli import main

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": stub.url, "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
    for var in ("HF_TOKEN", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(var, None)
    args = ["--set", "num_hidden_layers=1", "--seq", "16"]
    out = tmp_path / "hub.json"
    r = subprocess.run([sys.executable, "-m", "fakeviz", "report", "stub-org/qwen-copy", *args, "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hf" / "hub" / "models--stub-org--qwen-copy").is_dir()  # its cache, under HF_HOME
    named = tmp_path / "named.json"
    assert main(["report", QWEN, *args, "--json", str(named)]) == 0
    a, b = json.loads(out.read_text()), json.loads(named.read_text())
    assert a["parameters"] == b["parameters"] and a["devices"] == b["devices"]
    r = subprocess.run([sys.executable, "-m", "fakeviz", "report", "stub-org/nothing-here"], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=600)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unknown on the hub at " + stub.url in r.stderr
