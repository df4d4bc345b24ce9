"""Hypothesis over the numeric arguments of plan, fit, serve and the command line (issue 42): every value is either
run (a tiny model) or refused with fakeviz's own error before work starts, never a foreign exception or a hang."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fakeviz as fv
from fakeviz._core.errors import FakeVizError
from fakeviz._frontends.cli import main

TINY = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}  # fmt: skip
# no deadline: a loaded machine is no failure (how fast a refusal is belongs in a benchmark); each example
# refuses before work starts or runs TINY
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip

NUMBERS = st.one_of(
    st.integers(min_value=-(10**6), max_value=4),  # none, negative, small
    st.integers(min_value=65, max_value=10**30),  # past the context, past the largest job, past int64
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)


@pytest.fixture(scope="module")
def tiny():
    return fv.models.config("meta-llama/Llama-3.1-8B", **TINY)


def _bounded(call) -> object:
    try:
        out = call()
    except FakeVizError as e:  # ArgumentError, SequenceTooLongError: ours, with the argument named
        out = e
        assert str(e).strip(), "an error says what went wrong"
    return out


@SETTINGS
@given(batch=NUMBERS, seq=NUMBERS)
def test_plan_runs_or_refuses(tiny, batch, seq):
    out = _bounded(lambda: fv.plan(tiny, gpus="H100", batch=batch, seq=seq))
    if not isinstance(out, Exception):
        assert out.fits in (True, False)


@SETTINGS
@given(batch=st.one_of(st.integers(min_value=-(10**6), max_value=0), st.integers(min_value=10**16, max_value=10**30),
                       st.floats(), st.booleans()),
       seq=st.one_of(st.integers(min_value=1, max_value=64), st.integers(min_value=65, max_value=10**20)))  # fmt: skip
def test_fit_refuses_before_any_search(tiny, batch, seq):
    out = _bounded(lambda: fv.fit(tiny, gpus="2xH100", batch=batch, seq=seq, progress=False))
    assert isinstance(out, FakeVizError)


@SETTINGS
@given(tokens=st.one_of(st.none(), NUMBERS), max_model_len=NUMBERS,
       block_size=st.sampled_from([16, 16.0, 0, -16, 7, True, 10**9, 32]))  # fmt: skip
def test_serve_runs_or_refuses(tiny, tokens, max_model_len, block_size):
    out = _bounded(lambda: fv.serve(tiny, gpus="H100", max_num_batched_tokens=tokens, max_model_len=max_model_len,
                                    block_size=block_size))  # fmt: skip
    if not isinstance(out, Exception):
        assert out.max_num_batched_tokens >= 1


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, tiny):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps({**tiny.to_dict(), "architectures": ["LlamaForCausalLM"]}, default=str))
    return d


@SETTINGS
@given(option=st.sampled_from(["--batch", "--seq", "--steps", "--generate"]),
       value=st.one_of(st.integers(min_value=-(10**3), max_value=3), st.integers(min_value=10**3, max_value=10**40),
                       st.text(alphabet="0123456789e.-+x ", min_size=1, max_size=12)))  # fmt: skip
def test_cli_runs_or_refuses(tiny_folder, capsys, option, value):
    argv = ["report", str(tiny_folder), "--seq", "8", *(["--train"] if option == "--steps" else []), option, str(value)]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc in (0, 1, 2) and "Traceback" not in err, err[-2000:]
    if rc:
        assert err.strip() and len(err.strip().splitlines()) <= 6, err
