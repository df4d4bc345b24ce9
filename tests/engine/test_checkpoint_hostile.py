"""Hostile checkpoints (issue 30, Serious 3): shards outside the folder, oversized and mistyped headers and indexes.

Note: [hostile checkpoints] in ``fakeviz/_engine/checkpoint.py``. Every case is a :class:`CheckpointError` naming the
file and the entry, in a few lines; a shard outside the folder is refused before it is opened, in the same words
whether or not it exists; headers cost bounded memory (measured in a subprocess); and a fuzz of mutated headers and
indexes never gets anything but a model or a ``CheckpointError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
from sparse_safetensors import counting_open, write_raw_safetensors, write_sparse_safetensors

from fakeviz import models
from fakeviz._core.errors import CheckpointError
from fakeviz._engine import checkpoint as ck

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

TINY = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="bfloat16", vocab_size=16, hidden_size=8,
    intermediate_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    max_position_embeddings=8, tie_word_embeddings=True,
)  # fmt: skip
SHAPES = {
    "model.embed_tokens.weight": (16, 8), "model.layers.0.self_attn.q_proj.weight": (8, 8),
    "model.layers.0.self_attn.k_proj.weight": (4, 8), "model.layers.0.self_attn.v_proj.weight": (4, 8),
    "model.layers.0.self_attn.o_proj.weight": (8, 8), "model.layers.0.mlp.gate_proj.weight": (8, 8),
    "model.layers.0.mlp.up_proj.weight": (8, 8), "model.layers.0.mlp.down_proj.weight": (8, 8),
    "model.layers.0.input_layernorm.weight": (8,), "model.layers.0.post_attention_layernorm.weight": (8,),
    "model.norm.weight": (8,),
}  # fmt: skip
NAMES = list(SHAPES)
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture(autouse=True)
def _quiet():
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # checkpoints that disagree with the config warn (FakeVizWarning)
        yield
    transformers.logging.set_verbosity(level)


def header_of(names: list[str] = NAMES) -> tuple[dict, int]:
    """A valid header (BF16, back to back) for ``names`` and the bytes of its data region."""
    header, at = {}, 0
    for name in names:
        n = 2 * torch.Size(SHAPES[name]).numel()
        header[name] = {"dtype": "BF16", "shape": list(SHAPES[name]), "data_offsets": [at, at + n]}
        at += n
    return header, at


def folder_with(root: Path, header: dict | bytes | None = None, **kw) -> Path:
    """``root/ckpt``: TINY's config.json and one model.safetensors (a valid one unless ``header`` is given)."""
    folder = root / "ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY))
    if header is None:
        header, kw["data_size"] = header_of()
    write_raw_safetensors(folder / "model.safetensors", header, **kw)
    return folder


def sharded(root: Path) -> Path:
    """``root/ckpt``: TINY in two shards with an index, and ``root/outside/x.safetensors`` (a valid file) beside it."""
    folder = root / "ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY))
    half = len(NAMES) // 2
    for shard, names in zip(SHARDS, (NAMES[:half], NAMES[half:])):
        write_sparse_safetensors(folder / shard, {k: ("BF16", SHAPES[k], 2) for k in names})
    write_index(folder, {k: SHARDS[i >= half] for i, k in enumerate(NAMES)})
    (root / "outside").mkdir(exist_ok=True)
    write_sparse_safetensors(root / "outside" / "x.safetensors", {k: ("BF16", SHAPES[k], 2) for k in NAMES})
    return folder


def write_index(folder: Path, weight_map, **extra) -> None:
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map, **extra})
    )


def refused(folder: Path, *needles: str, build: bool = True) -> str:
    """The CheckpointError ``read_checkpoint`` (and ``from_pretrained``) raise: short, naming each needle."""
    with pytest.raises(CheckpointError) as ei:
        ck.read_checkpoint(folder)
    msg = str(ei.value)
    if build:
        with pytest.raises(CheckpointError) as again:
            models.from_pretrained(folder)
        assert str(again.value) == msg
    short(msg)
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert "Traceback" not in msg and "torch." not in msg
    return msg


