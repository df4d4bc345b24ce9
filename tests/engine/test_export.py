"""``check_export``: torch.export on fake tensors (cpu, fake cuda and the hybrid placement), and failures explained.

The fake exports are compared node by node with ``torch.export`` of the same model on real CPU tensors;
failures are checked for what ``.reason`` says (the user's line of this file, what to change) and for what
is left behind (no fake mode active, the partial trace kept).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fakeviz as fv
from fakeviz._analysis.export_nodes import NODE_COLUMNS, export_nodes
from fakeviz._engine.export import export_program
from fakeviz._export import ExportCheck, check_export

REPO = Path(__file__).resolve().parents[2]
THIS = str(Path(__file__).resolve())
FAKE_CUDA = fv.fake_cuda_status().cuda_ok
needs_fake_cuda = pytest.mark.skipif(
    not FAKE_CUDA, reason="no fake cuda in this process (no C++ compiler for the shim)"
)
COMPARED = [
    "name", "op", "target", "kind", "shape", "dtype", "stride", "device", "bytes", "bytes_expr", "bytes_hint",
    "storage", "shares_with", "value", "module",
]  # fmt: skip
PLACEMENTS = {"cpu": ("cpu", "cpu"), "cuda": ("cuda:0", "cuda:0"), "hybrid": ("cuda:0", "cpu")}


class HybridMLP(nn.Module):
    """The issue's model: fc1 (on cuda in the hybrid placement), GELU, a transfer, fc2 (on cpu)."""

    def __init__(self, d_in: int = 12, d_hidden: int = 32, d_out: int = 5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = h.to(self.fc2.weight.device)  # the transfer
        return self.fc2(h)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if h.sum() > 0:  # <- data-dependent
            h = h * 2
        return h


class Misplaced(nn.Module):
    """fc1 on cuda:0, fc2 on cpu, and no transfer between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        return self.fc2(h)  # <- device mismatch


class Breaks(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        torch._dynamo.graph_break()  # <- graph break
        return x * 2


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return torch.cond(h.sum() > 0, lambda t: t * 2, lambda t: t - 1, (h,))


def line_of(marker: str) -> int:
    """The line number of the one line of this file holding ``marker``."""
    hits = [
        i for i, line in enumerate(Path(THIS).read_text().splitlines(), 1) if marker in line and "line_of" not in line
    ]
    assert len(hits) == 1, hits
    return hits[0]


def no_fake_mode_active() -> bool:
    return (
        torch._guards.detect_fake_mode() is None
        and torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
        and not fv.is_fake(torch.ones(1))
    )


def fake_hybrid(fc1: str, fc2: str, batch: int = 4) -> tuple[HybridMLP, torch.Tensor]:
    with fv.fake_mode():
        model = HybridMLP()
        model.fc1.to(fc1)
        model.fc2.to(fc2)
        x = torch.randn(batch, 12, device=fc1)
    return model, x


def reason_is_short_and_ours(check: ExportCheck) -> None:
    """At most 15 lines, and no frame of torch or fakeviz in it: only the user's line."""
    assert check.reason is not None
    lines = check.reason.splitlines()
    assert len(lines) <= 15, check.reason
    paths = re.findall(r"(/\S+\.py)", check.reason)
    assert paths and all(p == THIS for p in paths), paths
    assert "site-packages" not in check.reason and "fakeviz/_" not in check.reason


# ----------------------------------------------------------------- the hybrid MLP on cpu, cuda, both
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_hybrid_mlp_exports_with_a_device_per_node(placement: str) -> None:
    fc1, fc2 = PLACEMENTS[placement]
    if "cuda" in fc1 + fc2 and not FAKE_CUDA:
        pytest.skip("no fake cuda in this process")
    model, x = fake_hybrid(fc1, fc2)
    check = check_export(model, (x,))
    assert check.ok and check.error is None and check.reason is None, check.reason
    assert isinstance(check.program, torch.export.ExportedProgram)
    nodes = check.nodes.set_index("name")
    # one row per graph node, in graph order
    assert list(check.nodes["name"]) == [n.name for n in check.program.graph.nodes]
    assert (check.nodes["kind"] == "op").sum() == sum(n.op == "call_function" for n in check.program.graph.nodes)
    # fc1's parameters and ops on fc1's device, the transfer lands on fc2's, fc2's ops there
    assert nodes.loc["p_fc1_weight", "device"] == fc1 and nodes.loc["x", "device"] == fc1
    assert nodes.loc["p_fc2_weight", "device"] == fc2
    assert nodes.loc["linear", ["target", "device", "module"]].tolist() == ["aten.linear.default", fc1, "HybridMLP.fc1"]
    assert nodes.loc["gelu", "device"] == fc1
    assert nodes.loc["to", ["target", "device"]].tolist() == ["aten.to.dtype_layout", fc2]
    assert nodes.loc["linear_1", ["device", "module", "shape"]].tolist() == [fc2, "HybridMLP.fc2", "[4, 5]"]
    assert nodes.loc["linear", "user_line"].startswith(f"{THIS}:")
    # the export was recorded: the aten ops ran on the same devices, nothing failed
    trace = check.trace
    assert isinstance(trace, fv.Trace) and trace.error is None and not trace.recording
    ops = trace.ops
    assert set(ops["device"].dropna().astype(str)) == {fc1, fc2}
    assert ops.loc[ops["op"] == "aten.gelu.default", "device"].astype(str).tolist() == [fc1]
    assert ops.loc[ops["module"] == "HybridMLP.fc2", "device"].astype(str).unique().tolist() == [fc2]
    if fc1 != fc2:
        transfer = ops[ops["op"] == "aten._to_copy.default"]
        assert transfer["device"].astype(str).tolist() == [fc2]
    # the weights are in the record once (export's fakification hands back the copy's own tensors)
    params = trace.storages[trace.storages["category"] == "Parameter"]
    assert params["nbytes"].sum() == sum(p.numel() * 4 for p in model.parameters())
    assert no_fake_mode_active()


def test_fake_export_equals_the_real_export_node_by_node() -> None:
    torch.manual_seed(0)
    real = HybridMLP()
    x = torch.randn(4, 12)
    before = {k: v.clone() for k, v in real.state_dict().items()}
    expected = export_nodes(torch.export.export(real, (x,)))
    fake_model, fake_x = fake_hybrid("cpu", "cpu")
    for check in (check_export(fake_model, (fake_x,)), check_export(real, (x,))):
        assert check.ok, check.reason
        got = check.nodes
        assert got[COMPARED].equals(expected[COMPARED]), f"{got[COMPARED]}\n!=\n{expected[COMPARED]}"
    # the real model was not touched: same tensors, same values, not fake
    assert not fv.is_fake(real.fc1.weight)
    assert all(torch.equal(before[k], v) for k, v in real.state_dict().items())


@needs_fake_cuda
def test_strict_export_of_the_hybrid_mlp() -> None:
    model, x = fake_hybrid("cuda:0", "cpu")
    check = check_export(model, (x,), strict=True)
    assert check.ok and check.strict, check.reason
    nodes = check.nodes.set_index("name")
    assert nodes.loc[["linear", "gelu", "to", "linear_1"], "device"].tolist() == ["cuda:0", "cuda:0", "cpu", "cpu"]
    assert set(check.trace.ops["device"].dropna().astype(str)) == {"cuda:0", "cpu"}
    assert no_fake_mode_active()


# ----------------------------------------------------------------- meta and real models
class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("scale", torch.ones(10))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids)) * self.scale


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:1", marks=needs_fake_cuda)])
def test_a_meta_model_is_placed_on_the_device_asked(device: str) -> None:
    with torch.device("meta"):
        model = Plain()
    ids = torch.zeros(2, 3, dtype=torch.long, device="meta")
    check = check_export(model, (ids,), device=device)
    assert check.ok, check.reason
    tensors = check.nodes[(check.nodes["kind"] != "output") & (check.nodes["device"] != "")]  # "": no tensor
    assert set(tensors["device"]) == {device}
    assert check.nodes.set_index("name").loc["mul", "shape"] == "[2, 3, 10]"
    # the user's model is still meta; the exported copy is fake on `device`, its tie kept
    assert model.emb.weight.device.type == "meta" and not fv.is_fake(model.emb.weight)
    assert fv.is_fake(check.model.emb.weight) and check.model.emb.weight.device == torch.device(device)
    assert check.model.head.weight is check.model.emb.weight
    assert set(check.trace.ops["device"].dropna().astype(str)) == {device}


