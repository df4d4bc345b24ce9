"""Tutorial 06 (fake export): every node the notebook shows has the shape and dtype a real CPU run gives, and the
device its placement implies.

The notebook's own classes (``MLP``, ``Forgot``, ``Block``) are taken from its cells and run here on real CPU
tensors: ``torch.export.export`` for the exported graph, ``torch.fx.Interpreter`` for the FX graphs (every node's
value kept alive, so storage sharing is ``untyped_storage().data_ptr()`` identity). The devices expected on the
hybrid placement (fc1 and the input on cuda:0, fc2 on the CPU) are derived from the real CPU graph by the rule a
real run on those devices follows: a placeholder is where its parameter's module (or the input) is, ``to`` makes
a tensor on its ``device`` argument, every other op's output is on its first tensor input's device.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import sympy
import torch
import torch.fx
import torch.nn.functional as F
from nbrun import cell, execute, text
from torch import nn

NB = "06_fake_export.ipynb"
PLACEMENT = {"fc1": "cuda:0", "fc2": "cpu", "x": "cuda:0"}  # the notebook's hybrid placement

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def notebook_classes(nb, start: str, stop: str | None = None) -> dict:
    """The classes a cell defines (its source up to ``stop``), executed here on real torch."""
    source = cell(nb, start).source
    if stop:
        source = source.split(stop)[0]
    namespace = {"torch": torch, "nn": nn, "F": F}
    if not start.startswith("class MLP"):
        namespace.update(notebook_classes(nb, "class MLP"))
    exec(compile(source, NB, "exec"), namespace)  # noqa: S102 - the notebook's own code
    return namespace


class _Table(HTMLParser):
    """The first HTML table of an output: header and rows of cell texts (pandas' ``to_html``)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self._done = False

    def handle_starttag(self, tag, attrs):
        if self._done:
            return
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and not self._done:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._done = True

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def frame(c) -> list[dict[str, str]]:
    """The DataFrame a cell displays, as one dict per row (column -> text)."""
    html = next(o["data"]["text/html"] for o in c.outputs if "text/html" in o.get("data", {}))
    parser = _Table()
    parser.feed(html)
    header, *rows = [r for r in parser.rows if r]
    header = header[1:] if header[0] == "" else header  # the index column's empty heading
    return [dict(zip(header, r[1:])) for r in rows]


def dims(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def expected_devices(program: torch.export.ExportedProgram) -> dict[str, str]:
    """Each node's device on the hybrid placement, derived from the real CPU program (module docstring)."""
    specs = {s.arg.name: s for s in program.graph_signature.input_specs}
    devices: dict[str, str] = {}
    for node in program.graph.nodes:
        if node.op == "placeholder":
            spec = specs[node.name]
            devices[node.name] = PLACEMENT[spec.target.split(".")[0] if spec.target else "x"]
        elif node.op == "call_function" and isinstance(node.meta.get("val"), torch.Tensor):
            if node.target == torch.ops.aten.to.dtype_layout:
                devices[node.name] = str(node.kwargs["device"])
            else:
                first = next(a for a in node.args if isinstance(a, torch.fx.Node))
                devices[node.name] = devices[first.name]
        else:
            devices[node.name] = ""  # no tensor: the metadata assert, the output
    return devices


def real_export(nb, batch: int = 8, dynamic: bool = False) -> torch.export.ExportedProgram:
    mlp = notebook_classes(nb, "class MLP")["MLP"]
    torch.manual_seed(0)
    shapes = {"x": {0: torch.export.Dim("batch")}} if dynamic else None
    return torch.export.export(mlp(), (torch.randn(batch, 64),), dynamic_shapes=shapes)


def test_exported_nodes_equal_a_real_cpu_export(nb) -> None:
    program = real_export(nb)
    devices = expected_devices(program)
    kinds = {"USER_INPUT": "input", "PARAMETER": "parameter"}
    specs = {s.arg.name: kinds[s.kind.name] for s in program.graph_signature.input_specs}
    rows = frame(cell(nb, 'check.nodes[["name", "target", "kind"'))
    assert [r["name"] for r in rows] == [n.name for n in program.graph.nodes]
    for row, node in zip(rows, program.graph.nodes):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert row["shape"] == dims(val.shape) and row["dtype"] == str(val.dtype).removeprefix("torch."), row
            assert int(row["bytes"]) == val.numel() * val.element_size(), row
        else:
            assert row["shape"] == "" and row["dtype"] == "" and row["bytes"] == "-1", row
        assert row["device"] == devices[node.name], row
        kind = specs.get(node.name, "output" if node.op == "output" else "op")
        assert row["kind"] == kind, row
    # the transfer: a cuda:0 tensor in, a cpu tensor out
    assert devices["to"] == "cpu" and devices["gelu"] == "cuda:0"


def test_nodes_per_device(nb) -> None:
    devices = expected_devices(real_export(nb))
    out = text(cell(nb, "per_device = "))
    got = {
        dev: (int(n), names.split(", "))
        for dev, n, names in re.findall(r"^(\(no tensor\)|\S+)\s+(\d+) nodes: (.*)$", out, re.M)
    }
    want: dict[str, list[str]] = {}
    for name, dev in devices.items():
        want.setdefault(dev or "(no tensor)", []).append(name)
    assert got == {dev: (len(names), names) for dev, names in want.items()}, out
    assert got["cuda:0"][0] == 5 and got["cpu"][0] == 4  # fc1's two weights, x, linear, gelu | fc2's, to, linear_1


def test_three_placements(nb) -> None:
    program = real_export(nb)
    n_nodes = len(program.graph.nodes)
    n_ops = sum(n.op == "call_function" for n in program.graph.nodes)
    out = text(cell(nb, "for fc1_device, fc2_device in"))
    lines = re.findall(r"^fc1 on (\S+)\s*, fc2 on (\S+)\s*: <fakeviz\.ExportCheck ok: (\d+) nodes, (\d+) ops on (.*)>$",
                       out, re.M)  # fmt: skip
    assert len(lines) == 3, out
    for fc1, fc2, nodes, ops, on in lines:
        assert (int(nodes), int(ops)) == (n_nodes, n_ops)
        assert on.split(", ") == list(dict.fromkeys([fc1, fc2]))


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_recorded_ops_and_weight_bytes(nb) -> None:
    mlp = notebook_classes(nb, "class MLP")["MLP"]()
    x = torch.randn(8, 64)
    with _Ops() as log:
        mlp(x)  # eager on one device: the same aten ops, without the transfer
    out = text(cell(nb, "print(check.trace.oplog())"))
    logged = re.findall(r"^\$\d+: \w+\[[^\]]*\] (\S+) = (aten\.\S+)\(", out, re.M)
    assert [op for _, op in logged if op != "aten._to_copy.default"] == log.ops, out
    assert [dev for dev, op in logged if op == "aten._to_copy.default"] == ["cpu"]
    for module in ("fc1", "fc2"):
        got = re.search(rf"^{PLACEMENT[module]}\s+Parameter\s+(\d+)$", out, re.M)
        params = getattr(mlp, module).parameters()
        assert got and int(got[1]) == sum(p.numel() * p.element_size() for p in params), (module, out)


def test_forgotten_transfer_fails_as_a_device_mismatch(nb) -> None:
    ns = notebook_classes(nb, "class Forgot", stop="\nwith fv.fake_mode")
    torch.export.export(ns["Forgot"](), (torch.randn(8, 64),))  # on one device the same code exports fine
    out = text(cell(nb, "class Forgot"))
    assert "<fakeviz.ExportCheck failed (device mismatch)>" in out
    assert "different devices: cuda:0 and cpu" in out
    assert "return self.fc2(F.gelu(self.fc1(x)))" in out  # the notebook's own line


def symbolic_bytes(expr: str, batch: int) -> int:
    return int(sympy.sympify(expr).subs({s: batch for s in sympy.sympify(expr).free_symbols}))


def test_symbolic_batch_bytes_hold_for_other_batches(nb) -> None:
    rows = frame(cell(nb, 'batch = torch.export.Dim("batch")'))
    for batch in (3, 8, 17):
        program = real_export(nb, batch=batch)
        real = {n.name: n.meta.get("val") for n in program.graph.nodes}
        for row in rows:
            val = real[row["name"]]
            if not isinstance(val, torch.Tensor):
                continue
            assert symbolic_bytes(row["bytes_expr"], batch) == val.numel() * val.element_size(), (row, batch)
            if batch == 8:
                assert int(row["bytes_hint"]) == val.numel() * val.element_size()
    symbolic = [r for r in rows if re.search(r"[su]\d+", r["bytes_expr"])]
    assert {r["name"] for r in symbolic} == {"x", "linear", "gelu", "to", "linear_1"}
    assert all(r["bytes"] == "-1" for r in symbolic)


class _Keep(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict = {}

    def run_node(self, n):
        self.values[n.name] = out = super().run_node(n)
        return out


def real_fx(nb, batch: int):
    ns = notebook_classes(nb, "class Block", stop="\ngm = ")
    torch.manual_seed(0)
    run = _Keep(torch.fx.symbolic_trace(ns["Block"]()))
    run.run(torch.randn(batch, 16))
    return run.values


def test_fx_prop_equals_a_real_run_node_by_node(nb) -> None:
    real = real_fx(nb, 8)
    rows = frame(cell(nb, "table = fv.prop(gm"))
    assert [r["name"] for r in rows] == list(real)
    ptr: dict[str, int] = {}
    for row in rows:
        val = real[row["name"]]
        if isinstance(val, torch.Tensor):
            assert (row["shape"], row["stride"]) == (dims(val.shape), dims(val.stride())), row
            assert (row["dtype"], row["device"]) == (str(val.dtype).removeprefix("torch."), "cpu"), row
            assert int(row["bytes"]) == val.numel() * val.element_size(), row
            ptr[row["name"]] = val.untyped_storage().data_ptr()
        else:
            assert row["dtype"] == type(val).__name__ and row["storage"] == "-1", row
    for row in rows:  # storage sharing: the same partition as the real run's addresses
        if row["name"] in ptr:
            shared = {n for n, p in ptr.items() if p == ptr[row["name"]] and n != row["name"]}
            assert set(re.findall(r"\w+", row["shares_with"])) == shared, row
    assert {r["storage"] for r in rows if r["name"] in ("norm", "view", "transpose")} == {rows[5]["storage"]}


def test_fx_symbolic_bytes_hold_for_other_batches(nb) -> None:
    c = cell(nb, "sym = fv.prop(gm")
    rows = frame(c)
    symbol = re.search(r"^(s\d+) = x\.size\(\)\[0\] \(= 8 in the example input\)$", text(c), re.M)
    assert symbol, text(c)
    for batch in (3, 13):
        real = real_fx(nb, batch)
        for row in rows:
            val = real[row["name"]]
            if isinstance(val, torch.Tensor):
                assert row["shape"].startswith(f"[{symbol[1]}"), row
                assert symbolic_bytes(row["bytes_expr"], batch) == val.numel() * val.element_size(), (row, batch)


def test_fx_devices_follow_the_hybrid_placement(nb) -> None:
    mlp = notebook_classes(nb, "class MLP")["MLP"]
    gm = torch.fx.symbolic_trace(mlp())
    run = _Keep(gm)
    run.run(torch.randn(8, 64))
    devices: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            devices[node.name] = PLACEMENT["x"]
        elif node.op in ("call_module", "get_attr"):
            devices[node.name] = PLACEMENT[str(node.target).split(".")[0]]
        elif node.op == "call_method" and node.target == "to":
            devices[node.name] = devices[node.args[1].args[0].name]  # h.to(<fc2.weight>.device)
        elif isinstance(run.values[node.name], torch.Tensor):
            devices[node.name] = devices[next(a for a in node.args if isinstance(a, torch.fx.Node)).name]
        else:
            devices[node.name] = ""
    rows = frame(cell(nb, "hybrid_fx = torch.fx.symbolic_trace(model)"))
    assert [r["name"] for r in rows] == list(devices)
    for row in rows:
        val = run.values[row["name"]]
        assert row["device"] == devices[row["name"]], row
        if isinstance(val, torch.Tensor):
            assert row["shape"] == dims(val.shape) and row["dtype"] == "float32", row
    assert [devices[n] for n in ("fc1", "to", "fc2")] == ["cuda:0", "cpu", "cpu"]
