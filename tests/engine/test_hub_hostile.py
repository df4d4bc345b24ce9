"""A hostile mirror behind ``HF_ENDPOINT`` (``tests/hub_stub.py``'s :class:`Hostile` modes): every name it sends is
checked before it touches the file system, every request ends within its deadline (``FAKEVIZ_HUB_DEADLINE``),
every body is bounded, nothing is written outside the hub cache and no partial file stays in it
(Note: [a hub is a stranger] in ``fakeviz/models/_hub.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hub_stub import Hostile, HubStub, point_at
from sparse_safetensors import write_sparse_safetensors

from fakeviz import models
from fakeviz._core.errors import CheckpointError, HubError
from fakeviz.models import _hub

huggingface_hub = pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")

EVIL = "stub-org/evil"
CLIMB = "../../../../evil.pth"  # from <home>/hub/models--stub-org--evil/blobs: <home>'s parent, the test's tmp_path
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "vocab_size": 256, "max_position_embeddings": 128, "torch_dtype": "bfloat16"}  # fmt: skip
DEADLINE = 1.5  # seconds, through FAKEVIZ_HUB_DEADLINE
BOUND = 15.0  # what a case may take at most: the deadline, one read's timeout and the test's own work


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-hub")
    evil = root / "evil"
    evil.mkdir()
    (evil / "config.json").write_text(json.dumps(CONFIG))
    write_sparse_safetensors(evil / "model.safetensors", {"model.embed_tokens.weight": ("BF16", (256, 64), 2)})
    many = root / "many"
    many.mkdir()
    (many / "config.json").write_text(json.dumps(CONFIG))
    n = _hub.MAX_SHARDS + 1
    (many / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {f"t{i}": f"s{i}.safetensors" for i in range(n)}}))
    hub = HubStub()
    hub.add(EVIL, evil)
    hub.add("stub-org/many-shards", many)
    with hub:
        yield hub


@pytest.fixture
def hub(stub, monkeypatch, tmp_path):
    """The stand-in, its hub cache in ``tmp_path / "home"``, a short deadline; after the test, nothing was written
    in ``tmp_path`` outside that cache, and no temporary file stays in it."""
    home = tmp_path / "home"
    point_at(stub, monkeypatch, home)
    monkeypatch.setenv("FAKEVIZ_HUB_DEADLINE", str(DEADLINE))
    repo = stub.repos[EVIL]
    before = _files(tmp_path)
    yield stub
    repo.hostile.clear()
    assert _files(tmp_path) - before <= {p for p in _files(tmp_path) if home in p.parents}
    assert not [p for p in _files(home) if p.name.endswith((".incomplete", ".tmp"))]


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_symlink() or not p.is_dir()}


def _cache(stub_home: Path) -> set[Path]:
    return _files(stub_home / "hub") if (stub_home / "hub").exists() else set()


def _short(err: BaseException) -> str:
    text = str(err)
    assert len(text.splitlines()) <= 4 and len(text) < 700 and "Traceback" not in text, text
    return text


@pytest.mark.parametrize("etag", [CLIMB, "/{tmp}/evil-absolute.pth", "..", "W/x"])
def test_an_etag_that_is_a_path_is_refused(hub, tmp_path, etag):
    etag = etag.format(tmp=str(tmp_path).strip("/"))
    hub.repos[EVIL].hostile["config.json"] = Hostile(etag=etag)
    with pytest.raises(HubError) as ei:
        models.config(EVIL)
    text = _short(ei.value)
    assert "answered with an ETag" in text and "not a file hash" in text and "HF_ENDPOINT" in text
    assert not (tmp_path / "evil.pth").exists() and not (tmp_path / "evil-absolute.pth").exists()
    assert _cache(tmp_path / "home") == set()  # nothing written, not even refs
    assert [r.method for r in hub.requests("config.json")] == ["HEAD"]  # refused before any GET


def test_the_stand_in_etag_does_escape_through_hf_hub_download(hub, tmp_path):
    """Why fakeviz does not call ``hf_hub_download`` for a file: the same answer writes outside its cache."""
    from huggingface_hub import hf_hub_download

    hub.repos[EVIL].hostile["config.json"] = Hostile(etag=CLIMB)
    hf_hub_download(EVIL, "config.json")
    escaped = tmp_path / "evil.pth"
    assert json.loads(escaped.read_text()) == CONFIG
    escaped.unlink()  # and its lock file: the fixture checks nothing else was written outside the cache
    (tmp_path / "evil.pth.lock").unlink()


@pytest.mark.parametrize("commit", ["../../../../evil", "0" * 39 + "/", "A" * 40])
def test_a_commit_that_is_not_a_sha_is_refused(hub, tmp_path, commit):
    hub.repos[EVIL].hostile["config.json"] = Hostile(commit=commit)
    with pytest.raises(HubError, match=r"a commit .* \(X-Repo-Commit\), not 40 hex digits") as ei:
        models.build(EVIL)
    _short(ei.value)
    assert _cache(tmp_path / "home") == set()


@pytest.mark.parametrize("to", ["file:///etc/passwd", "ftp://127.0.0.1/x", "/../../../../tmp/evil.pth"])
def test_a_redirect_elsewhere_than_http_writes_nothing(hub, tmp_path, to):
    hub.repos[EVIL].hostile["config.json"] = Hostile(location=to)
    with pytest.raises((HubError, CheckpointError)) as ei:
        models.config(EVIL)
    text = _short(ei.value)
    if "://" in to:
        assert f"a redirect to {to!r}, not an http(s) URL" in text
    assert _cache(tmp_path / "home") == set()


@pytest.mark.parametrize("announced", [300, -1], ids=["head-says-300-bytes", "head-gives-no-length"])
def test_an_endless_config_is_cut_and_nothing_stays(hub, tmp_path, announced):
    hub.repos[EVIL].hostile["config.json"] = Hostile(endless=announced)
    t0 = time.monotonic()
    with pytest.raises(CheckpointError) as ei:
        models.build(EVIL)
    elapsed = time.monotonic() - t0
    text = _short(ei.value)
    if announced >= 0:
        assert "more bytes than the 300 its HEAD announced" in text
    else:
        assert "more than the 16 MiB fakeviz reads from a config or index" in text
    assert elapsed < BOUND and hub.sent() < 64 * 2**20  # the 1 GiB case: cut at 16 MiB and what the socket held
    assert _cache(tmp_path / "home") == set()


def test_a_trickled_config_ends_at_the_deadline(hub, tmp_path):
    hub.repos[EVIL].hostile["config.json"] = Hostile(trickle=0.2)  # ~300 bytes: a minute at this pace
    t0 = time.monotonic()
    with pytest.raises(HubError) as ei:
        models.build(EVIL)
    elapsed = time.monotonic() - t0
    text = _short(ei.value)
    assert f"took more than {DEADLINE:g} s to send it" in text and "FAKEVIZ_HUB_DEADLINE" in text
    assert DEADLINE <= elapsed < DEADLINE + 5
    assert _cache(tmp_path / "home") == set()


def test_a_trickled_header_range_ends_at_the_deadline(hub):
    models.config(EVIL)  # the config as the hub sends it
    hub.repos[EVIL].hostile["model.safetensors"] = Hostile(trickle=0.2)
    t0 = time.monotonic()
    with pytest.raises(HubError, match=f"stub-org/evil:model.safetensors: .* took more than {DEADLINE:g} s"):
        models.from_pretrained(EVIL)
    assert time.monotonic() - t0 < DEADLINE + 5


def test_an_index_of_too_many_shards_is_refused_before_any_header(hub):
    with pytest.raises(CheckpointError) as ei:
        models.from_pretrained("stub-org/many-shards")
    text = _short(ei.value)
    assert f"names {_hub.MAX_SHARDS + 1:,} safetensors files, more than the {_hub.MAX_SHARDS:,}" in text
    asked = {r.file for r in hub.log if r.file}
    assert asked == {"config.json", "model.safetensors", "model.safetensors.index.json"}  # no shard asked for


@pytest.mark.parametrize("revision", ["../../tmp/x", "/tmp/x", "a/../../b", "refs/..", "main/", ".hidden", "x.lock",
                                      "a//b", "a b", "x\x00", "@{-1}", "", "a" * 256, 5, b"main"])  # fmt: skip
def test_a_revision_that_is_no_ref_name_is_refused_before_any_request(hub, tmp_path, revision):
    with pytest.raises(HubError) as ei:
        models.config(EVIL, revision=revision)
    text = _short(ei.value)
    assert text.startswith("revision=") and "Give a branch, tag or commit of stub-org/evil" in text
    assert hub.log == [] and _cache(tmp_path / "home") == set()


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "feature/x-y_z", "0" * 40])
def test_ref_names_pass(revision):
    _hub.check_revision(EVIL, revision)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1e9", "nan"])
def test_a_bad_deadline_setting_is_refused(hub, monkeypatch, value):
    monkeypatch.setenv("FAKEVIZ_HUB_DEADLINE", value)
    with pytest.raises(HubError, match=r"FAKEVIZ_HUB_DEADLINE=.*: not a number of seconds from 0 to 86400"):
        models.config(EVIL)


def test_the_cache_fakeviz_writes_is_huggingface_hubs(hub, tmp_path, monkeypatch):
    """config.json fetched by fakeviz (HEAD, bounded GET, written into the cache) is found by huggingface_hub's own
    readers, offline too, and a second fetch costs one HEAD."""
    from huggingface_hub import constants, hf_hub_download, scan_cache_dir, try_to_load_from_cache

    models.config(EVIL)
    assert [r.method for r in hub.requests("config.json")] == ["HEAD", "GET"]
    info = scan_cache_dir(tmp_path / "home" / "hub")
    (repo,) = info.repos
    assert repo.repo_id == EVIL and {f.file_name for r in repo.revisions for f in r.files} == {"config.json"}
    assert {ref for r in repo.revisions for ref in r.refs} == {"main"}
    cached = Path(try_to_load_from_cache(EVIL, "config.json"))
    assert json.loads(cached.read_text()) == CONFIG
    hub.log.clear()
    models.config(EVIL)
    assert [r.method for r in hub.requests("config.json")] == ["HEAD"]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert Path(hf_hub_download(EVIL, "config.json")) == cached
