"""Data-dependent paths real code takes, under fake tensors (Note: [values under fake tensors]).

Each case runs the same code on real CPU tensors (``fv.record(fake=False)``) and fake ones, from the same
seed, and compares the op logs: equal where the fake run knows the values (small tensors, random draws in
step with the real run, bounds of draws), and otherwise different exactly where ``fidelity()["assumptions"]``
says. ``VALUE_LIMIT`` is lowered to make values unknown, as they are for full-size models.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import fakeviz as fv
from fakeviz._engine import values

tf = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore")


def _no_fake_mode_active() -> bool:
    return torch._guards.detect_fake_mode() is None and not fv.is_fake(torch.ones(1))


def _run(fake: bool, work: Callable[[], Any], seed: int = 0, **kw: Any) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    np.random.seed(seed)  # SpecAugment draws its masks with NumPy
    with fv.record(fake=fake, **kw) as trace:
        out = work()
    return trace, out


def _assumptions(trace: Any) -> list[str]:
    return trace.fidelity()["assumptions"].assumption.tolist()


@pytest.fixture
def unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values of more than a few elements unknown, as those of a full-size model's tensors are."""
    monkeypatch.setattr(values, "VALUE_LIMIT", 4)


# ------------------------------------------------------------------------------------ trunc_normal_ (init)
def _vit() -> Any:
    cfg = tf.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=16)  # fmt: skip
    return tf.ViTModel(cfg)


def _modernbert() -> Any:
    cfg = tf.ModernBertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                              vocab_size=100, global_attn_every_n_layers=2, local_attention=16, pad_token_id=0,
                              eos_token_id=1, bos_token_id=2, cls_token_id=2, sep_token_id=1)  # fmt: skip
    return tf.ModernBertModel(cfg)


@pytest.mark.parametrize("build", [_vit, _modernbert], ids=["vit", "modernbert"])
def test_trunc_normal_init_equals_real(build: Callable[[], Any]) -> None:
    """``.item()`` of the bounds and ``mask.any()`` of the rejection loop: the draws are run with the real
    run's generator, so ModernBERT (bounds at 2 std) re-draws exactly as often as the real run."""
    real, _ = _run(False, build)
    fake, _ = _run(True, build)
    assert "aten.where.self" in real.ops.op.tolist() or build is _vit  # ModernBERT re-draws outliers
    assert fake.oplog_lines() == real.oplog_lines()
    assert _assumptions(fake) == [] and fake.error is None


def test_trunc_normal_bounds_decide_without_values(unknown: None) -> None:
    """ViT: std 0.02 within [-2, 2]: no normal draw lies 100 std out, so ``mask.any()`` is False in every
    run, whatever the values (``bounds``)."""
    real, _ = _run(False, _vit)
    fake, _ = _run(True, _vit)
    assert fake.oplog_lines() == real.oplog_lines()
    assert _assumptions(fake) == []


def test_trunc_normal_assumes_no_redraw_when_values_unknown(unknown: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """ModernBERT with draws not run (``DRAW_LIMIT``): each ``mask.any()`` is an assumption (no outlier), and the
    fake log is the real one without its re-draw rounds."""
    monkeypatch.setattr(values, "DRAW_LIMIT", 4)
    real, _ = _run(False, _modernbert)
    fake, _ = _run(True, _modernbert)
    table = fake.fidelity()["assumptions"]
    assert len(table) > 0 and set(table.op) == {"aten._local_scalar_dense.default"}
    assert all(t.startswith("trunc_normal_: no draw fell outside") for t in table.assumption)
    assert all("initialization.py" in line or "init.py" in line for line in table.user_line)
    round_ = [
        "aten.empty_like.default", "aten.normal_.default", "aten.where.self", "aten.lt.Scalar", "aten.gt.Scalar",
        "aten.bitwise_or.Tensor", "aten.any.default", "aten._local_scalar_dense.default",
    ]  # fmt: skip
    names, i, kept = real.ops.op.astype(str).tolist(), 0, []
    while i < len(names):
        if names[i : i + len(round_)] == round_:
            i += len(round_)
            while names[i : i + len(round_)] == round_:
                i += len(round_)
            i += names[i] == "aten.copy_.default"  # the re-drawn result copied into the weight
            continue
        kept.append(names[i])
        i += 1
    assert len(kept) < len(names)  # the real run did re-draw
    assert fake.ops.op.astype(str).tolist() == kept


# -------------------------------------------------------------------------------- DeBERTa-v2: nonzero in loss
def _deberta_step() -> Any:
    cfg = tf.DebertaV2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             vocab_size=100, num_labels=3, max_position_embeddings=64,
                             pooler_hidden_size=32)  # fmt: skip
    m = tf.DebertaV2ForSequenceClassification(cfg)
    ids = torch.randint(0, 100, (2, 7))
    loss = m(ids, labels=torch.tensor([1, -1])).loss  # label -1 is ignored: nonzero keeps one row
    loss.backward()
    return loss


