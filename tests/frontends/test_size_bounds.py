"""Every number a user or a config file gives is bounded before work starts (Note: [size limits], issue 42)."""

from __future__ import annotations

import json

import pytest

import fakeviz as fv
from fakeviz._core.errors import ArgumentError, SequenceTooLongError
from fakeviz._core.limits import MAX_JOB_BYTES, MAX_REPEATS, check_config, config_bytes, divisors
from fakeviz._frontends.cli import main

TINY = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 256}  # fmt: skip


def test_divisors_are_every_divisor_in_order_and_fast():
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    big = divisors(10**12)
    assert len(big) == 169 and big[0] == 1 and big[-1] == 10**12 and big == sorted(big)


def test_a_200_byte_config_with_ten_million_layers_is_refused_before_building(tmp_path):
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **TINY, "num_hidden_layers": 10**7}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    assert f.stat().st_size < 300
    fv.models.config("gpt2")  # transformers imported: what follows is only the check
    with pytest.raises(ArgumentError, match=r"num_hidden_layers=10,000,000: .*at most 1,024") as e:
        fv.models.build(f)
    assert e.value.argument == "num_hidden_layers" and str(f) in str(e.value)


@pytest.mark.parametrize("field, value", [("hidden_size", 10**9), ("vocab_size", 10**15),
                                          ("intermediate_size", 10**13), ("max_position_embeddings", 10**16)])  # fmt: skip
def test_sizes_past_the_largest_job_are_refused_naming_the_field(field, value):
    with pytest.raises(ArgumentError, match="largest job fakeviz plans") as e:
        fv.models.build("meta-llama/Llama-3.1-8B", **{field: value})
    assert e.value.argument == field and f"{value:,}" in str(e.value).splitlines()[0]


def test_every_catalog_model_is_within_the_limits():
    for name in fv.models.available():
        cfg = fv.models.config(name)
        check_config(cfg)
        assert config_bytes(cfg) < MAX_JOB_BYTES / 1000


def test_the_deepest_model_allowed_builds():
    m = fv.models.build("meta-llama/Llama-3.1-8B", **{**TINY, "num_hidden_layers": 3})
    assert len(m.model.layers) == 3
    with pytest.raises(ArgumentError, match="at most 1,024"):
        fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=MAX_REPEATS + 1)
    assert fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=MAX_REPEATS).num_hidden_layers == MAX_REPEATS


def test_fit_refuses_a_huge_batch_and_a_seq_past_the_context_before_searching():
    with pytest.raises(ArgumentError, match=r"(?s)batch=1,000,000,000,000, seq=2,048: .*Give batch <= "):
        fv.fit("meta-llama/Llama-3.1-8B", gpus="8xH100", batch=10**12, progress=False)
    with pytest.raises(SequenceTooLongError, match="context of 131,072"):
        fv.fit("meta-llama/Llama-3.1-8B", gpus="8xH100", seq=10**6, progress=False)


def test_inputs_refuse_a_step_past_the_largest_job():
    with fv.fake_mode():
        m = fv.models.build("meta-llama/Llama-3.1-8B", **TINY)
        with pytest.raises(ArgumentError, match="bytes of activations"):
            fv.models.inputs(m, batch=10**15, seq=100)


def test_cli_steps_are_bounded(capsys):
    assert main(["report", "gpt2", "--train", "--steps", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert "--steps is at most 1,024" in err and "1,000,000,000" in err


@pytest.mark.parametrize("argv, says", [(["--oplog", "-1"], "--oplog must be at least 0, not -1"),
                                        (["--device", "cuda:99"], "--device 'cuda:99': fake cuda devices are cuda:0 .. cuda:63"),
                                        (["--device", "mps"], "fakeviz does not fake mps devices")])  # fmt: skip
def test_cli_refuses_a_bad_oplog_or_device_as_a_usage_error(capsys, argv, says):
    assert main(["report", "gpt2", *argv]) == 2
    assert says in capsys.readouterr().err