def test_a_meta_model_with_real_inputs() -> None:
    with torch.device("meta"):
        model = Plain()
    ids = torch.zeros(2, 3, dtype=torch.long)  # real, on cpu: only its shape and dtype are used
    check = check_export(model, (ids,))
    assert check.ok, check.reason
    assert set(check.nodes["device"]) - {""} == {"cpu"}
    if FAKE_CUDA:  # parameters on cuda:0, the input left on cpu
        check = check_export(model, (ids,), device="cuda:0")
        assert not check.ok and check.kind == "device mismatch" and "cuda:0 and cpu" in check.reason


# ----------------------------------------------------------------- failures, explained
@pytest.mark.parametrize("strict", [False, True])
def test_a_data_dependent_branch_names_the_user_line_and_what_to_change(strict: bool) -> None:
    with fv.fake_mode():
        model, x = Branchy(), torch.randn(4, 12)
    check = check_export(model, (x,), strict=strict)
    assert not check.ok and check.program is None and check.kind == "data-dependent"
    line = line_of("# <- data-dependent")
    assert check.user_line == f"{THIS}:{line} in forward"
    assert f"{THIS}:{line} in forward" in check.reason and "if h.sum() > 0:" in check.reason
    assert "torch.cond" in check.reason and "torch._check" in check.reason
    reason_is_short_and_ours(check)
    # torch's own exception is kept, with its chain
    if strict:
        assert isinstance(check.error, torch._dynamo.exc.Unsupported)
    else:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        assert isinstance(check.error, GuardOnDataDependentSymNode)
    # the export was recorded up to the failure, and says it is incomplete
    trace = check.trace
    assert trace.error is not None and trace.error["type"] == "GuardOnDataDependentSymNode"
    assert len(trace) > 0 and not trace.recording
    assert trace.ops["user_line"].astype(str).str.startswith(f"{THIS}:").all()
    verdict = trace.verdict("80GB")
    assert verdict["incomplete"] and not verdict["fits"] and verdict["text"].startswith("incomplete")
    assert check.nodes.empty and tuple(check.nodes.columns) == NODE_COLUMNS
    assert no_fake_mode_active()


