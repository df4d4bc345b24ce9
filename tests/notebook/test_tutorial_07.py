"""Tutorial 07 (inference): what it shows about checkpoints, the KV cache and placement is true.

* the checkpoint: Llama-3.1-8B's parameter bytes by hand from its config (and its published parameter total),
  bytes read by ``from_pretrained`` small next to the file sizes, the shards sparse;
* the KV cache: every step's bytes against ``2 * layers * kv_heads * head_dim * tokens * 2`` (bf16) from the config,
  the step count of ``generate``, the moment a ``torch.cat`` holds one layer's K twice;
* placement: the "auto" map the notebook shows is the one transformers' and accelerate's own functions compute
  here (``get_balanced_memory`` then ``infer_auto_device_map``, as ``from_pretrained(device_map="auto")`` does),
  weights per GPU are hand sums of the parameters each map places there, the failing request is the logits'
  size, and the balanced map fits under the L4's capacity.
"""

from __future__ import annotations

import re

import pytest
from nbrun import cell, execute, plain

from fakeviz import models
from fakeviz._core.gpus import parse_gpus

NB = "07_inference.ipynb"
LLAMA_8B_PUBLISHED = 8_030_261_248  # meta-llama/Llama-3.1-8B, as Hugging Face publishes it
BATCH, PROMPT, NEW = 4, 1000, 8  # the notebook's generate run
DOCS, DOC_LEN, GPUS = 10, 8192, "4xL4"  # the notebook's placement run
GIB = 2**30

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


@pytest.fixture(scope="module")
def config():
    return models.config("meta-llama/Llama-3.1-8B")


def num(s: str) -> int:
    return int(s.replace(",", ""))


def hand_parameters(cfg) -> dict[str, int]:
    """Llama's parameters per module, from the config alone (no model built)."""
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * cfg.head_dim
    layer = h * h + 2 * h * kv + h * h + 3 * h * i + 2 * h  # q, k, v, o; gate, up, down; two RMSNorms
    sizes = {"model.embed_tokens": v * h, "model.norm": h, "model.rotary_emb": 0, "lm_head": v * h}
    sizes.update({f"model.layers.{n}": layer for n in range(cfg.num_hidden_layers)})
    return sizes


# ----------------------------------------------------------------------------------------- checkpoint
def test_parameters_are_the_published_total_and_the_hand_bytes(nb, config) -> None:
    out = plain(cell(nb, "def bytes_read"))
    m = re.search(r"LlamaForCausalLM: ([\d,]+) parameters, ([\d,]+) bytes of torch.bfloat16 on cuda:0", out)
    assert m, out
    hand = sum(hand_parameters(config).values())
    assert hand == LLAMA_8B_PUBLISHED
    assert (num(m[1]), num(m[2])) == (hand, 2 * hand)
    assert "fake: True" in out


def test_from_pretrained_reads_the_headers_not_the_data(nb, config) -> None:
    listing = plain(cell(nb, 'DTYPES = {torch.bfloat16: "BF16"'))
    rows = re.findall(r"^\s*\d+\s+(\S+)\s+(\d+)\s+(\d+)\s*$", listing, re.M)
    assert [r[0] for r in rows] == ["config.json", *[f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)],
                                    "model.safetensors.index.json"], listing  # fmt: skip
    shards = [(int(size), int(disk)) for name, size, disk in rows if name.endswith(".safetensors")]
    data = 2 * sum(hand_parameters(config).values())
    headers = sum(size for size, _ in shards) - data
    assert 0 < headers < 64 * 1024  # 8 bytes + the JSON header per shard; the rest is the bf16 data
    assert sum(disk for _, disk in shards) < 2**20  # the data regions are holes: never written

    out = plain(cell(nb, "def bytes_read"))
    m = re.search(r"read ([\d,]+) bytes of a ([\d,]+)-byte checkpoint", out)
    assert m, out
    read, size = num(m[1]), num(m[2])
    assert size == sum(int(r[1]) for r in rows)
    assert headers < read < 256 * 1024  # the headers (and the index, config.json), never the 16 GB of data
    assert read / size < 1e-4


# ------------------------------------------------------------------------------------------- KV cache
def test_kv_cache_per_token_and_per_step_is_the_hand_formula(nb, config) -> None:
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2  # K, V; bf16
    assert f"{per_token:,} bytes" in plain(cell(nb, "c = model.config"))

    out = plain(cell(nb, "mem = gen.trace.memory"))
    rows = re.findall(r"^\s*\d+\s+(prefill|decode \d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+\s*$", out, re.M)
    # generate(max_new_tokens=8): the prefill makes the first token, 7 decode steps the others
    assert [r[0] for r in rows] == ["prefill", *[f"decode {k}" for k in range(1, NEW)]], out
    one_layer_k = BATCH * config.num_key_value_heads * config.head_dim * 2  # per position
    for k, (_, ops, end, tokens, top) in enumerate(rows):
        assert int(end) == per_token * BATCH * (PROMPT + k), k
        assert int(tokens) == PROMPT + k
        if k:  # torch.cat makes the longer K before the shorter one is freed: one layer's K twice at most
            assert int(top) == int(end) + one_layer_k * (PROMPT + k - 1), k
            assert int(ops) == int(rows[1][1])  # every decode step runs the same ops


def test_long_context_sweep_kv_cache(nb, config) -> None:
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    out = plain(cell(nb, "long = fv.sweep"))
    rows = re.findall(r"^\s*\d+\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+(True|False)\s*$", out, re.M)
    assert len(rows) == 4, out
    for batch, seq, kv, peak, fits in rows:
        assert int(kv) == per_token * int(batch) * int(seq)  # the prefill alone (new_tokens=1): the prompt
        assert (fits == "True") == (float(peak) * GIB < 80 * 10**9)  # an H100: 79.6 GiB
    assert [r[4] for r in rows] == ["True", "True", "True", "False"]


