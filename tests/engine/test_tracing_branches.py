"""transformers' tracing checks take the branch a real run takes (Note: [tracing checks under fake tensors]).

transformers asks ``is_tracing(tensor)``, True for any FakeTensor, before reading mask and input values
(BART's attention masks, DeBERTa-v2's padding warning). Under a fake recording the fake run takes the eager
branch wherever it knows the values (Note: [values under fake tensors]), so its op log equals a real CPU
run's; where it does not know them it keeps the tracing branch and ``fidelity()["assumptions"]`` says where
and what a real run does instead; under torch.export (``fv.check_export``) tracing is real and stays so.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fakeviz as fv
from fakeviz._engine.tracing_checks import BRANCH_OP

transformers = pytest.importorskip("transformers")


def _bart() -> Any:
    cfg = transformers.BartConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.BartModel(cfg)


def _deberta() -> Any:
    cfg = transformers.DebertaV2Config(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
    )  # fmt: skip
    return transformers.DebertaV2Model(cfg)


def _run(model: str, mask: str) -> None:
    torch.manual_seed(0)
    m = _bart() if model == "bart" else _deberta()
    ids = torch.tensor([[3, 4, 5, 6]])
    kw: dict[str, Any] = {}
    if mask == "ones":
        kw["attention_mask"] = torch.ones(1, 4, dtype=torch.long)
    elif mask == "padded":
        kw["attention_mask"] = torch.tensor([[1, 1, 1, 0]])
    if model == "bart":
        kw["decoder_input_ids"] = ids
    m(input_ids=ids, **kw).last_hidden_state.sum().backward()


def _tracing_rows(trace: fv.Trace) -> Any:
    rows = trace.fidelity()["assumptions"]
    return rows[rows.op == BRANCH_OP]


@pytest.mark.parametrize("mask", ["none", "ones", "padded"])
@pytest.mark.parametrize("model", ["bart", "deberta-v2"])
def test_fake_takes_the_real_branch(model: str, mask: str) -> None:
    with fv.record(fake=False) as real:
        _run(model, mask)
    with fv.record() as fake:
        _run(model, mask)
    assert fake.oplog_lines() == real.oplog_lines()
    assert len(_tracing_rows(fake)) == 0
    if model == "bart" or mask == "none":  # the real run reads values there (the branch the fake run used to skip)
        assert (real.ops.op == "aten._local_scalar_dense.default").any()


def test_unknown_values_keep_the_tracing_branch_and_say_so() -> None:
    def run() -> None:
        torch.manual_seed(0)
        m = _bart()
        # all ones, but cut from a tensor too large to carry values: the fake run does not know them
        mask = torch.ones(1, 70_000, dtype=torch.long)[:, :4]
        ids = torch.tensor([[3, 4, 5, 6]])
        m(input_ids=ids, decoder_input_ids=ids, attention_mask=mask)

    with fv.record(fake=False) as real:
        run()
    with fv.record() as fake:
        run()
    rows = _tracing_rows(fake)
    assert len(rows) >= 1
    text = rows.assumption.iloc[0]
    assert "masking_utils.py:" in text and "_ignore_bidirectional_mask_sdpa" in text
    assert "gives SDPA no mask" in text
    # the difference is where it says: the fake run builds the encoder mask the real run skips
    a, b = real.oplog_lines(), fake.oplog_lines()
    first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert first >= rows.seq.iloc[0] - 4  # the real run's value read (all, item) sits right before it
    assert len(b) > len(a)


def _is_tracing(x: torch.Tensor) -> bool:
    from transformers.utils.import_utils import is_tracing

    return is_tracing(x)


def test_is_tracing_answers() -> None:
    answers: dict[str, bool] = {}
    with fv.record() as trace:
        known = torch.ones(2, 3)
        answers["known"] = _is_tracing(known)
        with torch._guards.tracing(torch._guards.TracingContext(torch._guards.detect_fake_mode(known))):
            answers["known, tracing"] = _is_tracing(known)
        answers["unknown"] = _is_tracing(torch.empty(2))  # uninitialised: values unknown
    with fv.fake_mode():
        answers["fake session, not recording"] = _is_tracing(torch.ones(2))
    answers["after"] = _is_tracing(torch.ones(2))
    assert answers == {
        "known": False, "known, tracing": True, "unknown": True, "fake session, not recording": True, "after": False,
    }  # fmt: skip
    assert len(_tracing_rows(trace)) == 1  # the unknown one
    from transformers.utils import import_utils

    assert import_utils.is_fake_tensor.__module__ == "transformers.utils.import_utils"  # restored


class _Branchy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1 if _is_tracing(x) else x * 2


def test_check_export_keeps_tracing() -> None:
    check = fv.check_export(_Branchy(), (torch.ones(3),))
    assert check.error is None
    ops = [str(n.target) for n in check.program.graph.nodes if n.op == "call_function"]
    assert ops == ["aten.add.Tensor"]


def test_transformers_imported_inside_the_recording_is_wrapped() -> None:
    """A fresh process whose first ``import transformers`` happens inside the recorded block (a model built
    there, as ``fakeviz.models.build`` does) takes the same branches as a later recording: the check is wrapped
    when transformers' ``import_utils`` loads, not only when it was loaded before the block."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        import torch
        import fakeviz as fv
        assert "transformers" not in sys.modules

        def run():
            import transformers as tf
            cfg = tf.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, intermediate_size=64, vocab_size=100)
            torch.manual_seed(0)
            m = tf.LlamaForCausalLM(cfg)
            m(input_ids=torch.randint(0, 100, (1, 8)), attention_mask=torch.ones(1, 8, dtype=torch.long))

        logs = []
        for _ in range(2):
            with fv.record() as trace:
                run()
            assert trace.error is None, trace.error
            logs.append(trace.oplog_lines())
        assert logs[0] == logs[1], "first and second recording differ"
        print("ok", len(logs[0]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]
