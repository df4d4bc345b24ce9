"""``fakeviz.prop``: FakeTensorProp over a user's FX graph, checked against a real CPU run of the same graph.

The real run goes through ``torch.fx.Interpreter`` and keeps every node's output alive, so no storage is
freed and reused during it: two nodes share a storage in the real run exactly when their tensors'
``untyped_storage().data_ptr()`` agree.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
from torch import nn

import fakeviz as fv
from fakeviz._engine.fx import hint_of
from fakeviz._fx import PropValues, prop


class Zoo(nn.Module):
    """Views, a multi-output op, an in-place op, a no-op contiguous, dtype changes, an expanded view."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)
        self.register_buffer("scale", torch.full((8,), 2.0))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> Any:
        h = self.fc1(x).relu()
        h.add_(1.0)  # in place: the same storage as relu's output
        ht = h.transpose(0, 1)  # a view
        a, b = torch.chunk(h, 2, dim=1)  # a node with two outputs, both views of h
        y = self.fc2(ht.t().contiguous()) * self.scale  # contiguous() of a contiguous tensor is itself
        flat = y.reshape(-1)  # a view
        idx = y.argmax(dim=-1)  # int64
        half = b.half()  # a new float16 storage
        z = torch.cat([a, half.float()], dim=0)
        e = mask.unsqueeze(-1).expand(-1, 8)  # stride 0
        return flat, idx, z, e, x.size(0)


