"""Tutorial 05 (aliasing): what it shows about storages, views, writes and tied weights is what real PyTorch does.

The notebook's own ``views_and_writes`` is taken from its cell and run here on real CPU tensors: storages are
counted by ``untyped_storage().data_ptr()``, view and write ops are logged by a ``TorchDispatchMode`` from the
ops' schemas (no fakeviz involved). The GPT-2 figures are checked against the published total and a real CPU
GPT-2 built from transformers' default ``GPT2Config`` (which is GPT-2 small).
"""

from __future__ import annotations

import re

import pytest
import torch
from nbrun import cell, errors, execute, text
from torch.utils._python_dispatch import TorchDispatchMode

NB = "05_aliasing.ipynb"
GPT2_PUBLISHED = 124_439_808  # openai-community/gpt2, as Hugging Face publishes it

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def notebook_function(nb):
    """``views_and_writes`` exactly as the notebook defines it, for real tensors here."""
    source = cell(nb, "def views_and_writes").source.split("\nwith fv.record")[0]
    namespace = {"torch": torch}
    exec(compile(source, NB, "exec"), namespace)  # noqa: S102 - the notebook's own code
    return namespace["views_and_writes"]


def partition(groups) -> set[frozenset[str]]:
    return {frozenset(g) for g in groups}


def test_storage_counts_and_bytes_equal_a_real_cpu_run(nb) -> None:
    real = notebook_function(nb)("cpu")
    ptrs = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in real.values()}
    own = sum(t.numel() * t.element_size() for t in real.values())
    out = text(cell(nb, "st = trace.storages"))
    m = re.search(r"(\d+) storages, (\d+) bytes on cuda:0; the six tensors' own sizes add up to (\d+) bytes", out)
    assert m, out
    assert (int(m[1]), int(m[2]), int(m[3])) == (len(ptrs), sum(ptrs.values()), own)
    assert own > sum(ptrs.values())  # what the notebook says: counting tensors overcounts


def test_each_tensor_sits_where_real_pytorch_puts_it(nb) -> None:
    real = notebook_function(nb)("cpu")
    out = text(cell(nb, "where = pd.DataFrame"))
    rows = re.findall(r"^\s*\d+\s+(\w+)\s+(\d+)\s+(\(.*?\))\s+(\(.*?\))\s+(\d+)\s+(True|False)\s*$", out, re.M)
    assert [r[0] for r in rows] == list(real), out
    by_storage: dict[str, list[str]] = {}
    by_ptr: dict[int, list[str]] = {}
    for name, storage, shape, stride, offset, contiguous in rows:
        t = real[name]
        assert shape == str(tuple(t.shape)) and stride == str(t.stride()), (name, shape, stride)
        assert int(offset) == t.storage_offset() and (contiguous == "True") == t.is_contiguous(), name
        by_storage.setdefault(storage, []).append(name)
        by_ptr.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    assert partition(by_storage.values()) == partition(by_ptr.values())


