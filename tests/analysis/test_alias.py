"""Aliasing: the tensor table, aliases() queries and the bounded alias graph."""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv


def _run():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied
    m = torch.nn.Sequential(emb, head)
    x = torch.zeros(3, 4)
    v = x[1:]
    v.add_(1)
    w = v.view(8)
    m(torch.tensor([[1, 2]]))
    return x, v, w


@pytest.fixture(params=[False, True], ids=["real", "fake"])
def traced(request):
    with fv.record(fake=request.param) as trace:
        x, v, w = _run()
    return trace, x, v, w


def test_view_chain_and_inplace_write(traced):
    trace, x, v, w = traced
    al = trace.aliases(w)  # a recorded tensor object
    assert list(al.op) == ["aten.zeros.default", "aten.slice.Tensor", "aten.view.default"]
    tid = {t: i for i, t in enumerate(al.tensor)}
    # base chain: w views v views x
    assert al.base.iloc[1] == al.tensor.iloc[0] and al.base.iloc[2] == al.tensor.iloc[1]
    assert al.writes.iloc[1] == 1 and al.writes.iloc[0] == 0  # add_ wrote through the slice
    assert al.storage.nunique() == 1 and list(al.storage_offset) == [0, 4, 4]
    assert tid
    nodes, edges = trace.alias_graph(around=w)
    writes = edges[edges.kind == "write"]
    assert list(writes.op) == ["aten.add_.Tensor"]
    views = edges[edges.kind == "view"]
    assert list(views.op) == ["aten.slice.Tensor", "aten.view.default"]
    assert set(nodes.kind) == {"storage", "tensor"}


def test_tied_parameters(traced):
    trace, *_ = traced
    by_suffix = trace.aliases("1.weight")
    named = by_suffix[by_suffix.names != ""]
    assert list(named.names) == ["Sequential.0.weight|Sequential.1.weight"]
    assert trace.aliases("Sequential.0.weight").equals(by_suffix)
    nodes, edges = trace.alias_graph(around="0.weight")
    tied = edges[edges.kind == "tied"]
    assert set(tied.src) == {"n:Sequential.0.weight", "n:Sequential.1.weight"} and tied.dst.nunique() == 1
    # the transposed weight used by the head's matmul is a view of the tied tensor
    assert "aten.t.default" in set(edges[edges.kind == "view"].op)


def test_bad_queries():
    with fv.record() as trace:
        _run()
    with pytest.raises(KeyError, match="no parameter or buffer named 'nope'"):
        trace.aliases("nope")
    with pytest.raises(TypeError, match="tensor id"):
        trace.aliases(3.5)


def test_graph_is_bounded_on_a_big_run():
    import zoo

    with fv.record() as trace:
        zoo.run("llama")
    assert len(trace.tensors) > 500
    nodes, edges = trace.alias_graph(max_nodes=120)
    assert len(nodes) <= 120
    assert set(edges.src) | set(edges.dst) <= set(nodes.id)
    # parameters (named tensors) are kept first
    assert (nodes.kind == "name").any()


@pytest.mark.parametrize("name", ["gpt2_tied", "views_inplace", "t5"])
def test_tensor_table_fake_equals_real(name):
    import gc

    import zoo

    tables = []
    for fake in (False, True):
        gc.collect()
        with fv.record(fake=fake) as trace:
            zoo.run(name)
        tables.append(trace.tensors)
    assert tables[0].equals(tables[1])