def short(msg: str) -> None:
    assert len(msg) < 800 and msg.count("\n") <= 2, msg


@contextlib.contextmanager
def opened():
    """The paths the checkpoint reader opens (every file it reads goes through its module's ``open``)."""
    paths: list[Path] = []
    real = open

    def spy(path, *args, **kwargs):
        paths.append(Path(path).resolve())
        return real(path, *args, **kwargs)

    with mock.patch.object(ck, "open", spy, create=True):
        yield paths


def safetensors_accepts(path: Path) -> bool:
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            list(f.keys())
        return True
    except Exception:  # noqa: BLE001 - the oracle: safetensors' own reader refuses the file
        return False


# ------------------------------------------------------------------------------------------- confinement
HOSTILE_NAMES = [
    "../outside/x.safetensors",
    "{outside}/x.safetensors",  # an absolute path to a real file
    "../../../../etc/passwd",
    "../../../../etc/no-such-file",
    "sub/../../outside/x.safetensors",
    "./../outside/x.safetensors",
    "..",
    "",
    "a\x00b.safetensors",
    "C:\\weights\\x.safetensors",
    "\\\\server\\share\\x.safetensors",
    "..\\outside\\x.safetensors",
    "\ud800.safetensors",  # a lone surrogate (JSON allows its escape): no file system can name it
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_index_shards_outside_the_folder_are_refused_unopened(tmp_path, name):
    folder = sharded(tmp_path)
    name = name.format(outside=tmp_path / "outside")
    weight_map = {k: SHARDS[0] for k in NAMES}
    weight_map["model.norm.weight"] = name
    write_index(folder, weight_map)
    with opened() as paths:
        msg = refused(folder, "model.safetensors.index.json", "weight_map entry 'model.norm.weight'", "shard")
    assert all(p.is_relative_to(folder.resolve()) for p in paths), paths  # nothing outside was opened
    assert not any(p.name.endswith(".safetensors") for p in paths)  # nor any shard: names are checked first
    assert "must be inside its folder" in msg


def test_outside_errors_do_not_tell_whether_the_path_exists(tmp_path):
    folder = sharded(tmp_path)

    def message(name: str) -> str:
        write_index(folder, {"model.norm.weight": name})
        with pytest.raises(CheckpointError) as ei:
            ck.read_checkpoint(folder)
        return str(ei.value).replace(ck._short.repr(name), "NAME")  # as the message shows it (maybe shortened)

    for there, not_there in [
        ("../outside/x.safetensors", "../outside/y.safetensors"),
        ("../../../../etc/passwd", "../../../../etc/no-such-file"),
        (str(tmp_path / "outside" / "x.safetensors"), str(tmp_path / "outside" / "y.safetensors")),
    ]:
        assert message(there) == message(not_there)
    (folder / "link.safetensors").symlink_to(tmp_path / "outside" / "x.safetensors")
    (folder / "dangling.safetensors").symlink_to(tmp_path / "outside" / "y.safetensors")
    assert message("link.safetensors") == message("dangling.safetensors")
    assert "resolves outside the checkpoint folder" in message("link.safetensors")


def test_a_symlinked_shard_pointing_outside_is_outside(tmp_path):
    folder = sharded(tmp_path)
    (folder / "link.safetensors").symlink_to(tmp_path / "outside" / "x.safetensors")
    write_index(folder, dict.fromkeys(NAMES, "link.safetensors"))
    with opened() as paths:
        refused(folder, "shard 'link.safetensors' resolves outside the checkpoint folder")
    assert [p.name for p in paths] == ["model.safetensors.index.json"] * 2  # read_checkpoint, from_pretrained
    (folder / "sub").symlink_to(tmp_path / "outside", target_is_directory=True)  # a folder on the way
    write_index(folder, dict.fromkeys(NAMES, "sub/x.safetensors"))
    refused(folder, "shard 'sub/x.safetensors' resolves outside")
    (folder / "loop.safetensors").symlink_to(folder / "loop.safetensors")
    write_index(folder, dict.fromkeys(NAMES, "loop.safetensors"))
    refused(folder, "shard 'loop.safetensors'")


def test_weight_files_and_config_found_in_a_folder_are_confined_too(tmp_path):
    folder = folder_with(tmp_path)
    outside = tmp_path / "outside.safetensors"
    (folder / "model.safetensors").rename(outside)
    (folder / "model.safetensors").symlink_to(outside)
    with opened() as paths:
        there = refused(folder, "weight file 'model.safetensors' resolves outside the checkpoint folder")
    assert not paths
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(tmp_path / "no-such.safetensors")
    assert refused(folder) == there  # a dangling symlink: the same words
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(folder / "no-such.safetensors")
    refused(folder, "weight file 'model.safetensors' is not a file (a broken symlink?)")
    (folder / "model.safetensors").unlink()
    outside.rename(folder / "model.safetensors")
    (folder / "config.json").rename(tmp_path / "config.json")
    (folder / "config.json").symlink_to(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="config 'config.json' resolves outside the checkpoint folder"):
        models.from_pretrained(folder)


def test_symlinks_inside_the_folder_and_subfolders_are_fine(tmp_path):
    folder = sharded(tmp_path)
    (folder / "sub").mkdir()
    (folder / SHARDS[1]).rename(folder / "sub" / "b.safetensors")
    (folder / "alias.safetensors").symlink_to(folder / SHARDS[0])  # inside, by an absolute link
    half = len(NAMES) // 2
    write_index(folder, {k: "alias.safetensors" if i < half else "sub/b.safetensors" for i, k in enumerate(NAMES)})
    ckpt = ck.read_checkpoint(folder)
    assert list(ckpt.tensors) == NAMES
    model = models.from_pretrained(folder)
    assert model.model.norm.weight.shape == (8,)


def test_hugging_face_hub_cache_snapshots_read(tmp_path):
    """The hub's cache: snapshots/<rev>/* are symlinks to ../../blobs/<hash>, outside the snapshot folder."""
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    src = sharded(tmp_path / "src")
    for i, name in enumerate(["config.json", "model.safetensors.index.json", *SHARDS]):
        (src / name).rename(blobs / f"{i:040x}")
        (snap / name).symlink_to(Path("../../blobs") / f"{i:040x}")
    model = models.from_pretrained(snap)
    assert model.model.embed_tokens.weight.shape == (16, 8)
    assert ck.checkpoint_file(snap, SHARDS[0]) == snap / SHARDS[0]


# ---------------------------------------------------------------------------------------- header sizes
def test_headers_over_safetensors_limit_are_refused_unread(tmp_path):
    # safetensors' MAX_HEADER_SIZE (huggingface/safetensors, safetensors/src/tensor.rs): 100_000_000 bytes
    assert ck.SAFETENSORS_MAX_HEADER == 100_000_000
    assert ck.MAX_HEADER_BYTES < ck.SAFETENSORS_MAX_HEADER
    for length, needle in [
        (99 * 2**20, "over safetensors' own limit of 100,000,000 bytes"),  # 103.8 MB: the 99 MiB
        (ck.SAFETENSORS_MAX_HEADER, "larger than fakeviz reads (16 MiB"),
        (ck.MAX_HEADER_BYTES + 1, "larger than fakeviz reads (16 MiB"),
    ]:
        folder = folder_with(tmp_path / str(length), b"", data_size=length, length=length)  # a hole, never read
        with opened() as paths:
            msg = refused(folder, "model.safetensors", needle, build=False)
        assert len(paths) == 1
        assert "Save the checkpoint in smaller shards" in msg or "safetensors refuses it too" in msg


def test_checkpoint_totals_are_capped(tmp_path, monkeypatch):
    folder = sharded(tmp_path)
    assert len(ck.read_checkpoint(folder).tensors) == len(NAMES)
    monkeypatch.setattr(ck, "MAX_TENSORS", 8)
    refused(folder, "names 11 tensors, more than the 8 fakeviz reads", "fakeviz.models.build(folder)")
    (folder / "model.safetensors.index.json").unlink()  # no index: every *.safetensors of the folder is read
    refused(folder, "more than 8 tensors", f"after {SHARDS[1]}: 11 tensors")
    monkeypatch.setattr(ck, "MAX_TENSORS", 100)
    monkeypatch.setattr(ck, "MAX_TOTAL_HEADER_BYTES", 1000)
    refused(folder, "or 1,000 bytes of headers (after")
    monkeypatch.setattr(ck, "MAX_INDEX_BYTES", 100)
    write_index(folder, dict.fromkeys(NAMES, SHARDS[0]))
    refused(folder, "longer than the 100 bytes fakeviz reads from an index")


def test_an_oversized_index_is_read_bounded(tmp_path):
    folder = sharded(tmp_path)
    index = folder / "model.safetensors.index.json"
    with open(index, "wb") as f:
        f.truncate(ck.MAX_INDEX_BYTES + 2**30)  # 1 GiB more than the cap, a hole
    reads: list[int] = []
    with mock.patch.object(ck, "open", counting_open(reads), create=True):
        refused(folder, "longer than the 16 MiB fakeviz reads from an index", build=False)
    assert sum(reads) == ck.MAX_INDEX_BYTES + 1


# ------------------------------------------------------------------------------------ header JSON types
def hostile(header: dict, **entry) -> dict:
    header = json.loads(json.dumps(header))
    header["model.norm.weight"].update(entry)
    return header


DEEP = 100_000
HEADER_CASES = {
    "metadata a list": (lambda h: {"__metadata__": ["x"], **h}, ["field '__metadata__' is a JSON array"]),
    "metadata value a number": (lambda h: {"__metadata__": {"format": 1}, **h}, ["'__metadata__' entry 'format'"]),
    "dtype a list": (lambda h: hostile(h, dtype=["BF16"]), ["tensor 'model.norm.weight'", "field 'dtype'"]),
    "dtype unknown": (lambda h: hostile(h, dtype="Q9"), ["tensor 'model.norm.weight'", "dtype 'Q9' is not known"]),
    "shape [true, 16]": (lambda h: hostile(h, shape=[True, 16]), ["'model.norm.weight'", "field 'shape' is [True, 16]"]),
    "shape negative": (lambda h: hostile(h, shape=[-8]), ["'model.norm.weight'", "field 'shape' is [-8]"]),
    "shape a float": (lambda h: hostile(h, shape=[8.0]), ["'model.norm.weight'", "field 'shape'"]),
    "shape a string": (lambda h: hostile(h, shape="8"), ["'model.norm.weight'", "field 'shape' is '8'"]),
    "shape overflows": (lambda h: hostile(h, shape=[2**40] * 3), ["field 'shape'", "fits in 64 bits"]),
    "shape deep": (lambda h: hostile(h, shape="DEEP"), ["nests JSON too deeply"]),
    "offsets negative": (lambda h: hostile(h, data_offsets=[-16, 0]), ["'model.norm.weight'", "'data_offsets'"]),
    "offsets reversed": (lambda h: hostile(h, data_offsets=[16, 0]), ["'model.norm.weight'", "begin <= end"]),
    "offsets three": (lambda h: hostile(h, data_offsets=[0, 8, 16]), ["'model.norm.weight'", "'data_offsets'"]),
    "offsets past 2**64": (lambda h: hostile(h, data_offsets=[0, 2**64]), ["'model.norm.weight'", "'data_offsets'"]),
    "offsets out of the file": (
        lambda h: hostile(h, data_offsets=[10**9, 10**9 + 16]), ["'model.norm.weight'", "the file is truncated"]),
    "offsets overlap": (
        lambda h: hostile(h, data_offsets=[0, 16]), ["'model.embed_tokens.weight'", "overlaps tensor 'model.norm.weight'"]),
    "offsets wrong size": (lambda h: hostile(h, data_offsets=[0, 4]), ["'model.norm.weight'", "spans 4 bytes"]),
    "field missing": (lambda h: {**h, "model.norm.weight": {"dtype": "BF16", "shape": [8]}}, ["'data_offsets' is missing"]),
    "entry a list": (lambda h: {**h, "model.norm.weight": [1, 2]}, ["'model.norm.weight': its entry is [1, 2]"]),
    "header a list": (lambda h: [h], ["the header is a JSON array, not an object"]),
    "deep header": (lambda h: "DEEP", ["nests JSON too deeply"]),
    "integer over the digit limit": (lambda h: hostile(h, shape=["HUGE"]), ["the header is not JSON"]),
    "Infinity, ignored field": (lambda h: hostile(h, x=float("inf")), ["not JSON (Infinity is not JSON)"]),
    "a field twice": (lambda h: "TWICE", ["the key 'dtype' appears twice in one object"]),
}  # fmt: skip


def dumps(obj) -> bytes:
    raw = json.dumps(obj).encode()
    raw = raw.replace(b'"DEEP"', b"[" * DEEP + b"]" * DEEP)
    raw = raw.replace(b'"TWICE"', b'{"w": {"dtype": "U8", "dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}')
    return raw.replace(b'"HUGE"', b"9" * 5000)


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_bad_header_types_are_checkpoint_errors(tmp_path, case):
    make, needles = HEADER_CASES[case]
    header, data_size = header_of()
    folder = folder_with(tmp_path, dumps(make(header)), data_size=data_size)
    msg = refused(folder, "model.safetensors", *needles)
    assert "Re-download" in msg or "Upgrade torch" in msg
    assert not safetensors_accepts(folder / "model.safetensors")  # safetensors refuses each of them too


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda h, n: (h, n - 2), "ends at byte"),  # a truncated download
        (lambda h, n: (h, n + 8), "bytes after its last tensor"),
        (lambda h, n: ({k: v for k, v in h.items() if k != "model.layers.0.mlp.up_proj.weight"}, n), "to no tensor"),
    ],
    ids=["truncated", "trailing bytes", "gap"],
)
def test_the_data_region_is_checked_as_safetensors_checks_it(tmp_path, edit, needle):
    header, data_size = edit(*header_of())
    folder = folder_with(tmp_path, header, data_size=data_size)
    refused(folder, "model.safetensors", needle)
    assert not safetensors_accepts(folder / "model.safetensors")