# ------------------------------------------------------------------------------------------ placement
def layouts(text: str) -> list[dict[str, str]]:
    """The notebook's folded device maps (``cuda:0: model.embed_tokens, model.layers.0-6``), expanded; one dict
    per map printed."""
    maps: list[dict[str, str]] = []
    for line in text.splitlines():
        m = re.fullmatch(r"(cuda:\d+): (.*)", line.strip())
        if not m:
            continue
        if m[1] == "cuda:0":
            maps.append({})
        for item in m[2].split(", "):
            r = re.fullmatch(r"(.*\.)(\d+)-(\d+)", item)
            names = [f"{r[1]}{n}" for n in range(int(r[2]), int(r[3]) + 1)] if r else [item]
            maps[-1].update(dict.fromkeys(names, m[1]))
    return maps


def peak_rows(text: str) -> dict[str, tuple[float, ...]]:
    """``in_gib(plan)``: device -> (weights, kv_cache, temporaries, peak, capacity, fits)."""
    rows = re.findall(r"^\s*\d+\s+(cuda:\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(True|False)\s*$",
                      text, re.M)  # fmt: skip
    return {r[0]: (*map(float, r[1:6]), r[6] == "True") for r in rows}


def weights_per_device(device_map: dict[str, str], cfg) -> dict[str, float]:
    sizes = hand_parameters(cfg)
    out: dict[str, float] = {}
    for name, device in device_map.items():
        out[device] = out.get(device, 0) + 2 * sizes[name]
    return {d: b / GIB for d, b in out.items()}


@pytest.fixture(scope="module")
def accelerate_auto_map():
    """What ``from_pretrained(device_map="auto", max_memory=<4 L4s>)`` resolves: transformers' get_balanced_memory,
    then accelerate's infer_auto_device_map, run here on the same (fake) model."""
    pytest.importorskip("accelerate")
    from transformers.integrations import accelerate as hf_accelerate

    from fakeviz._frontends.planning import _machine, _own_mode

    model = models.build("meta-llama/Llama-3.1-8B", device="cuda:0")
    with _own_mode(model):
        model.to("cpu")
    max_memory = {i: c.bytes for i, c in enumerate(parse_gpus(GPUS))}
    no_split = model._no_split_modules
    with _machine(len(max_memory)):  # both functions ask torch.cuda how many GPUs there are
        balanced = hf_accelerate.get_balanced_memory(model, max_memory=dict(max_memory),
                                                     no_split_module_classes=no_split)  # fmt: skip
        auto = hf_accelerate.infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split)
    return {k: f"cuda:{v}" for k, v in auto.items()}


def test_auto_map_is_what_accelerate_computes(nb, config, accelerate_auto_map) -> None:
    out = plain(cell(nb, "def layout"))
    (shown,) = layouts(out)
    assert shown == accelerate_auto_map
    peaks = peak_rows(out)
    assert set(peaks) == {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}
    for device, gib in weights_per_device(shown, config).items():
        assert peaks[device][0] == pytest.approx(gib, abs=0.006), device  # the table's 2 decimals
    # by weights the last GPU is the emptiest, yet it is the one that does not fit
    assert min(peaks, key=lambda d: peaks[d][0]) == "cuda:3" == shown["lm_head"]
    assert not peaks["cuda:3"][5] and peaks["cuda:3"][3] > peaks["cuda:3"][4]
    assert all(peaks[d][5] for d in ("cuda:0", "cuda:1", "cuda:2"))


def test_auto_fails_on_the_logits(nb, config) -> None:
    out = plain(cell(nb, "oom = auto.first_oom"))
    m = re.search(r"^(cuda:\d+): aten\.mm\.default in LlamaForCausalLM\.lm_head asks for ([\d,]+) bytes", out, re.M)
    assert m, out
    assert m[1] == "cuda:3"
    assert num(m[2]) == DOCS * DOC_LEN * config.vocab_size * 2  # bf16 logits of every position


def test_balanced_fits_and_places_what_it_says(nb, config) -> None:
    out = plain(cell(nb, 'balanced = fv.plan(model, gpus="4xL4"'))
    assert out.startswith("fits:"), out
    (shown,) = layouts(out)
    assert set(shown) == set(hand_parameters(config))  # every module placed once
    assert [n for n, d in shown.items() if d == "cuda:3"] == ["lm_head"]
    peaks = peak_rows(out)
    for device, gib in weights_per_device(shown, config).items():
        assert peaks[device][0] == pytest.approx(gib, abs=0.006), device
    for device, (_, _, _, peak, capacity, fits) in peaks.items():
        assert fits and peak <= capacity, device
    assert capacity == pytest.approx(parse_gpus("L4")[0].bytes / GIB, abs=0.006)
    # the hidden states cross every boundary between consecutive blocks: batch x seq x hidden x 2 bytes
    transfers = plain(cell(nb, "balanced.transfers"))
    moved = {(a, b): int(n) for a, b, _, n in
             re.findall(r"^\s*\d+\s+(cuda:\d+)\s+(cuda:\d+)\s+(\d+)\s+(\d+)\s*$", transfers, re.M)}  # fmt: skip
    order = [f"model.layers.{n}" for n in range(config.num_hidden_layers)] + ["model.norm", "lm_head"]
    boundaries = {(shown[a], shown[b]) for a, b in zip(order, order[1:]) if shown[a] != shown[b]}
    assert len(boundaries) == 3
    hidden = DOCS * DOC_LEN * config.hidden_size * 2
    for boundary in boundaries:
        assert moved.get(boundary, 0) >= hidden, (boundary, transfers)