def test_deberta_nonzero_in_loss_equals_real() -> None:
    real, _ = _run(False, _deberta_step)
    fake, _ = _run(True, _deberta_step)
    assert "aten.nonzero.default" in fake.ops.op.tolist()
    assert fake.oplog_lines() == real.oplog_lines()
    assert _assumptions(fake) == []


def test_nonzero_of_unknown_values_assumes_every_element(unknown: None) -> None:
    with fv.record() as trace:
        labels = torch.empty(6, dtype=torch.long)  # uninitialized: unknown in any run
        idx = (labels >= 0).nonzero()
        picked = torch.nn.functional.embedding(idx.view(-1), torch.randn(6, 3))
    assert idx.shape == (6, 1) and picked.shape == (6, 3)
    table = trace.fidelity()["assumptions"]
    assert table.op.tolist() == ["aten.nonzero.default"]
    assert "every element" in table.assumption[0] and "test_data_dependent.py" in table.user_line[0]


# ---------------------------------------------------------------- Wav2Vec2: labels check, LayerDrop, SpecAugment, CTC
def _wav2vec2_step() -> Any:
    cfg = tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            vocab_size=20, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, layerdrop=0.5,
                            mask_time_prob=0.3, mask_time_length=2, do_stable_layer_norm=False)  # fmt: skip
    m = tf.Wav2Vec2ForCTC(cfg)
    m.train()  # LayerDrop and SpecAugment are on in training
    x = torch.randn(2, 400)
    labels = torch.randint(1, 20, (2, 6))
    labels[1, 4:] = -100
    loss = m(x, labels=labels).loss
    loss.backward()
    return loss


def test_wav2vec2_layerdrop_specaugment_ctc_equal_real() -> None:
    real, _ = _run(False, _wav2vec2_step)
    fake, _ = _run(True, _wav2vec2_step)
    ops = fake.ops.op.tolist()
    assert "aten.rand.default" in ops and "aten.index_put_.default" in ops and "aten._ctc_loss.Tensor" in ops
    # the whole log, backward included (Note: [strides of the real kernel]: no clone after
    # _log_softmax_backward_data)
    assert fake.oplog_lines() == real.oplog_lines()
    assert _assumptions(fake) == []


def test_wav2vec2_with_unknown_labels_states_its_assumptions(unknown: None) -> None:
    """Labels of 12 elements, SpecAugment's mask of 78: unknown. Each read or size that needed them is an
    assumption; the ops differ from the real run's only in the sizes of ``masked_select`` (every label
    kept, where the real run drops the two -100) and of ``_ctc_loss``'s ``log_alpha``, and in backward the
    gradient read through SpecAugment's mask."""
    real, _ = _run(False, _wav2vec2_step)
    fake, _ = _run(True, _wav2vec2_step)
    table = fake.fidelity()["assumptions"]
    ops = table.op.tolist()
    assert "aten.masked_select.default" in ops and "aten._ctc_loss.Tensor" in ops
    assert "aten.index.Tensor" in ops  # backward of SpecAugment's x[mask] = v reads x.grad[mask]
    assert any(t.startswith("Wav2Vec2: labels.max() < vocab_size") for t in table.assumption)
    assert (table.module.dropna() != "").all() and table.user_line.notna().all()
    assert len(fake.oplog_lines()) == len(real.oplog_lines())
    diff = [(a, b) for a, b in zip(real.oplog_lines(), fake.oplog_lines()) if a != b]
    assert [re.sub(r"\[\d+(, \d+)*\]", "[..]", a) == re.sub(r"\[\d+(, \d+)*\]", "[..]", b) for a, b in diff]
    # and in backward, x.grad[mask] of SpecAugment (every element selected), and the ops on its output
    assert {re.search(r"aten\.\w+", a).group() for a, _ in diff} <= {
        "aten.masked_select",
        "aten._ctc_loss",
        "aten.index",
        "aten._ctc_loss_backward",
    }


