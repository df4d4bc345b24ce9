"""A sequence past the model's context is refused with the context named, never silently shortened (issue 30,
item 4): models.inputs, plan, sweep, max_seq, generate and the CLI."""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv
from fakeviz import models
from fakeviz._core.errors import SequenceTooLongError
from fakeviz._frontends import cli


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    return models.build("gpt2", num_hidden_layers=1)


def test_context_of_each_kind_of_model(gpt2: torch.nn.Module) -> None:
    assert models.context(gpt2) == (1024, "max_position_embeddings")
    roberta = models.build("FacebookAI/roberta-base", num_hidden_layers=1)
    assert models.context(roberta) == (512, "max_position_embeddings less the padding offset")  # 514 - 1 - 1
    t5 = models.build("google-t5/t5-base", num_layers=1, num_decoder_layers=1)
    assert models.context(t5) is None  # relative positions: nothing bounds it


def test_inputs_take_the_whole_context_and_refuse_one_more(gpt2: torch.nn.Module) -> None:
    with fv.fake_mode():
        assert models.inputs(gpt2, seq=1024)["input_ids"].shape == (1, 1024)
    with pytest.raises(SequenceTooLongError) as err:
        models.inputs(gpt2, seq=1025)
    assert str(err.value) == (
        "seq=1,025 is past openai-community/gpt2's context of 1,024 positions (config max_position_embeddings); "
        "ask for seq <= 1,024, or a model with a longer context"
    )
    assert (err.value.seq, err.value.context) == (1025, 1024) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("bad", [{"batch": 0}, {"seq": 0}, {"seq": -1}, {"batch": 1.5}, {"seq": True}])
def test_inputs_refuse_empty_and_odd_sizes(gpt2: torch.nn.Module, bad: dict) -> None:
    with pytest.raises(ValueError, match="give a whole number >= 1"):
        models.inputs(gpt2, **bad)


def test_plan_refuses_instead_of_reporting_the_shorter_run() -> None:
    with pytest.raises(SequenceTooLongError, match=r"seq=5,000 is past openai-community/gpt2's context of 1,024"):
        fv.plan("gpt2", gpus="H100", seq=5000)
    with pytest.raises(SequenceTooLongError, match=r"seq=1,000 \+ new_tokens=100 .* ask for seq <= 924"):
        fv.plan("gpt2", gpus="H100", seq=1000, new_tokens=100)


def test_sweep_refuses_before_recording_any_point() -> None:
    with pytest.raises(SequenceTooLongError, match=r"seq=4,096 is past"):
        fv.sweep("gpt2", gpus="H100", seq=[1024, 4096, 65536], progress=False)


def test_max_seq_never_answers_past_the_context() -> None:
    best = fv.max_seq("gpt2", gpus="H100")
    assert best.value == 1024 and best.plan is not None and best.plan.fits
    assert max(v for v, _ in best.tried) == 1024
    assert repr(best).endswith("it fits, and the model's context (max_position_embeddings) allows no longer")


def test_cli_refuses_with_one_line_and_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        ["report", "meta-llama/Llama-3.1-8B", "--seq", "99999999999999999999", "--set", "num_hidden_layers=1"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "FITS" not in err
    assert err.strip() == (
        "fakeviz: error: seq=99,999,999,999,999,999,999 is past meta-llama/Llama-3.1-8B's context of 131,072 "
        "positions (config max_position_embeddings); ask for seq <= 131,072, or a model with a longer context"
    )
