"""Issue 42's minor cases: each refused with fakeviz's own short error naming the argument, before any work."""

from __future__ import annotations

import json

import pytest
import torch

import fakeviz as fv
from fakeviz._core.errors import ArgumentError, CheckpointError, UnknownModelError

L = "meta-llama/Llama-3.1-8B"


def _config(tmp_path, **extra):
    raw = {**fv.models.config(L, num_hidden_layers=1).to_dict(), "model_type": "llama",
           "architectures": ["LlamaForCausalLM"], **extra}  # fmt: skip
    f = tmp_path / "config.json"
    f.write_text(json.dumps(raw, default=str))
    return f


def test_json_nested_thousands_deep_is_a_checkpoint_error(tmp_path):
    f = tmp_path / "config.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="nested too deep"):
        fv.models.build(f)


def test_a_negative_size_names_the_field():
    with pytest.raises(ArgumentError, match=r"^hidden_size=-64: hidden_size is a size"):
        fv.models.build(L, hidden_size=-64)


def test_a_quantization_config_that_is_not_an_object(tmp_path):
    with pytest.raises(CheckpointError, match="quantization_config is 'gptq', not an object"):
        fv.models.build(_config(tmp_path, quantization_config="gptq"))


@pytest.mark.parametrize("key, value", [("bits", -7), ("bits", 4.5), ("group_size", 0), ("group_size", 2**40)])
def test_gptq_numbers_that_size_tensors_are_checked(tmp_path, key, value):
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 128, key: value}
    with pytest.raises(CheckpointError, match=rf"quantization_config\.{key}={value!r} is not"):
        fv.models.build(_config(tmp_path, quantization_config=qc))


def test_full_width_letters_are_no_hub_id():
    with pytest.raises(UnknownModelError, match="unknown model"):
        fv.models.build("ｍｅｔａ/ｌｌａｍａ")


@pytest.mark.parametrize("dtype", ["fp8", torch.int8, torch.float8_e5m2])
def test_a_parameter_dtype_torch_cannot_build_is_refused(dtype):
    with pytest.raises(ArgumentError, match=r"cannot be a model's parameter dtype\nGive bf16.*quantization="):
        fv.models.build(L, dtype=dtype, num_hidden_layers=1)


@pytest.mark.parametrize("kw, match", [
    ({"block_size": 16.0}, r"^block_size=16\.0: vLLM's block sizes"),
    ({"max_num_batched_tokens": 10**12}, r"^max_num_batched_tokens=1000000000000: .*largest job"),
    ({"max_num_batched_tokens": 4 * 10**10}, r"^max_num_batched_tokens=40000000000: more tokens than max_num_seqs"),
    ({"max_model_len": True}, r"^max_model_len=True: max_model_len is a whole number"),
])  # fmt: skip
def test_serve_refuses_careless_numbers(kw, match):
    with pytest.raises(ArgumentError, match=match):
        fv.serve(L, gpus="H100", **kw)


def _tiny():
    return fv.models.config(L, num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=4, vocab_size=256)  # fmt: skip


def test_fit_refuses_an_unknown_offload_instead_of_skipping_it():
    with pytest.raises(ArgumentError, match=r"^offload=\['everything'\]: 'everything' is not an offload"):
        fv.fit(_tiny(), gpus="H100", batch=2, seq=16, offload=["everything"], progress=False)


@pytest.mark.parametrize("limit", [1.5, 0, -3, True, "8"])
def test_max_batch_and_max_seq_refuse_a_limit_that_is_not_a_whole_number(limit):
    with pytest.raises(ArgumentError, match=rf"^limit={limit!r}: the largest batch to try"):
        fv.max_batch(_tiny(), gpus="H100", limit=limit)
    with pytest.raises(ArgumentError, match=rf"^limit={limit!r}: the largest seq to try"):
        fv.max_seq(_tiny(), gpus="H100", limit=limit)


@pytest.mark.parametrize("ranks", [-1, 2.0, [0, 1.5], "some", [True]])
def test_simulate_refuses_ranks_that_are_not_a_list_of_ranks(ranks):
    def step() -> None:
        pass

    with pytest.raises((ArgumentError, ValueError), match=r"^ranks="):
        fv.simulate(step, world_size=2, ranks=ranks)


@pytest.mark.parametrize("dm, where", [({"": 5}, "5"), ({"": -1}, "-1"), ({"": "cuda:7"}, "'cuda:7'"),
                                       ({"model": 0, "lm_head": 2}, "2")])  # fmt: skip
def test_a_device_map_onto_gpus_the_plan_lacks_is_refused(dm, where):
    with pytest.raises(ArgumentError, match=rf"^device_map=.*is put on {where}, and the plan has GPUs 0 to 1"):
        fv.plan(_tiny(), gpus="2xH100", device_map=dm)


def test_a_device_map_onto_the_plans_gpus_and_cpu_runs():
    p = fv.plan(_tiny(), gpus="2xH100", device_map={"model": "cuda:1", "lm_head": "cpu"})
    assert p.fits in (True, False)


def test_a_device_map_naming_a_module_the_model_lacks_is_refused():
    with pytest.raises(ArgumentError, match=r"(?s)^device_map=.*has no module 'model.layer'.*Did you mean 'model.layers'"):
        fv.plan(_tiny(), gpus="2xH100", device_map={"model.layer": 0, "lm_head": 1})