def test_messages_stay_short_whatever_the_file_holds(tmp_path):
    header, data_size = header_of()
    long_name = "x" * 100_000
    header[long_name] = {"dtype": "BF16" * 10_000, "shape": [8] * 50_000, "data_offsets": [0, 16]}
    msg = refused(folder_with(tmp_path, header, data_size=data_size), "x" * 20)
    assert len(msg) < 400
    folder = sharded(tmp_path / "index")
    write_index(folder, {long_name: "../" * 10_000 + "x"})
    refused(folder, "climbs out", build=False)
    write_index(folder, {long_name: "y" * 100_000})
    refused(folder, "shard(s) named in the index are missing: yyyy", build=False)


# ---------------------------------------------------------------------------------------- index types
INDEX_CASES = {
    "not JSON": (b"{weight_map", ["not a checkpoint index (not JSON"]),
    "a list": (b"[]", ["a JSON array, not an object"]),
    "no weight_map": (b"{}", ["no 'weight_map'"]),
    "weight_map a list": (b'{"weight_map": ["a"]}', ["field 'weight_map' is a JSON array"]),
    "weight_map a string": (b'{"weight_map": "model.safetensors"}', ["field 'weight_map' is a JSON string"]),
    "value a number": (b'{"weight_map": {"model.norm.weight": 1}}', ["entry 'model.norm.weight' is 1"]),
    "value a list": (b'{"weight_map": {"model.norm.weight": ["a"]}}', ["entry 'model.norm.weight' is ['a']"]),
    "value null": (b'{"weight_map": {"model.norm.weight": null}}', ["entry 'model.norm.weight' is None"]),
    "deep": (b'{"weight_map": ' + b"[" * DEEP + b"]" * DEEP + b"}", ["nests JSON too deeply"]),
    "not UTF-8": (b'{"weight_map": {"\xff": "a"}}', ["not JSON"]),
}


