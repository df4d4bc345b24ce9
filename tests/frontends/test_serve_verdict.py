"""fv.serve's verdict says the bytes it judged (Note: [the verdict] in fakeviz._analysis.verdict): vLLM starts when
the weights, the profile run's peak and one request's KV cache fit in what vLLM may use."""

from __future__ import annotations

import json

import pytest

import fakeviz as fv
from fakeviz._core.fmt import format_bytes
from fakeviz._frontends.cli import main

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
L, KV, HD = 4, 2, 16  # layers, KV heads, head_dim


def _llama():
    return fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=L, **TINY)


@pytest.mark.parametrize("gpu", ["1GB", "2MB"])
def test_serving_fits_is_the_verdict_on_the_bytes_it_prints(gpu: str) -> None:
    s = fv.serve(_llama(), gpu, max_model_len=4096, max_num_batched_tokens=64, max_num_seqs=8)
    v = s.verdict
    request = 2 * L * KV * HD * 2 * 4096  # one 4096-token request's K and V in bf16, by hand
    assert v["request_kv"] == request and v["judged"] == s.weights + s.profile_peak + request
    assert v["capacity"] == s.requested and v["headroom"] == s.requested - v["judged"]
    # the verdict is vLLM's start-up check, said with its bytes
    assert s.fits is v["fits"] is (s.error is None) is (v["judged"] <= s.requested)
    assert v["text"].startswith("fits: " if s.fits else "does not fit: ")
    assert f"needs {format_bytes(v['judged'])} allocated" in v["text"]
    assert f"of {format_bytes(s.requested)} requested" in v["text"] and v["text"] in s.text
    if not s.fits:
        assert f"over by {format_bytes(v['judged'] - s.requested)}" in v["text"] and "does not start" in s.text
    assert s.to_dict()["judged"] == v["judged"] and s.to_dict()["verdict"] == v["text"]


def test_the_serve_command_prints_the_verdict(capsys: pytest.CaptureFixture) -> None:
    argv = ["serve", "gpt2", "--gpus", "T4", "--max-model-len", "1024", "--max-num-batched-tokens", "256"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is True and data["verdict"].startswith("fits: cuda:0 needs ")
    assert data["verdict"] in out.splitlines()
