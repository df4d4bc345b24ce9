"""Consumer GPUs by the names users type, in plans (issue 31): ``gpus="4090"`` is the RTX 4090's memory as its driver
reports it, ``gpus="24GB"`` 24e9 bytes; the same run is recorded for both, and each verdict reads its own capacity."""

from __future__ import annotations

import json

import pytest

import fakeviz as fv
import fakeviz.models
from fakeviz._core.gpus import GPUS, PUBLISHED_GB

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

TINY = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512}  # fmt: skip


def test_a_4090_and_24gb_plan_the_same_run_on_their_own_capacities() -> None:
    model = fv.models.build("meta-llama/Llama-3.1-8B", device="cuda:0", **TINY)
    by_size = fv.plan(model, gpus="24GB", seq=64)
    by_name = fv.plan(model, gpus="4090", seq=64)
    pair = fv.plan(model, gpus="2xRTX4090", seq=64)
    assert by_size.capacities == {"cuda:0": 24 * 10**9}
    assert by_name.capacities == {"cuda:0": GPUS["RTX 4090"]} and set(pair.capacities.values()) == {GPUS["RTX 4090"]}
    # the same run: the same peak; the card's usable memory is its published 24 GiB less what the driver keeps,
    # more than 24e9 bytes, so whatever fits "24GB" fits a 4090
    assert by_name.trace.peak_bytes() == by_size.trace.peak_bytes()
    assert 24 * 10**9 < GPUS["RTX 4090"] <= PUBLISHED_GB["RTX 4090"] * 2**30
    assert by_size.fits and by_name.fits


def test_the_command_line_takes_the_same_names(tmp_path, capsys) -> None:
    from fakeviz._frontends.cli import main

    out = tmp_path / "r.json"
    assert main(["report", "gpt2", "--set", "n_layer=1", "--seq", "16", "--gpus", "2x4090", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["gpus"] == 2 and data["capacity"] == "4090" and data["verdict"]["fits"] is True
    text = capsys.readouterr().out
    assert "capacity 2 x RTX 4090 (24.0 GiB)" in text and "time: step" in text and "on RTX 4090" in text