@needs_fake_cuda
@pytest.mark.parametrize("strict", [False, True])
def test_a_device_mismatch_says_which_devices_and_where(strict: bool) -> None:
    with fv.fake_mode():
        model = Misplaced()
        model.fc1.to("cuda:0")
        x = torch.randn(4, 12, device="cuda:0")
    check = check_export(model, (x,), strict=strict)
    assert not check.ok and check.kind == "device mismatch"
    line = line_of("# <- device mismatch")
    assert f"{THIS}:{line} in forward" in check.reason
    assert "cuda:0 and cpu" in check.reason and "`.to(device)`" in check.reason
    assert "Misplaced.fc2" in check.reason  # the module whose op failed, from the record
    reason_is_short_and_ours(check)
    assert check.trace.error is not None and check.trace.error["module"] == "Misplaced.fc2"
    assert no_fake_mode_active()


def test_a_graph_break_in_strict_mode_suggests_non_strict() -> None:
    check = check_export(Breaks(), (torch.randn(2, 3),), strict=True)
    assert not check.ok and check.kind == "graph break"
    assert f"{THIS}:{line_of('# <- graph break')} in forward" in check.reason
    assert "strict=False" in check.reason
    reason_is_short_and_ours(check)
    assert check_export(Breaks(), (torch.randn(2, 3),)).ok  # non-strict runs the Python as is
    assert no_fake_mode_active()


def test_dynamic_shapes_that_do_not_hold_get_torchs_suggested_fix() -> None:
    class Fixed(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 8) * 2

    batch = torch.export.Dim("batch")
    check = check_export(Fixed(), (torch.randn(2, 8),), dynamic_shapes={"x": {0: batch}})
    assert not check.ok and check.kind == "dynamic shapes"
    assert "batch = 2" in check.reason and len(check.reason.splitlines()) <= 15