class _Log(TorchDispatchMode):
    """Every aten op with whether its schema makes it a view or a write, and the storage of its first argument."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool, bool, int | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        ptr = first.untyped_storage().data_ptr() if first is not None else None
        self.ops.append((str(func), func.is_view, func._schema.is_mutable, ptr))
        return out


def test_view_and_write_edges_are_the_ops_pytorch_dispatches(nb) -> None:
    fn = notebook_function(nb)
    with _Log() as log:
        real = fn("cpu")
    x_ptr = real["x"].untyped_storage().data_ptr()
    views = [op for op, is_view, _, ptr in log.ops if is_view and ptr == x_ptr]
    writes = [op for op, _, mutable, ptr in log.ops if mutable and ptr == x_ptr]
    out = text(cell(nb, "nodes, edges = trace.alias_graph"))
    edges = re.findall(r"^\s*t\d+\s+[ts]\d+\s+(view|write)\s+(\S+)\s+\d+\s*$", out, re.M)
    assert [op for kind, op in edges if kind == "view"] == views, out
    assert [op for kind, op in edges if kind == "write"] == writes, out
    assert len(views) == 4 and len(writes) == 2


def test_inplace_write_into_a_leaf_view_fails_as_in_real_pytorch(nb) -> None:
    c = cell(nb, 'with fv.fake_mode(device="cuda:0"):\n    layer')
    layer = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError) as real:
        layer.weight[0].add_(1.0)
    assert f"RuntimeError: {real.value}" in errors(c)


@pytest.fixture(scope="module")
def real_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config())  # transformers' defaults are GPT-2 small: 0.5 GB of real float32


def test_gpt2_parameter_counts(nb, real_gpt2) -> None:
    cfg = real_gpt2.config
    out = text(cell(nb, "published = models.catalog()"))

    def figure(label: str) -> int:
        m = re.search(rf"^{re.escape(label)}\s+([\d,]+)$", out, re.M)
        assert m, (label, out)
        return int(m[1].replace(",", ""))

    assert figure("published (Hugging Face):") == GPT2_PUBLISHED
    assert figure("counted once (trace.modules):") == GPT2_PUBLISHED
    assert figure("model.parameters():") == GPT2_PUBLISHED
    twice = GPT2_PUBLISHED + cfg.vocab_size * cfg.n_embd  # the tied matrix met twice
    assert figure("per-module sum (torchinfo-style):") == twice
    assert figure("state_dict() sum:") == twice
    # the real model agrees: unique storages add up to the published total, the naive sums do not
    unique = {p.untyped_storage().data_ptr(): p.numel() for p in real_gpt2.parameters()}
    assert sum(unique.values()) == GPT2_PUBLISHED
    assert sum(v.numel() for v in real_gpt2.state_dict().values()) == twice


def test_gpt2_storages_against_a_real_cpu_gpt2(nb, real_gpt2) -> None:
    cfg = real_gpt2.config
    out = text(cell(nb, "gst = gpt2.storages"))
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in real_gpt2.parameters()}
    leaves = len({id(p) for p in real_gpt2.parameters()})  # one .grad per leaf tensor
    alive = re.search(r"Parameter storages alive: (\d+) \(([\d,]+) bytes\)", out)
    grads = re.search(r"Gradient storages:\s+(\d+) \(([\d,]+) bytes\)", out)
    dropped = re.search(r"made and dropped while building: (\d+) \(([\d,]+) bytes\)", out)
    assert alive and grads and dropped, out
    assert (int(alive[1]), int(alive[2].replace(",", ""))) == (len(storages), sum(storages.values()))
    assert sum(storages.values()) == 4 * GPT2_PUBLISHED
    assert (int(grads[1]), int(grads[2].replace(",", ""))) == (leaves, sum(storages.values()))
    # lm_head's own weight, made by nn.Linear and replaced by the tie
    untied = torch.nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False).weight
    assert (int(dropped[1]), int(dropped[2].replace(",", ""))) == (1, untied.untyped_storage().nbytes())


def test_tied_names_are_the_names_sharing_a_real_storage(nb, real_gpt2) -> None:
    by_ptr: dict[int, list[str]] = {}
    for name, p in real_gpt2.named_parameters(remove_duplicate=False):
        by_ptr.setdefault(p.untyped_storage().data_ptr(), []).append(name)
    shared = [set(names) for names in by_ptr.values() if len(names) > 1]
    assert shared == [{"transformer.wte.weight", "lm_head.weight"}]
    out = text(cell(nb, 'nodes, edges = gpt2.alias_graph(around="lm_head.weight")'))
    tied = re.findall(r"^\s*n:GPT2LMHeadModel\.(\S+)\s+(t\d+)\s+tied\b", out, re.M)
    assert {name for name, _ in tied} == shared[0] and len({dst for _, dst in tied}) == 1, out
    # the layer tree: lm_head and wte each hold the vocab x width matrix, the root counts it once
    cfg = real_gpt2.config
    mods = text(cell(nb, 'gpt2.modules.query("tied")'))
    rows = dict(re.findall(r"^\s*\d+\s+GPT2LMHeadModel(\S*)\s+(\d+)\s", mods, re.M))
    assert rows == {
        ".transformer": str(GPT2_PUBLISHED),
        ".transformer.wte": str(cfg.vocab_size * cfg.n_embd),
        ".lm_head": str(cfg.vocab_size * cfg.n_embd),
    }, mods
