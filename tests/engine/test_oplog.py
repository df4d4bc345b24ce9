"""The op log's text: tensor lists and ``$N`` numbering, pinned line by line for both recorders.

Note: [tensor lists in the op log] and Note: [op log numbering] (``fakeviz/_engine/recorder/ops.py``):
every tensor of a ``Tensor[]`` / ``Tensor?[]`` argument is an input named ``$N``; ``$N`` names a tensor
object as torch's own LoggingTensorMode does, so an in-place op's output keeps its input's number. Each
golden log is checked for the C core and the Python recorder, fake and real, and the numbering is checked
against what ``torch.testing._internal.logging_tensor`` prints for the same real run.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import torch
from torch.testing._internal.logging_tensor import capture_logs_with_logging_tensor_mode

import fakeviz as fv


def _record(fn: Any, recorder: str, *, fake: bool) -> fv.Trace:
    with fv.record(fake=fake) as trace:
        fn()
    assert trace.meta["recorder_core"] == recorder
    return trace


def _lists_and_inplace() -> None:
    x = torch.tensor([1.0, 2.0, 3.0])
    idx = torch.tensor([0, 2])
    y = torch.zeros(2, 3)
    for _ in range(2):  # the second round reuses the recorded op cache's templates
        z = y[:, idx]
    y.add_(1)
    y[:, idx] = x[idx]
    c = torch.cat([z, y[:, :2]])
    parts = [torch.empty(1, 2), torch.empty(3, 2)]
    torch.split_with_sizes_copy(c, [1, 3], out=parts)  # a tensor list passed by keyword
    torch.mul(c, 2, out=c)


GOLDEN = """\
$0: f32[3] cpu = aten.lift_fresh.default($0)
$1: i64[2] cpu = aten.lift_fresh.default($1)
$2: f32[2, 3] cpu = aten.zeros.default([2, 3], device=cpu, pin_memory=False)
$3: f32[2, 2] cpu = aten.index.Tensor($2, [None, $1])
$4: f32[2, 2] cpu = aten.index.Tensor($2, [None, $1])
$2: f32[2, 3] cpu = aten.add_.Tensor($2, 1)
$5: f32[2] cpu = aten.index.Tensor($0, [$1])
$2: f32[2, 3] cpu = aten.index_put_.default($2, [None, $1], $5)
$6: f32[2, 2] cpu = aten.slice.Tensor($2, 1, 0, 2)
$7: f32[4, 2] cpu = aten.cat.default([$4, $6])
$8: f32[1, 2] cpu = aten.empty.memory_format([1, 2], device=cpu, pin_memory=False)
$9: f32[3, 2] cpu = aten.empty.memory_format([3, 2], device=cpu, pin_memory=False)
_ = aten.split_with_sizes_copy.out($7, [1, 3], out=[$8, $9])
$7: f32[4, 2] cpu = aten.mul.out($7, 2, out=$7)"""
# every tensor read is an input: the index tensor after None, the outputs passed as out=[...]
N_INPUTS = [1, 1, 0, 2, 2, 1, 2, 3, 1, 2, 0, 0, 3, 2]


@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_golden_tensor_lists_and_inplace(recorder: str, fake: bool) -> None:
    trace = _record(_lists_and_inplace, recorder, fake=fake)
    assert trace.oplog() == GOLDEN
    assert trace.ops.n_inputs.tolist() == N_INPUTS


def test_index_tensor_made_outside_is_an_input(recorder: str) -> None:
    # a tensor first read inside an index list is registered like any input: an id, a tensor row, a storage
    y = torch.arange(6.0).reshape(2, 3)
    idx = torch.tensor([2, 0])
    trace = _record(lambda: torch.ops.aten.index.Tensor(y, [None, idx]), recorder, fake=False)
    assert trace.oplog_lines() == ["$2: f32[2, 2] cpu = aten.index.Tensor($0, [None, $1])"]
    assert sorted(trace.tensors.tensor) == [0, 1, 2]
    assert sorted(trace.storages.nbytes) == sorted([idx.nbytes, y.nbytes, 2 * 2 * 4])


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(5, 4)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.emb(ids))
        h = h[:, :, torch.tensor([0, 2])]
        h = torch.cat([h, h * 2], dim=-1)
        h.add_(1)
        return h.sum()


def _train_step() -> None:
    torch.manual_seed(0)
    _Net()(torch.tensor([[1, 2], [3, 4]])).backward()


def _ids(line: str) -> tuple[str, list[int], list[int]]:
    """(op, output ids, argument ids) of a line of our log or of torch's LoggingTensorMode log."""
    lhs, rhs = line.split(" = ", 1)
    op, args = rhs.split("(", 1)
    return (
        op.removeprefix("torch._ops."),
        [int(x) for x in re.findall(r"\$(\d+)", lhs)],
        [int(x) for x in re.findall(r"\$(\d+)", args)],
    )


@pytest.fixture(scope="module")
def torch_log() -> list[str]:
    """What torch's LoggingTensorMode logs for a real ``_train_step``."""
    logger = logging.getLogger("LoggingTensor")
    saved = logger.handlers[:]
    logger.handlers.clear()  # pytest's capture handlers, once attached, would format its raw records and fail
    try:
        with capture_logs_with_logging_tensor_mode() as logs:
            _train_step()
    finally:
        logger.handlers[:] = saved
    return list(logs)


@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_numbering_equals_torch_logging_tensor(recorder: str, fake: bool, torch_log: list[str]) -> None:
    # Note: [op log numbering]: the same ops, the same $N for every input and output, as torch's own
    # logging tensor numbers a real run (init, forward with an index list and in-place ops, backward)
    trace = _record(_train_step, recorder, fake=fake)
    ours = [_ids(line) for line in trace.oplog_lines()]
    theirs = [_ids(line) for line in torch_log]
    assert ours == theirs
    assert any(op == "aten.index.Tensor" and len(args) == 2 for op, _, args in ours)
    assert any(op == "aten.add_.Tensor" and outs == args[:1] for op, outs, args in ours)


def test_alias_and_lifetimes_equal_real(recorder: str) -> None:
    # the analyses that read inputs (alias bases, writes, storage lifetimes) agree between fake and real
    real = _record(_train_step, recorder, fake=False)
    fake = _record(_train_step, recorder, fake=True)
    assert real.oplog() == fake.oplog()
    cols = ["tensor", "base", "storage"]
    assert real.tensors[cols].to_dict("records") == fake.tensors[cols].to_dict("records")
    lt = ["storage", "nbytes", "alloc_seq", "free_seq"]
    assert real.storages[lt].to_dict("records") == fake.storages[lt].to_dict("records")