# ------------------------------------------------------------------------------------- generate() with a KV cache
def _llama() -> Any:
    cfg = tf.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, vocab_size=100)  # fmt: skip
    return tf.LlamaForCausalLM(cfg).eval()


N_NEW = 4


def _generate() -> Any:
    m = _llama()
    ids = torch.randint(0, 100, (2, 5))
    return m.generate(ids, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False)


def test_generate_equals_real() -> None:
    real, out_r = _run(False, _generate)
    fake, out_f = _run(True, _generate)
    assert out_f.shape == out_r.shape == (2, 5 + N_NEW)
    assert fake.oplog_lines() == real.oplog_lines()
    assert _assumptions(fake) == []


def test_generate_with_unknown_values_assumes_no_early_stop(unknown: None) -> None:
    """Logits unknown: whether a sequence ended is an assumption (no), every step but the last, where the
    length criterion alone decides (``bounds``); min_new_tokens keeps the real run from stopping early."""
    real, out_r = _run(False, _generate)
    fake, out_f = _run(True, _generate)
    assert out_f.shape == out_r.shape
    assert real.num_ops == fake.num_ops and fake.oplog_lines() == real.oplog_lines()
    table = fake.fidelity()["assumptions"]
    assert set(table.op) == {"aten._local_scalar_dense.default"}
    stops = [t for t in table.assumption if t.startswith("generate(): no sequence finished early")]
    assert len(stops) == N_NEW - 1
    # the input ids are unknown too: two checks on them are assumptions (no padding)
    assert sorted(set(table.assumption) - set(stops)) == [
        "generate(): the attention mask is all ones (no padding in the inputs), so it is dropped",
        "generate(): the inputs are not right-padded (a check that only warns)",
    ]


@pytest.mark.skipif(fv.fake_cuda_status().mode not in ("shim", "native"), reason="no fake cuda")
def test_generate_on_fake_cuda_runs_the_real_cpu_runs_steps(unknown: None) -> None:
    """On a fake GPU the attention kernel is the GPU's (fakeviz._engine.attention), so the ops are not the CPU
    run's; the steps are: one forward (one embedding) per new token, the same output."""
    real, out_r = _run(False, _generate)
    fake, out_f = _run(True, _generate, device="cuda:0")
    assert out_f.shape == out_r.shape and out_f.device.type == "cuda"

    def steps(trace: Any) -> int:
        return int((trace.ops.op == "aten.embedding.default").sum())

    assert steps(fake) == steps(real) == N_NEW
    assert sum(t.startswith("generate(): no sequence finished") for t in _assumptions(fake)) == N_NEW - 1


# ------------------------------------------------------------------------------------------- what values are kept
def test_values_follow_aliases_and_are_dropped_by_unknown_writes() -> None:
    with fv.record():
        x = torch.zeros(4)
        v = x[1:3]
        v.add_(2)  # through a view: the base's value changes too
        assert x.sum().item() == 4.0
        x.add_(torch.empty(4))  # an unknown operand: every alias loses its value
        assert x.constant is None and v.constant is None
        with pytest.raises(fv.DataDependentError):
            v.sum().item()
    assert _no_fake_mode_active()


def test_values_on_fake_cuda_and_large_tensors_have_none() -> None:
    with fv.record(device="cuda:0"):
        t = torch.tensor([1, 2, 3], device="cuda:0")
        s = t.sum()
        assert s.device.type == "cuda" and s.item() == 6
        big = torch.ones(values.VALUE_LIMIT + 1)
        assert big.constant is None
        assert torch.randn(3).constant is None  # a draw on the GPU's generator: not known


