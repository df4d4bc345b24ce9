"""A build's dtype is its own thread's, never torch's process-wide default (Note: [a thread's default dtype])."""

from __future__ import annotations

import threading

import pytest
import torch

import fakeviz as fv
from fakeviz._engine.default_dtype import default_dtype, thread_dtype
from fakeviz._engine.session import fake_mode
from fakeviz.models._build import _model_class, spec_of

SMALL = {"num_hidden_layers": 2}


def test_a_thread_beside_a_bf16_build_keeps_float32():
    stop = threading.Event()
    seen: dict[torch.dtype, int] = {}
    answers: set[torch.dtype] = set()

    def beside() -> None:
        while not stop.is_set():
            for t in (torch.zeros(3), torch.tensor([1.0, 2.0]), torch.empty(2), torch.full((2,), 0.5),
                      torch.arange(0.0, 1.0, 0.5), torch.nn.Linear(2, 2).weight):  # fmt: skip
                seen[t.dtype] = seen.get(t.dtype, 0) + 1
            answers.add(torch.get_default_dtype())

    th = threading.Thread(target=beside)
    th.start()
    try:
        for _ in range(3):
            m = fv.models.build("meta-llama/Llama-3.1-8B", dtype="bf16", **SMALL)
    finally:
        stop.set()
        th.join()
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert sum(seen.values()) > 100  # the thread ran throughout the builds
    assert set(seen) == {torch.float32} and answers == {torch.float32}
    assert torch.get_default_dtype() == torch.float32


def test_the_default_answers_in_its_own_thread_only():
    inside: list[torch.dtype] = []
    other: list[torch.dtype] = []
    with fake_mode(), default_dtype(torch.float16):
        inside += [torch.get_default_dtype(), torch.zeros(1).dtype, torch.tensor(1.0).dtype, torch.full((1,), 2.0).dtype,
                   torch.arange(0.0, 2.0).dtype, torch.nn.Linear(2, 2).weight.dtype, thread_dtype()]  # fmt: skip
        ints = [
            torch.tensor([1, 2]).dtype,
            torch.arange(3).dtype,
            torch.full((1,), 2).dtype,
            torch.zeros(1, dtype=torch.int8).dtype,
        ]
        th = threading.Thread(target=lambda: other.extend([torch.get_default_dtype(), torch.zeros(1).dtype]))
        th.start()
        th.join()
    assert inside == [torch.float16] * 6 + [torch.float16]
    assert ints == [torch.int64, torch.int64, torch.int64, torch.int8]
    assert other == [torch.float32, torch.float32]
    assert thread_dtype() is None and torch.get_default_dtype() == torch.float32
    with pytest.raises(ValueError, match="floating"):
        with default_dtype(torch.int8):
            pass


def _layout(model: torch.nn.Module) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    return [(n, t.dtype, tuple(t.shape)) for n, t in [*model.named_parameters(), *model.named_buffers()]]


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "gpt2", "google/gemma-3-1b-pt", "Qwen/Qwen3-30B-A3B",
                                  "deepseek-ai/DeepSeek-V3", "openai/whisper-large-v3"])  # fmt: skip
def test_a_build_equals_one_under_torchs_process_wide_default(name):
    """The modules, dtypes and shapes equal what setting torch's default dtype for the whole process built."""
    spec = spec_of(name, SMALL if "whisper" not in name else {"encoder_layers": 1, "decoder_layers": 1})
    ours = fv.models.build(spec.config, dtype="bf16")
    saved = torch.get_default_dtype()
    with fake_mode():
        torch.set_default_dtype(torch.bfloat16)
        try:
            theirs = _model_class(spec)._from_config(spec.config, dtype=torch.bfloat16)
        finally:
            torch.set_default_dtype(saved)
    assert _layout(ours) == _layout(theirs)


DATA = [1.5, 3, True, [1, 2.0], [[1], [2.5]], [[1, 2], [3, 4]], ((1, 2), (3.0, 4)), [], [[], []], [True, 1.0],
        [[1, 2], [3, True]], [torch.tensor(1), 2.0], [[torch.tensor(1.0)], [2.0]],
        [torch.tensor(1.0, dtype=torch.float64), 2]]  # fmt: skip


@pytest.mark.parametrize("data", DATA, ids=repr)
def test_factories_infer_the_dtype_torchs_default_gives(data):
    """``tensor``/``full``/``arange`` from Python numbers: the thread's dtype wherever torch's default would apply."""
    calls = [lambda: torch.tensor(data), lambda: torch.as_tensor(data)]
    if isinstance(data, (int, float)):
        calls += [lambda: torch.full((2,), data), lambda: torch.arange(0, 4, data or 1)]
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        theirs = [call().dtype for call in calls]
    finally:
        torch.set_default_dtype(saved)
    with default_dtype(torch.bfloat16):
        ours = [call().dtype for call in calls]
    assert ours == theirs