def test_dynamic_shapes_and_unbacked_sizes_export() -> None:
    class Dyn(nn.Module):
        def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x[: n.item()], torch.nonzero(x > 0)

    with fv.fake_mode():
        x, n = torch.randn(6, 4), torch.tensor(3)
    batch = torch.export.Dim("batch")
    check = check_export(Dyn(), (x, n), dynamic_shapes={"x": {0: batch}, "n": None})
    assert check.ok, check.reason
    nodes = check.nodes.set_index("name")
    assert re.fullmatch(r"\[s\d+, 4\]", nodes.loc["x", "shape"]), nodes.loc["x", "shape"]
    assert re.fullmatch(r"\[u\d+, 2\]", nodes.loc["nonzero", "shape"]), nodes.loc["nonzero", "shape"]
    assert nodes.loc["nonzero", "bytes"] == -1 and nodes.loc["nonzero", "bytes_hint"] == -1  # unbacked: no value
    assert nodes.loc["item", "dtype"] == "SymInt" and re.fullmatch(r"u\d+", nodes.loc["item", "value"])


def test_torch_cond_exports_under_the_recorder() -> None:
    with fv.fake_mode():
        model, x = Gated(), torch.randn(4, 12)
    run = export_program(model, (x,))
    assert run.ok, run.reason
    targets = export_nodes(run.program)["target"].tolist()
    assert "higher_order.cond" in targets
    ops = set(run.record.strings("ops"))
    assert {"aten.mul.Tensor", "aten.sub.Tensor"} <= ops  # both branches were traced, and recorded
    # the rule that let cond run under the recording mode is gone again
    assert type(run.mode) not in torch.ops.higher_order.cond.python_key_table


def test_what_torch_prints_while_failing_is_kept_on_the_result(capfd: pytest.CaptureFixture[str]) -> None:
    with fv.fake_mode():
        model, x = Branchy(), torch.randn(4, 12)
    capfd.readouterr()
    check = check_export(model, (x,))
    out, err = capfd.readouterr()
    assert "def forward" not in out + err and "symbolic_shapes" not in err
    assert "def forward" in check.log  # torch's partial graph, printed to stderr by torch.export


def test_bad_arguments_raise_at_once() -> None:
    with pytest.raises(TypeError, match="tuple"):
        check_export(HybridMLP(), torch.randn(2, 12))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nn.Module"):
        check_export(lambda x: x, (torch.randn(2),))  # type: ignore[arg-type]
    assert no_fake_mode_active()


# ----------------------------------------------------------------- the tutorial example
@needs_fake_cuda
def test_the_hybrid_mlp_example_runs() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "fake_export_hybrid_mlp.py")],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    for placement in ("== cpu", "== cuda", "== hybrid"):
        assert placement in out
    hybrid = out.split("== hybrid", 1)[1].split("==", 1)[0]
    assert re.search(r"\bgelu\s+aten\.gelu\.default.*cuda:0", hybrid)
    assert re.search(r"\bto\s+aten\.to\.dtype_layout.*cpu", hybrid)
    dd = out.split("== data-dependent branch", 1)[1]
    assert "fake_export_hybrid_mlp.py:" in dd and "torch.cond" in dd
    assert "== with torch.cond: <fakeviz.ExportCheck ok" in out
    assert proc.stderr.count("\n") < 5, proc.stderr  # torch's own output is kept off the user's terminal


def test_meta_inputs_with_dynamic_shapes() -> None:
    with torch.device("meta"):
        model = HybridMLP()
        x = torch.randn(4, 12)
    batch = torch.export.Dim("batch")
    check = check_export(model, (x,), dynamic_shapes={"x": {0: batch}})
    assert check.ok, check.reason
    nodes = check.nodes.set_index("name")
    m = re.fullmatch(r"\[(s\d+), \d+\]", nodes.loc["x", "shape"])
    assert m and nodes.loc["x", "device"] == "cpu", nodes.loc["x", "shape"]
    assert nodes.loc["linear_1", "shape"] == f"[{m[1]}, 5]"