def test_draws_follow_the_real_generator_and_reseeding() -> None:
    def draws() -> list[Any]:
        torch.manual_seed(3)
        a = torch.rand(3)
        torch.empty(1000).normal_()
        b = torch.randint(0, 9, (5,))
        torch.manual_seed(3)
        c = torch.rand(3)
        return [a, b, c]

    real = draws()
    with fv.record():
        fake = draws()
        for r, f in zip(real, fake):
            assert torch.equal(f.constant, r)


def test_a_draw_too_large_to_run_loses_the_generator_until_reseeded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "DRAW_LIMIT", 100)
    with fv.record():
        torch.manual_seed(0)
        torch.empty(1000).normal_()  # not run: the generator is no longer in step
        assert torch.rand(2).constant is None
        torch.manual_seed(1)  # in step again (a state other than the one it was lost in)
        assert torch.equal(torch.rand(2).constant, torch.rand(2, generator=torch.Generator().manual_seed(1)))


# ---------------------------------------------------------------------------------------------------- errors
class _Gate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:  # depends on values the fake run cannot know
            return y
        return -y


def test_unknowable_read_is_a_short_error_with_line_op_module(unknown: None) -> None:
    with pytest.raises(fv.DataDependentError) as info:
        with fv.record() as trace:
            _Gate()(torch.randn(2, 8))
    err = info.value
    assert err.op == "aten._local_scalar_dense.default" and err.module == "_Gate"
    assert "test_data_dependent.py" in err.user_line and "in forward" in err.user_line
    msg = str(err)
    assert "if y.sum() > 0" in msg and "made by aten.gt.Scalar" in msg and "What to do" in msg
    assert "symbolic=True" not in msg and len(msg.splitlines()) <= 25
    assert err.trace is trace and trace.error["op"] == err.op and trace.num_ops >= 4
    assert _no_fake_mode_active()


def test_symbolic_guard_names_line_module_and_op() -> None:
    """record(symbolic=True): a Python branch on an unbacked size raises outside any op; the error still names
    the user's line, the module and the op that made the size."""

    class Pick(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            idx = (x > 0).nonzero()
            if idx.size(0) > 0:
                return x[idx]
            return x

    with pytest.raises(fv.DataDependentError) as info:
        with fv.record(symbolic=True) as trace:
            Pick()(torch.empty(10))
    err = info.value
    assert err.op == "aten.nonzero.default" and err.module == "Pick"
    assert "test_data_dependent.py" in err.user_line and "if idx.size(0) > 0" in str(err)
    assert type(err.__cause__).__name__ == "GuardOnDataDependentSymNode"
    assert err.trace is trace and trace.error["module"] == "Pick" and trace.num_ops >= 2
    assert _no_fake_mode_active()


_PICK = """
import torch


class Pick(torch.nn.Module):
    def forward(self, x):
        idx = (x > 0).nonzero()
        if idx.size(0) > 0:
            return x[idx]
        return x
"""


@pytest.mark.parametrize("folder", ["fakeviz", "torch", "my-packages"])
def test_symbolic_guard_names_the_line_of_code_in_any_folder(tmp_path: Any, folder: str) -> None:
    """The user's code in a folder named like a package (a clone named ``fakeviz``, a project folder ``torch``) is
    still the user's: the guard error names its line as the op table would (it was None: the check read
    ``"/fakeviz/" in path``)."""
    import importlib.util

    path = tmp_path / folder / "src" / f"pick_{folder.replace('-', '_')}.py"
    path.parent.mkdir(parents=True)
    path.write_text(_PICK)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(fv.DataDependentError) as info:
        with fv.record(symbolic=True):
            mod.Pick()(torch.empty(10))
    err = info.value
    assert err.user_line == f"{path}:8 in forward" and err.module == "Pick"
    assert "if idx.size(0) > 0" in str(err) and err.trace.error["user_line"] == err.user_line


def test_real_inputs_give_values_and_are_never_written() -> None:
    ids = torch.tensor([[5, 7, 0]])  # real, made outside the block: its values are known
    with fv.record():
        assert (ids == 0).any().item() is True
        ids.add_(1)  # writes the fake run's copy, as FakeTensorMode does for real inputs
    assert torch.equal(ids, torch.tensor([[5, 7, 0]]))