@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_bad_index_types_are_checkpoint_errors(tmp_path, case):
    raw, needles = INDEX_CASES[case]
    folder = sharded(tmp_path)
    (folder / "model.safetensors.index.json").write_bytes(raw)
    refused(folder, "model.safetensors.index.json", *needles)


# -------------------------------------------------------------------------------- bounded cost, measured
MEASURE = r"""
import json, os, re, sys, time
from fakeviz._engine import checkpoint as ck

def hwm():
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024

def rchar():
    return int(re.search(r"rchar:\s+(\d+)", open("/proc/self/io").read()).group(1))

out = {}
for path in sys.argv[1:]:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS
    rss0, io0, t0 = hwm(), rchar(), time.perf_counter()
    try:
        result = f"{len(ck.read_safetensors_header(path)[0])} tensors"
    except ck.CheckpointError as e:
        result = str(e).splitlines()[0].split(": ", 1)[1]
    out[os.path.basename(path)] = dict(peak=hwm() - rss0, read=rchar() - io0, s=time.perf_counter() - t0, result=result)
print(json.dumps(out))
"""


def densest_valid_header(limit: int) -> tuple[bytes, int]:
    """The most tensors a header of ``limit`` bytes can hold (zero-size U8 tensors, all at byte 0: valid)."""
    entry = b'"%x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'
    parts, size, i = [], 2, 0
    while size + len(entry % i) + 1 <= limit:
        parts.append(entry % i)
        size += len(parts[-1]) + 1
        i += 1
    return b"{" + b",".join(parts) + b"}", i


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc (VmHWM reset, rchar)")
def test_worst_headers_cost_bounded_memory(tmp_path):
    cap = ck.MAX_HEADER_BYTES
    valid, n = densest_valid_header(cap)
    write_raw_safetensors(tmp_path / "worst_valid.safetensors", valid, data_size=0)
    filler = b'{"w":{"dtype":"U8","data_offsets":[0,0],"shape":['
    filler += b"{}," * ((cap - len(filler) - 4) // 3) + b"0]}}"  # the most objects json.loads can make of cap bytes
    write_raw_safetensors(tmp_path / "worst_hostile.safetensors", filler, data_size=0)
    length = 99 * 2**20  # the 99 MiB header (1.77 M entries; here a hole: it is refused unread)
    write_raw_safetensors(tmp_path / "refused_99MiB.safetensors", b"", data_size=length, length=length)
    files = [str(tmp_path / f) for f in ("refused_99MiB", "worst_hostile", "worst_valid")]
    env = {**os.environ, "PYTHONPATH": str(Path(ck.__file__).parents[2])}
    proc = subprocess.run([sys.executable, "-c", MEASURE, *(f + ".safetensors" for f in files)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    print(json.dumps(got, indent=1))
    refused_, hostile_, valid_ = (got[Path(f).name + ".safetensors"] for f in files)
    assert "over safetensors' own limit" in refused_["result"]
    assert refused_["read"] < 64 * 1024 and refused_["peak"] < 16 * 2**20  # 8 bytes read, nothing parsed
    assert "field 'shape'" in hostile_["result"]
    assert hostile_["peak"] < 600 * 2**20  # about 25 bytes per byte of JSON, measured 419 MB
    assert valid_["result"] == f"{n} tensors" and n > 250_000
    assert valid_["peak"] < 400 * 2**20  # measured 236 MB for 300,841 tensors
    assert valid_["read"] < cap + 64 * 1024


# ------------------------------------------------------------------------------------------------- fuzz
JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=6)
    | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, 8, 16, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=8,
)  # fmt: skip
SPECIAL = st.sampled_from(["DEEP", "HUGE", "BF16", "F32", "U8", "F8_E4M3", "F4", "bf16", "", "__metadata__"])
PATHS = st.sampled_from([*HOSTILE_NAMES, *SHARDS, "link.safetensors", "dangling.safetensors", "sub/x.safetensors"])


def mutate_bytes(data, raw: bytes) -> bytes:
    """Up to two byte edits (most examples get none, so the JSON-level mutations reach the checks behind the parse)."""
    for _ in range(data.draw(st.sampled_from([0, 0, 0, 0, 0, 1, 2]), label="byte edits")):
        at = data.draw(st.integers(0, len(raw)), label="at")
        cut = data.draw(st.integers(0, 4), label="cut")
        raw = raw[:at] + data.draw(st.binary(max_size=4) | st.sampled_from([b"[", b"{", b'"', b"\\u", b",", b"-"]),
                                   label="insert") + raw[at + cut :]  # fmt: skip
    return raw


def outcome(folder: Path, outside: Path) -> str:
    """``from_pretrained(folder)``: a model, or a short CheckpointError; never another exception, never a read outside."""
    try:
        with opened() as paths:
            models.from_pretrained(folder)
        result = "built"
    except CheckpointError as e:
        short(str(e))
        result = "refused: " + str(e).splitlines()[0].split(": ", 1)[-1][:30]
    assert not any(p.is_relative_to(outside) or not p.is_relative_to(folder.resolve()) for p in paths), paths
    return result


@hypothesis.settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(data=st.data())
def test_fuzz_mutated_headers(data):
    header, data_size = header_of()
    ops = ["field", "drop", "entry", "metadata", "offsets", "shape", "dtype", "same size", "rename", "extra"]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        name = data.draw(st.sampled_from([*NAMES, "new.tensor"]), label="tensor")
        op = data.draw(st.sampled_from(ops), label="op")
        entry = header.setdefault(name, {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]})
        if op == "field" and isinstance(entry, dict):
            entry[data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = data.draw(JSON | SPECIAL)
        elif op == "drop" and isinstance(entry, dict) and entry:
            del entry[data.draw(st.sampled_from(sorted(entry)))]
        elif op == "entry":
            header[name] = data.draw(JSON | SPECIAL)
        elif op == "metadata":  # a valid one half the time
            header["__metadata__"] = data.draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4)) | JSON)
        elif op == "offsets" and isinstance(entry, dict):
            entry["data_offsets"] = data.draw(st.lists(st.integers(-4, data_size + 64), min_size=2, max_size=2))
        elif op == "shape" and isinstance(entry, dict):
            entry["shape"] = data.draw(st.lists(st.integers(0, 20), max_size=3))
        elif op == "dtype" and isinstance(entry, dict):
            entry["dtype"] = data.draw(SPECIAL)
        elif op == "same size" and isinstance(entry, dict):  # still valid: another 2-byte dtype, or the shape reshaped
            if data.draw(st.booleans()):
                entry["dtype"] = data.draw(st.sampled_from(["F16", "I16", "U16", "BF16"]))
            elif name in SHAPES:
                entry["shape"] = [torch.Size(SHAPES[name]).numel(), *data.draw(st.lists(st.just(1), max_size=2))]
        elif op == "rename":  # still valid, but not the model's name: built with a warning
            header[data.draw(st.text(max_size=8), label="new name")] = header.pop(name)
        elif op == "extra" and isinstance(entry, dict):  # safetensors ignores unknown fields
            entry[data.draw(st.text(max_size=4).filter(lambda k, taken=set(entry): k not in taken))] = data.draw(JSON)
    raw = mutate_bytes(data, dumps(header))
    how = data.draw(st.sampled_from(["exact"] * 6 + ["near", "any"]), label="length")
    length = {
        "exact": None,
        "near": len(raw) + data.draw(st.integers(-8, 8)),
        "any": data.draw(st.integers(0, 2**64 - 1)),
    }[how]
    length = None if length is not None and length < 0 else length
    data_size = max(0, data_size + data.draw(st.sampled_from([0, 0, 0, 0, -2, 2, 64]), label="data delta"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = folder_with(root, raw, data_size=data_size, length=length)
        result = outcome(folder, root / "outside")
        hypothesis.event(result)  # --hypothesis-show-statistics: how many built, and which checks refused
        if result == "built":  # fakeviz accepts only what safetensors accepts, and reads it the same way
            with safetensors.safe_open(str(folder / "model.safetensors"), framework="pt") as f:
                theirs = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
            ours = ck.read_safetensors_header(folder / "model.safetensors")[0]
            assert {k: v.shape for k, v in ours.items()} == theirs


@hypothesis.settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(data=st.data())
def test_fuzz_mutated_indexes(data):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = sharded(root)
        (folder / "link.safetensors").symlink_to(root / "outside" / "x.safetensors")
        (folder / "dangling.safetensors").symlink_to(root / "outside" / "nothing.safetensors")
        (folder / "sub").symlink_to(root / "outside", target_is_directory=True)
        half = len(NAMES) // 2
        index: object = {"metadata": {}, "weight_map": {k: SHARDS[i >= half] for i, k in enumerate(NAMES)}}
        for _ in range(data.draw(st.integers(1, 3), label="mutations")):
            op = data.draw(st.sampled_from(["path", "value", "weight_map", "top", "add", "drop"]), label="op")
            wm = index.get("weight_map") if isinstance(index, dict) else None
            name = data.draw(st.sampled_from([*NAMES, "extra.weight"]), label="tensor")
            if op == "path" and isinstance(wm, dict):
                wm[name] = data.draw(PATHS).format(outside=root / "outside")
            elif op == "value" and isinstance(wm, dict):
                wm[name] = data.draw(JSON | SPECIAL)
            elif op == "weight_map" and isinstance(index, dict):
                index["weight_map"] = data.draw(JSON | SPECIAL)
            elif op == "top":
                index = data.draw(JSON | SPECIAL)
            elif op == "add" and isinstance(wm, dict):
                wm[data.draw(st.text(max_size=8))] = data.draw(PATHS | st.text(max_size=8))
            elif op == "drop" and isinstance(wm, dict) and wm:
                del wm[data.draw(st.sampled_from(sorted(wm)))]
        (folder / "model.safetensors.index.json").write_bytes(mutate_bytes(data, dumps(index)))
        hypothesis.event(outcome(folder, (root / "outside").resolve()))


def test_fuzz_reaches_both_outcomes(tmp_path):
    """The fuzz bases are valid: unmutated, they build (so a mutation that keeps them valid builds too)."""
    header, data_size = header_of()
    assert outcome(folder_with(tmp_path / "a", dumps(header), data_size=data_size), tmp_path / "outside") == "built"
    assert safetensors_accepts(tmp_path / "a" / "ckpt" / "model.safetensors")
    assert outcome(sharded(tmp_path / "b"), (tmp_path / "b" / "outside").resolve()) == "built"


def test_a_huge_config_json_is_refused_after_a_bounded_read(tmp_path):
    """``models.build(folder)`` reads config.json up to the index limit (16 MiB), not whole."""
    (tmp_path / "config.json").write_bytes(b"{" + b" " * (ck.MAX_INDEX_BYTES + 10) + b"}")
    with mock.patch("builtins.open", wraps=open) as opened:
        with pytest.raises(CheckpointError, match=r"config\.json: over 16 MiB, not a model config"):
            models.build(tmp_path)
    assert opened.call_count == 1