def inputs(batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(batch, 16), torch.rand(batch) > 0.5


class RealRun(torch.fx.Interpreter):
    """Runs the graph on real tensors and keeps every node's output (alive: no address is reused)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def real_run(gm: torch.fx.GraphModule, *args: Any) -> dict[str, Any]:
    run = RealRun(gm)
    run.run(*args)
    return run.values


def flat(val: Any) -> list[Any]:
    if isinstance(val, (list, tuple)):
        return [x for v in val for x in flat(v)]
    return [val]


def dims(xs: Any) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def real_storages(val: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in flat(val) if isinstance(t, torch.Tensor) and t.numel()}


def check_against_real(df: Any, real: dict[str, Any]) -> None:
    """Every node's shape, dtype, device, stride, bytes and storage sharing equal the real run's."""
    assert list(df.name) == list(real), "one row per node, in graph order"
    values = df.attrs["values"]
    rows = df.set_index("name")
    for name, rv in real.items():
        row = rows.loc[name]
        fake = values[name]
        if isinstance(rv, torch.Tensor):
            assert row["shape"] == dims(rv.shape), name
            assert row["stride"] == dims(rv.stride()), name
            assert row["dtype"] == str(rv.dtype).removeprefix("torch."), name
            assert row["device"] == "cpu", name
            assert row["bytes"] == rv.numel() * rv.element_size(), name
            assert row["storage"] >= 0, name
        elif isinstance(rv, (list, tuple)):
            fakes, reals = flat(fake), flat(rv)
            assert len(fakes) == len(reals), name
            for f, r in zip(fakes, reals):
                if isinstance(r, torch.Tensor):
                    assert (tuple(f.shape), f.stride(), f.dtype) == (tuple(r.shape), r.stride(), r.dtype), name
                else:
                    assert f == r, name
            assert row["bytes"] == sum(r.numel() * r.element_size() for r in reals if isinstance(r, torch.Tensor))
            assert row["storage"] == -1, name
        else:
            assert row["value"] == ("" if rv is None else str(rv)), name
    # storage sharing: the same partition of the nodes as the real run's
    for n1, v1 in real.items():
        expected = {n2 for n2, v2 in real.items() if n2 != n1 and real_storages(v1) & real_storages(v2)}
        assert set(rows.at[n1, "shares_with"]) == expected, n1
    single = {n: rows.at[n, "storage"] for n, v in real.items() if isinstance(v, torch.Tensor) and v.numel()}
    for n1 in single:
        for n2 in single:
            same_real = real[n1].untyped_storage().data_ptr() == real[n2].untyped_storage().data_ptr()
            assert (single[n1] == single[n2]) == same_real, (n1, n2)


def no_fake_mode_active() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None and not fv.is_fake(torch.empty(1))


def test_symbolic_trace_graph_equals_real_run() -> None:
    gm = torch.fx.symbolic_trace(Zoo())
    x, mask = inputs()
    df = prop(gm, x, mask)
    check_against_real(df, real_run(gm, x, mask))
    rows = df.set_index("name")
    # what the test model is about: views and the in-place op share, contiguous() of a contiguous tensor too
    shared = set(rows.at["relu", "shares_with"])
    assert {"add_", "transpose", "chunk", "getitem", "getitem_1", "t", "contiguous"} <= shared
    assert rows.at["expand", "stride"] == "[1, 0]"
    assert rows.at["half", "dtype"] == "float16" and rows.at["argmax", "dtype"] == "int64"
    assert rows.at["fc1", "target"] == "fc1 (Linear)" and rows.at["chunk", "target"] == "torch.chunk"
    assert rows.at["size", "value"] == "8"
    assert no_fake_mode_active()


def test_export_graph_module_equals_real_run() -> None:
    x, mask = inputs()
    ep = torch.export.export(Zoo(), (x, mask))
    gm = ep.module()
    before = {n.name: n.meta.get("val") for n in gm.graph.nodes}
    df = prop(gm, x, mask)
    check_against_real(df, real_run(gm, x, mask))
    assert {n.name: n.meta.get("val") for n in gm.graph.nodes} == before, "the user's graph is not modified"
    # export records stack traces: the user's line, not torch's
    lines = df.set_index("name").user_line
    linear = df[df.target == "aten.linear.default"].name.iloc[0]
    assert re.search(r"test_fx_prop\.py:\d+ in forward$", lines[linear]), lines[linear]
    # an ExportedProgram is propagated through its .module()
    same = prop(ep, x, mask)
    assert list(same.shape) == list(df.shape) and list(same.storage) == list(df.storage)


def test_export_lifted_graph_module_equals_real_run() -> None:
    x, mask = inputs()
    ep = torch.export.export(Zoo(), (x, mask))
    user = iter((x, mask))
    args = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
            args.append(next(user))
        else:
            args.append(ep.state_dict[spec.target])
    df = prop(ep.graph_module, *args)
    check_against_real(df, real_run(ep.graph_module, *args))
    assert (df.op == "placeholder").sum() == len(args)


def test_dynamo_graph_equals_real_run() -> None:
    captured = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    x, mask = inputs()
    torch.compile(Zoo(), backend=backend, dynamic=False, fullgraph=True)(x, mask)
    gm, example = captured[0]
    df = prop(gm, *example)
    check_against_real(df, real_run(gm, *example))
    assert no_fake_mode_active()


def test_symbolic_batch() -> None:
    gm = torch.fx.symbolic_trace(Zoo())
    x, mask = inputs(8)
    df = prop(gm, x, mask, symbolic=True)
    rows = df.set_index("name")
    batch = re.fullmatch(r"\[(s\d+), 16\]", rows.at["x", "shape"])
    assert batch, rows.at["x", "shape"]  # 16 is forced by fc1: Eq(s.., 16) is a guard
    s = batch.group(1)
    assert rows.at["fc1", "shape"] == f"[{s}, 32]"
    assert rows.at["transpose", "shape"] == f"[32, {s}]" and rows.at["transpose", "stride"] == "[1, 32]"
    assert rows.at["x", "bytes"] == -1 and rows.at["x", "bytes_expr"] == f"64*{s}" and rows.at["x", "bytes_hint"] == 512
    assert rows.at["size", "value"] == s
    values = df.attrs["values"]
    assert values.symbols()[s] == ("x.size()[0]", 8)
    assert any("16" in g for g in df.attrs["guards"])
    # every size is the real run's at the example sizes, every byte count's hint the real bytes
    real = real_run(gm, x, mask)
    for name, rv in real.items():
        for f, r in zip(flat(values[name]), flat(rv)):
            if isinstance(r, torch.Tensor):
                assert [hint_of(values.shape_env, d) for d in f.shape] == list(r.shape), name
                assert [hint_of(values.shape_env, d) for d in f.stride()] == list(r.stride()), name
        if isinstance(rv, torch.Tensor):
            assert rows.at[name, "bytes_hint"] == rv.numel() * rv.element_size(), name
    # the same storage partition as without symbols
    static = prop(gm, x, mask).set_index("name")
    assert list(rows.storage) == list(static.storage)
    assert no_fake_mode_active()


def test_symbolic_only_the_named_dims() -> None:
    gm = torch.fx.symbolic_trace(Zoo())
    x, mask = inputs(8)
    rows = prop(gm, x, mask, symbolic=True, dynamic={"x": 0}).set_index("name")
    assert re.fullmatch(r"\[s\d+, 16\]", rows.at["x", "shape"])
    assert rows.at["mask", "shape"] == "[8]"  # not named: static
    # sizes 0 and 1 stay concrete, as PyTorch specializes them
    x1, mask1 = inputs(1)
    rows = prop(gm, x1, mask1, symbolic=True).set_index("name")
    assert rows.at["x", "shape"] == "[1, 16]" and rows.at["x", "bytes"] == 64
    with pytest.raises(ValueError, match="symbolic=True"):
        prop(gm, x, mask, dynamic={"x": 0})


def test_export_with_a_dynamic_batch() -> None:
    x, mask = inputs(8)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(Zoo(), (x, mask), dynamic_shapes={"x": {0: batch}, "mask": {0: batch}})
    rows = prop(ep, x, mask, symbolic=True).set_index("name")
    s = re.fullmatch(r"\[(s\d+), 16\]", rows.at["x", "shape"]).group(1)
    assert rows.at["mask", "shape"] == f"[{s}]"  # the program says the two batches are one
    # exported without dynamic shapes, the program's guards pin the batch
    ep_static = torch.export.export(Zoo(), (x, mask))
    rows = prop(ep_static, x, mask, symbolic=True).set_index("name")
    assert rows.at["x", "shape"] == "[8, 16]"


def select(x: torch.Tensor) -> Any:
    idx = torch.nonzero(x)
    pos = x[x > 0]
    return idx, pos * 2


def test_unbacked_sizes() -> None:
    gm = torch.fx.symbolic_trace(select)
    x = torch.randn(4, 5)
    rows = prop(gm, x, symbolic=True).set_index("name")
    u = re.fullmatch(r"\[(u\d+), 2\]", rows.at["nonzero", "shape"])
    assert u, rows.at["nonzero", "shape"]
    assert rows.at["nonzero", "bytes"] == -1 and rows.at["nonzero", "bytes_hint"] == -1
    assert rows.at["nonzero", "bytes_expr"] == f"16*{u.group(1)}"
    v = re.fullmatch(r"\[(u\d+)\]", rows.at["mul", "shape"])
    assert v and v.group(1) != u.group(1)
    symbols = prop(gm, x, symbolic=True).attrs["values"].symbols()
    assert symbols["u0"] == ("nonzero", None)

    def item(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.long().sum().item())

    rows = prop(torch.fx.symbolic_trace(item), torch.ones(3), symbolic=True).set_index("name")
    u = rows.at["item", "value"]
    assert re.fullmatch(r"u\d+", u) and rows.at["zeros", "shape"] == f"[{u}]"
    assert no_fake_mode_active()


def test_data_dependent_error_names_the_node() -> None:
    gm = torch.fx.symbolic_trace(select)
    with pytest.raises(fv.DataDependentError) as info:
        prop(gm, torch.randn(4, 5))
    msg = str(info.value)
    assert msg.startswith("node nonzero = torch.nonzero(x)"), msg
    assert "symbolic=True" in msg
    assert info.value.op == "torch.nonzero"
    assert no_fake_mode_active()
    assert all("val" not in n.meta for n in gm.graph.nodes)

    class Select(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nonzero(x)

    ep = torch.export.export(Select(), (torch.randn(4, 5),))
    with pytest.raises(fv.DataDependentError) as info:
        prop(ep, torch.randn(4, 5))
    first = str(info.value).splitlines()
    assert re.match(r".*test_fx_prop\.py:\d+ in forward: node nonzero", first[0]), first[0]  # the user's line first
    assert first[1].strip() == "return torch.nonzero(x)"
    assert no_fake_mode_active()


def test_fake_inputs_are_used_as_they_are() -> None:
    with fv.fake_mode(device="cuda:0"):
        model = Zoo()
        x, mask = torch.randn(8, 16), torch.ones(8, dtype=torch.bool)
    gm = torch.fx.symbolic_trace(model)
    df = prop(gm, x, mask)
    assert set(df[df.device != ""].device) == {"cuda:0"}
    real = prop(torch.fx.symbolic_trace(Zoo()), *inputs(8))
    assert list(df.shape) == list(real.shape) and list(df.bytes) == list(real.bytes)
    assert df.attrs["values"]["x"] is not x and df.attrs["values"].fake_mode is x.fake_mode
    with pytest.raises(fv.FakeVizError, match="symbolic=True"):
        prop(gm, x, mask, symbolic=True)  # a fake mode without a ShapeEnv
    with fv.fake_mode(device="cuda:0", symbolic=True):
        model = Zoo()
        x, mask = torch.randn(8, 16), torch.ones(8, dtype=torch.bool)
    rows = prop(torch.fx.symbolic_trace(model), x, mask, symbolic=True, dynamic={"x": 0}).set_index("name")
    assert re.fullmatch(r"\[s\d+, 16\]", rows.at["x", "shape"]) and rows.at["x", "device"] == "cuda:0"
    assert no_fake_mode_active()


def test_aliased_inputs_share_a_storage() -> None:
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        return a + b, a.view(-1), c

    gm = torch.fx.symbolic_trace(f)
    base = torch.randn(6, 4)
    args = (base[:3], base[3:], torch.randn(3, 4))
    df = prop(gm, *args)
    check_against_real(df, real_run(gm, *args))
    rows = df.set_index("name")
    assert rows.at["a", "storage"] == rows.at["b", "storage"] != rows.at["c", "storage"]


def test_values_travel_with_the_table() -> None:
    gm = torch.fx.symbolic_trace(Zoo())
    df = prop(gm, *inputs())
    values = df.attrs["values"]
    assert isinstance(values, PropValues) and len(values) == len(df)
    assert fv.is_fake(values["relu"]) and values["relu"].shape == (8, 32)
    sub = df[df.op == "call_function"].copy()
    assert sub.attrs["values"] is values  # pandas deep-copies attrs; the values are shared, never copied
    out = values.output
    assert isinstance(out, tuple) and out[0].shape == (64,) and out[4] == 8
    assert df.attrs["symbolic"] is False and df.attrs["guards"] == []


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="symbolic_trace"):
        prop(Zoo(), *inputs())
    with pytest.raises(TypeError, match="takes 2 inputs, got 1"):
        prop(torch.fx.symbolic_trace(Zoo()), torch.randn(8, 16))


def test_public_name() -> None:
    assert fv.prop is prop
    assert "prop" in fv.__all__


def test_example_fx_symbolic_batch() -> None:
    """``examples/fx_symbolic_batch.py`` runs and shows a symbolic batch, unbacked sizes and the error."""
    script = Path(__file__).resolve().parents[2] / "examples" / "fx_symbolic_batch.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True).stdout
    s = re.search(r"symbol (s\d+): x\.size\(\)\[0\] \(= 8 in the example input\)", out)
    assert s, out
    s = s.group(1)
    assert re.search(rf"transpose\s+call_method\s+transpose\s+\[{s}, 4, 4\]\s+\[16, 1, 4\]\s+64\*{s}\s+512", out)
    assert re.search(r"nonzero\s+call_function\s+torch\.nonzero\s+\[u0, 2\]", out), out
    assert "without symbolic=True: node nonzero = torch.nonzero(x) needs the values of a tensor" in out
