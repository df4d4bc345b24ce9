"""The views (fakeviz.views): each figure's data checked against the analysis it draws.

Traces are recorded from small real model code on fake cuda: an MLP with AdamW
spread over two devices, a tiny Llama (forward and backward), the same with one
odd layer, GPT-2 (tied weights), and a module whose class, name and source file
are ``<script>`` tags.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fakeviz as fv
from fakeviz import views as V
from fakeviz._analysis.tree import FIGURES
from fakeviz._core.fmt import format_bytes
from fakeviz._core.gpus import GPUS, parse_capacity

warnings.filterwarnings("ignore", message=".*loss_type=None.*")

SCRIPT = "<script>alert(1)</script>"
ALMOST_EQUAL = 1 - 1e-6  # plotly.js: a "total" node smaller than its children's sum draws nothing


# ------------------------------------------------------------------ traces
@pytest.fixture(scope="module")
def mlp_trace():
    """An MLP (f32, cuda:0) and a bf16 head (cuda:1) trained one AdamW step."""
    with fv.record(device="cuda:0") as trace:
        torch.manual_seed(0)
        body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))
        head = torch.nn.Linear(32, 512, dtype=torch.bfloat16, device="cuda:1")
        opt = torch.optim.AdamW([*body.parameters(), *head.parameters()])
        x = torch.randn(16, 64)
        out = head(body(x).to("cuda:1", torch.bfloat16))
        out.float().sum().backward()
        opt.step()
    return trace


def _llama(layers: int = 4, odd: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    m = LlamaForCausalLM(cfg)
    if odd:
        wide = LlamaConfig(**{**cfg.to_dict(), "intermediate_size": 512})
        m.model.layers[3].mlp = LlamaMLP(wide)
    return m


@pytest.fixture(scope="module")
def llama_trace():
    with fv.record(device="cuda:0") as trace:
        torch.manual_seed(0)
        m = _llama()
        ids = torch.randint(0, 256, (2, 16))
        m(ids, labels=ids).loss.backward()
    return trace


@pytest.fixture(scope="module")
def odd_trace():
    with fv.record(device="cuda:0") as trace:
        torch.manual_seed(0)
        m = _llama(layers=6, odd=True)
        ids = torch.randint(0, 256, (2, 16))
        m(ids, labels=ids).loss.backward()
    return trace


@pytest.fixture(scope="module")
def big_trace():
    """A larger run (thousands of tensors): 12 Llama layers, forward, backward and an AdamW step."""
    with fv.record(device="cuda:0") as trace:
        torch.manual_seed(0)
        m = _llama(layers=12)
        opt = torch.optim.AdamW(m.parameters())
        ids = torch.randint(0, 256, (2, 16))
        m(ids, labels=ids).loss.backward()
        opt.step()
    return trace


@pytest.fixture(scope="module")
def gpt2_trace():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0)
    with fv.record(device="cuda:0") as trace:
        torch.manual_seed(0)
        m = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, 1000, (1, 8))
        m(ids, labels=ids).loss.backward()
    return trace


@pytest.fixture(scope="module")
def weird_trace():
    """A module whose class, child name and source file name are script tags."""

    class Weird(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module(SCRIPT, torch.nn.Linear(4, 4))

        def forward(self, x):
            return getattr(self, SCRIPT)(x) * 2

    Weird.__qualname__ = Weird.__name__ = SCRIPT
    src = (
        "def step(fv, torch, Weird):\n"
        "    with fv.record(device='cuda:0') as trace:\n"
        "        m = Weird()\n"
        "        opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "        m(torch.ones(2, 4)).sum().backward()\n"
        "        opt.step()\n"
        "    return trace\n"
    )
    ns: dict = {}
    exec(compile(src, f"{SCRIPT}.py", "exec"), ns)
    return ns["step"](fv, torch, Weird)


def _strings(obj):
    """Every string in a decoded figure JSON."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _y(arr):
    """A figure array as a NumPy array (plotly may store NumPy arrays as typed arrays)."""
    return np.asarray(arr, dtype=np.float64)


# ------------------------------------------------------------------ formatting
def test_readable_numbers():
    assert V.format_bytes(61.2 * 2**30) == "61.2 GiB"
    assert V.format_bytes(512) == "512 B"
    assert V.format_bytes(1536) == "1.5 KiB"
    assert V.format_flops(3.1e12) == "3.1 TFLOP"
    assert V.format_flops(512) == "512 FLOP"
    assert V.format_count(7_000_000) == "7.0 M"
    assert V.format_count(1.2e9) == "1.2 B"
    assert V.format_count(12) == "12"
    assert V.esc(SCRIPT) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert V.esc(None) == ""


# ------------------------------------------------------------------ memory bars
def test_bars_totals_equal_the_peak(mlp_trace):
    peaks = mlp_trace.peak()
    data = V.bars_data(mlp_trace)
    t = data.table.set_index("device")
    assert set(t.index) == set(peaks) and {"cuda:0", "cuda:1"} <= set(t.index)
    assert list(t.index[:2]) == ["cuda:0", "cuda:1"]  # accelerators first
    for dev, pk in peaks.items():
        assert t.loc[dev, "total"] == pk.bytes
        assert t.loc[dev, list(fv.CATEGORIES)].sum() == pk.bytes
        for cat in fv.CATEGORIES:
            assert t.loc[dev, cat] == pk.by_category[cat], (dev, cat)
        assert t.loc[dev, "seq"] == pk.seq and t.loc[dev, "op"] == pk.op
    # the figure's stacked bars add up to the same totals, category by category
    fig = V.memory_bars_figure(mlp_trace)
    bars = [tr for tr in fig.data if tr.type == "bar"]
    assert {b.name for b in bars} == {c for c in fv.CATEGORIES if t[c].any()}
    for b in bars:
        for dev, y in zip(b.x, _y(b.y)):
            assert y == t.loc[dev, b.name]
    stacked = {dev: sum(_y(b.y)[list(b.x).index(dev)] for b in bars) for dev in t.index}
    assert stacked == {dev: pk.bytes for dev, pk in peaks.items()}
    assert fig.layout.barmode == "stack"
    assert fig.layout.title.text.startswith("peak memory: cuda:0 peaks at")


def test_bars_allocator_markers_on_cuda_only(mlp_trace):
    peaks = mlp_trace.peak()
    fig = V.memory_bars_figure(mlp_trace)
    by_name = {tr.name: tr for tr in fig.data}
    for col in ("allocated", "reserved"):
        tr = by_name[f"{col} (allocator model)"]
        assert list(tr.x) == ["cuda:0", "cuda:1"]  # no marker on cpu
        assert list(_y(tr.y)) == [getattr(peaks[d], col) for d in ("cuda:0", "cuda:1")]
    t = V.bars_data(mlp_trace).table.set_index("device")
    assert np.isnan(t.loc["cpu", "allocated"]) and t.loc["cuda:0", "reserved"] == peaks["cuda:0"].reserved


@pytest.mark.parametrize("gpu", ["H100", "A100 80GB", "MI300X", "a100-40gb"])
def test_bars_capacity_line_at_the_catalog_value(mlp_trace, gpu):
    cap = parse_capacity(gpu)
    assert cap in GPUS.values()
    data = V.bars_data(mlp_trace, gpu)
    assert data.capacity == cap
    verdict = mlp_trace.verdict(gpu)
    assert data.title == verdict["text"] and data.title.startswith("fits: cuda:0 peaks at")
    assert data.title.endswith(f"of {V.format_bytes(cap)}")
    fig = V.memory_bars_figure(data)
    assert fig.layout.title.text.startswith(verdict["text"])
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    # one capacity segment over each accelerator's bar (cuda:0 at 0, cuda:1 at 1), none over cpu
    assert len(lines) == 2 and all(s.y0 == s.y1 == cap for s in lines)
    assert sorted(round((s.x0 + s.x1) / 2) for s in lines) == [0, 1]
    legend = [tr.name for tr in fig.data if tr.name and tr.name.startswith("capacity")]
    assert legend and V.format_bytes(cap) in legend[0]
    t = data.table.set_index("device")
    for dev in ("cuda:0", "cuda:1"):
        v = verdict["devices"][dev]
        assert t.loc[dev, "headroom"] == v["headroom"] == cap - v["peak"] and t.loc[dev, "fits"]
    notes = [a.text for a in fig.layout.annotations if a.text.startswith("headroom")]
    assert notes == [f"headroom {V.format_bytes(t.loc[d, 'headroom'])}" for d in ("cuda:0", "cuda:1")]
    # the axis fits the data, far below the capacity, which a note names; full_capacity runs it up to the capacity
    top = max(t["total"].max(), t["reserved"].max())
    assert top <= fig.layout.yaxis.range[1] < cap
    assert any(a.text.startswith("capacity ") and "above the axis" in a.text for a in fig.layout.annotations)
    full = V.memory_bars_figure(data, full_capacity=True)
    assert full.layout.yaxis.range[1] >= cap and not any("above the axis" in a.text for a in full.layout.annotations)


def test_bars_verdict_when_it_does_not_fit(mlp_trace):
    pk = mlp_trace.peak()["cuda:0"]
    cap = pk.bytes // 2
    data = V.bars_data(mlp_trace, cap)
    assert data.capacity == cap
    assert (
        data.title.startswith(f"does not fit {V.format_bytes(cap)}")
        and "cuda:0 peaks at" in data.title  # the bytes the verdict judged (Note: [the verdict])
        and ", over by " in data.title
    )
    assert "first fails at op 0 " in data.title  # the first allocation already needs a 2 MiB segment
    row = data.table.set_index("device").loc["cuda:0"]
    assert not row["fits"] and row["headroom"] < 0
    fig = V.memory_bars_figure(data)
    assert any("over by" in a.text for a in fig.layout.annotations)
    # a size string works as well as bytes
    assert V.bars_data(mlp_trace, "80GB").capacity == 80 * 10**9


# ------------------------------------------------------------------ layer tree
def _check_plotly_totals(values, ids, parents):
    """Emulate plotly.js's branchvalues="total" check (children summed left to right)."""
    pos = {k: i for i, k in enumerate(ids)}
    sums = {}
    for i, p in enumerate(parents):
        if p in pos:
            sums[p] = sums.get(p, 0.0) + float(values[i])
    for p, s in sums.items():
        assert not values[pos[p]] < s * ALMOST_EQUAL, (p, values[pos[p]], s)


@pytest.mark.parametrize("measure", ["params", "param_bytes", "act_bytes", "flops", "ops", "grad_bytes"])
def test_folded_icicle_keeps_totals(odd_trace, measure):
    data = V.tree_data(odd_trace, measure)
    t = data.table
    mt = odd_trace.modules
    root = mt[mt.parent.isna()].iloc[0]
    want = root.flops_fwd + root.flops_bwd if measure == "flops" else None
    if measure == "ops":
        want = root.ops_fwd + root.ops_bwd
    want = root[measure] if want is None else want
    assert t["measure"].iloc[0] == want and t["value"].iloc[0] == want
    assert not t["inflated"].any()  # untied model: sizes are the figures themselves
    # the folded rows add up to the unfolded sums, level by level
    unfolded = V.tree_data(odd_trace, measure, folded=False).table
    assert len(unfolded) > len(t)
    by_level = t.groupby("depth")["measure"].sum()
    assert by_level.equals(unfolded.groupby("depth")["measure"].sum())
    fig = V.layer_tree_figure(data)
    ic = fig.data[0]
    assert ic.type == "icicle" and ic.branchvalues == "total"
    assert _y(ic.values)[0] == want
    _check_plotly_totals(_y(ic.values), list(ic.ids), list(ic.parents))


def test_folded_tree_flags_the_odd_layer(odd_trace):
    t = V.tree_data(odd_trace, "params").table
    layers = t[t.parent_id == "LlamaForCausalLM.model.layers"]
    assert list(layers.label) == ["0-2,4-5 x5", "3"] and list(layers.odd) == [False, True]
    f = odd_trace.folded_modules().set_index("path")
    for _, row in t.iterrows():  # every figure of the fold is there
        for k in FIGURES:
            assert row[k] == f.loc[row.path, k], (row.path, k)
    fig = V.layer_tree_figure(odd_trace)
    ic = fig.data[0]
    i = list(ic.ids).index("LlamaForCausalLM.model.layers.3")
    assert ic.labels[i] == "⚠ 3" and ic.marker.line.color[i] == "#D62728"
    j = list(ic.ids).index("LlamaForCausalLM.model.layers.0-2,4-5")
    assert "odd one out" in ic.hovertext[i] and "folded: 5 modules" in ic.hovertext[j]
    # hover shows every figure, formatted
    hover = ic.hovertext[0]
    for piece in ("params: ", "buffers: ", "activations made: ", "gradients: ", "FLOPs: forward ", "ops: forward "):
        assert piece in hover
    assert "MiB" in hover and "MFLOP" in hover


def test_tree_colour_by_device_dtype_and_class(mlp_trace):
    dev = V.tree_data(mlp_trace, "param_bytes", color="device").table.set_index("id")
    # two top-level modules: a synthetic root holds them and adds them up
    assert dev.index[0] == "(all modules)" and dev.iloc[0].parent_id == ""
    roots = dev[dev.parent_id == "(all modules)"]
    assert list(roots.index) == ["Sequential", "Linear"]
    assert dev.iloc[0]["measure"] == roots["measure"].sum() == dev.iloc[0]["value"]
    assert dev.loc["Sequential", "color_key"] == "cuda:0" and dev.loc["Linear", "color_key"] == "cuda:1"
    assert dev.loc["Sequential.1", "color_key"] == "no parameters"  # ReLU
    # the root holds more bf16 bytes (512 x 32 head) than f32 bytes: by bytes, bf16 and cuda:1 win
    dt = V.tree_data(mlp_trace, "param_bytes", color="dtype").table.set_index("id")
    assert dt.loc["Sequential", "color_key"] == "f32" and dt.loc["Linear", "color_key"] == "bf16"
    assert dt.iloc[0]["color_key"] == ("bf16" if 512 * 33 * 2 > (64 * 256 + 256 + 256 * 32 + 32) * 4 else "f32")
    cls = V.tree_data(mlp_trace, color="class").table.set_index("id")
    assert cls.loc["Sequential.1", "color_key"] == "ReLU"
    assert cls.loc["Sequential.0", "color"] == cls.loc["Sequential.2", "color"] != cls.loc["Sequential.1", "color"]
    fig = V.layer_tree_figure(mlp_trace, color="device")
    legend = {tr.name: tr.marker.color for tr in fig.data[1:]}
    assert legend == {"cuda:0": dev.loc["Sequential", "color"], "cuda:1": dev.loc["Linear", "color"],
                      "no parameters": "#DDDDDD"}  # fmt: skip


def test_tree_tied_weights_keep_plotly_drawing(gpt2_trace):
    data = V.tree_data(gpt2_trace, "params")
    t = data.table.set_index("id")
    root = t.loc["GPT2LMHeadModel"]
    kids = t[t.parent_id == "GPT2LMHeadModel"]
    # the tied embedding counts once in the root, once in each child holding it
    assert kids["measure"].sum() > root["measure"]
    assert root["value"] == kids["value"].sum() and root["inflated"]
    assert root["measure"] == gpt2_trace.modules.params.iloc[0]
    assert "tied" in root["hover"] and "box sized" in root["hover"]
    fig = V.layer_tree_figure(data)
    ic = fig.data[0]
    _check_plotly_totals(_y(ic.values), list(ic.ids), list(ic.parents))
    assert ic.text[0] == V.format_count(root["measure"])  # the text shows the true figure


def test_tree_measures_and_options(llama_trace):
    t = V.tree_data(llama_trace, "flops", folded=False).table
    mt = llama_trace.modules
    assert (t["measure"].to_numpy() == (mt.flops_fwd + mt.flops_bwd).to_numpy()).all()
    assert "FLOP" in V.layer_tree_figure(llama_trace, "flops").data[0].text[0]
    with pytest.raises(ValueError, match="unknown measure"):
        V.tree_data(llama_trace, "nope")
    with pytest.raises(ValueError, match="unknown color"):
        V.tree_data(llama_trace, color="nope")
    assert V.layer_tree_figure(llama_trace, kind="treemap").data[0].type == "treemap"
    assert V.layer_tree_figure(llama_trace, max_depth=None).data[0].maxdepth == -1


# ------------------------------------------------------------------ timeline
def test_timeline_downsampling_keeps_the_peak(llama_trace):
    mem = llama_trace.memory(device="cuda:0")
    pk = llama_trace.peak()["cuda:0"]
    assert len(mem) > 1000
    for max_points in (50, 200, 999):
        df = V.timeline_data(llama_trace, "cuda:0", max_points=max_points)
        assert len(df) <= max_points
        assert df["total"].max() == mem["total"].max() == pk.bytes
        assert pk.seq in set(df["seq"])
        assert df["seq"].iloc[0] == 0 and df["seq"].iloc[-1] == len(mem) - 1
        assert df["seq"].is_monotonic_increasing and df["seq"].is_unique
        assert df["allocated"].max() == mem["allocated"].max() and df["reserved"].max() == mem["reserved"].max()
        # the rows kept are the real rows
        ref = mem.set_index("seq").loc[df["seq"]]
        for c in (*fv.CATEGORIES, "total"):
            assert (ref[c].to_numpy() == df[c].to_numpy()).all()
    full = V.timeline_data(llama_trace, max_points=10**6)
    assert len(full) == len(mem) and (full["total"].to_numpy() == mem["total"].to_numpy()).all()
    assert full["op"].iloc[pk.seq] == pk.op
    with pytest.raises(ValueError, match="no memory on"):
        V.timeline_data(llama_trace, "cuda:7")


def test_decimate_keeps_spikes_and_dips():
    rng = np.random.default_rng(0)
    vals = rng.integers(100, 200, 100_000)
    vals[31_337] = 10_000  # a one-op spike
    vals[77_777] = 0  # a one-op dip
    idx = V.decimate(vals, 500)
    assert len(idx) <= 500 and {0, 31_337, 77_777, 99_999} <= set(idx.tolist())
    assert V.decimate(vals, 500, keep=[5]).tolist().count(5) == 1
    assert len(V.decimate(vals[:10], 500)) == 10
    with pytest.raises(ValueError):
        V.decimate(vals, 3)


def test_timeline_figure(llama_trace):
    pk = llama_trace.peak()["cuda:0"]
    fig = V.memory_timeline_figure(llama_trace, max_points=300, capacity="H100")
    areas = [tr for tr in fig.data if tr.stackgroup == "memory"]
    assert areas and all(tr.line.shape == "hv" for tr in areas)
    total = next(tr for tr in fig.data if tr.name == "total")
    stacked = np.sum([_y(tr.y) for tr in areas], axis=0)
    assert (stacked == _y(total.y)).all() and len(total.x) <= 300
    # the peak is marked where it is
    star = next(tr for tr in fig.data if tr.name == "peak")
    assert list(star.x) == [pk.seq] and list(_y(star.y)) == [pk.bytes]
    assert any(V.format_bytes(pk.bytes) in a.text for a in fig.layout.annotations)
    # hover names op, module and line
    assert any(pk.op in h for h in total.customdata)
    assert any("modeling_llama.py" in h for h in total.customdata)
    # one shaded band per phase run, covering every op
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    present = set(llama_trace.ops.phase.astype(str))
    assert {s.name for s in bands} == present
    runs = V.phase_runs(llama_trace)
    assert len(bands) == len(runs) and runs["n_ops"].sum() == llama_trace.num_ops
    covered = sorted((s.x0, s.x1) for s in bands)
    assert covered[0][0] == -0.5 and covered[-1][1] == llama_trace.num_ops - 0.5
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    cap = [s for s in fig.layout.shapes if s.type == "line" and s.name == "capacity"]
    assert len(cap) == 1 and cap[0].y0 == GPUS["H100"]
    # the figure from the data alone
    df = V.timeline_data(llama_trace, max_points=300)
    fig2 = V.memory_timeline_figure(df)
    assert {s.name for s in fig2.layout.shapes if s.type == "rect"} <= present


def test_timeline_phase_bands_are_bounded_but_cover_every_phase(mlp_trace):
    runs = V.phase_runs(mlp_trace)
    present = set(runs.phase)
    assert {"init", "forward", "backward", "optimizer"} <= present
    fig = V.memory_timeline_figure(mlp_trace, "cuda:0", max_phase_runs=2)
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert {s.name for s in bands} == present and len(bands) == len(present)
    # default device: the accelerator with the highest peak
    assert V.timeline_data(mlp_trace)["device"].iloc[0] == "cuda:0"
    assert "allocated" not in V.timeline_data(mlp_trace, "cpu").columns


# ------------------------------------------------------------------ alias graph
@pytest.mark.parametrize("max_nodes", [200, 40])
def test_alias_graph_is_bounded(big_trace, max_nodes):
    data = V.alias_graph_data(big_trace, max_nodes=max_nodes)
    assert data.total > 5000  # the whole run: thousands of tensors and storages
    assert len(data.nodes) <= max_nodes and data.dropped > 0
    ids = set(data.nodes["id"])
    assert set(data.edges["src"]) <= ids and set(data.edges["dst"]) <= ids
    fig = V.alias_graph_figure(data)
    drawn = sum(len(tr.x) for tr in fig.data if tr.mode and tr.mode.startswith("markers") and tr.name.endswith("s"))
    assert drawn == len(data.nodes) <= max_nodes
    assert f"of {data.total}" in fig.layout.title.text


def test_alias_graph_layout_is_deterministic(big_trace):
    a = V.alias_graph_data(big_trace, around="model.layers.0.self_attn.q_proj.weight")
    b = V.alias_graph_data(big_trace, around="model.layers.0.self_attn.q_proj.weight")
    assert a.nodes[["id", "x", "y"]].equals(b.nodes[["id", "x", "y"]])
    n = a.nodes.set_index("id")
    assert (n[n.kind == "storage"].x == 0).all() and (n[n.kind == "name"].x == -1).all()
    tensors = n[n.kind == "tensor"]
    assert (tensors.x == 1 + tensors.depth).all()
    # views sit one column right of what they view; the parameter's t() is a view
    views = a.edges[a.edges.kind == "view"]
    assert len(views)
    for src, dst in zip(views.src, views.dst):
        assert n.loc[dst, "x"] == n.loc[src, "x"] + 1
    # AdamW writes the parameter in place: highlighted
    assert (a.edges.kind == "write").any()
    fig = V.alias_graph_figure(a)
    assert "write edge" in {tr.name for tr in fig.data}
    tens = next(tr for tr in fig.data if tr.name == "tensors")
    assert "#D62728" in list(tens.marker.line.color)


def test_alias_graph_highlights_tied_parameters(gpt2_trace):
    data = V.alias_graph_data(gpt2_trace, around="lm_head.weight")
    kinds = set(data.edges.kind)
    assert "tied" in kinds and "storage" in kinds
    names = set(data.nodes[data.nodes.kind == "name"].label)
    assert {"GPT2LMHeadModel.lm_head.weight", "GPT2LMHeadModel.transformer.wte.weight"} <= names
    assert data.nodes[data.nodes.kind == "tensor"].tied.any()
    fig = V.alias_graph_figure(data)
    tied = next(tr for tr in fig.data if tr.name == "tied edge")
    assert tied.line.color == "#F58518" and tied.line.width > 2
    assert "around lm_head.weight" in fig.layout.title.text


# ------------------------------------------------------------------ ops table
def test_ops_table_filters(odd_trace):
    ops = odd_trace.ops
    m = "LlamaForCausalLM.model.layers.3"
    t = V.ops_table_data(odd_trace, module=m, limit=None)
    mods = ops.module.astype(object)
    want = ops[(mods == m) | mods.str.startswith(m + ".").fillna(False).astype(bool)]
    assert len(t) == len(want) > 0 and list(t.seq) == list(want.seq)
    assert not (mods == "LlamaForCausalLM.model.layers.30").any()  # the prefix is a path, not a string prefix
    # a folded path matches its members
    fold = V.ops_table_data(odd_trace, module="LlamaForCausalLM.model.layers.0-2,4-5", limit=None)
    assert set(fold.module.astype(str).str.split(".").str[3]) == {"0", "1", "2", "4", "5"}
    bw = V.ops_table_data(odd_trace, module=m, phase="backward", limit=None)
    assert len(bw) and (bw.phase == "backward").all() and len(bw) < len(t)
    fb = V.ops_table_data(odd_trace, phase=["forward", "backward"], limit=None)
    assert len(fb) == ops.phase.isin(["forward", "backward"]).sum()
    mm = V.ops_table_data(odd_trace, op="MM", limit=None)
    assert len(mm) and mm.op.astype(str).str.contains("mm").all()
    assert len(mm) == ops.op.astype(str).str.lower().str.contains("mm").sum()
    assert (mm.flops > 0).all()
    assert len(V.ops_table_data(odd_trace, device="cuda:0", limit=None)) == (ops.device == "cuda:0").sum()
    assert len(V.ops_table_data(odd_trace, limit=7)) == 7
    with pytest.raises(ValueError, match="unknown phase"):
        V.ops_table_data(odd_trace, phase="fwd")
    fig = V.ops_table_figure(odd_trace, module=m, op="mm", limit=5)
    table = fig.data[0]
    assert table.type == "table" and all(len(col) == len(V.ops_table_data(odd_trace, m, op="mm", limit=5))
                                         for col in table.cells.values)  # fmt: skip
    assert "FLOP" in " ".join(table.cells.values[6])


# ------------------------------------------------------------------ escaping and serialization
def _all_figures(trace, around=None):
    return {
        "layer_tree": V.layer_tree_figure(trace, color="class"),
        "layer_tree_unfolded": V.layer_tree_figure(trace, "flops", folded=False),
        "memory_bars": V.memory_bars_figure(trace, "H100"),
        "memory_timeline": V.memory_timeline_figure(trace, max_points=100),
        "alias_graph": V.alias_graph_figure(trace, around=around),
        "ops_table": V.ops_table_figure(trace),
    }


def test_user_text_is_escaped(weird_trace):
    assert weird_trace.modules["class"].iloc[0] == SCRIPT
    assert any(SCRIPT in str(x) for x in weird_trace.ops.user_line.dropna())
    escaped = V.esc(SCRIPT)
    for name, fig in _all_figures(weird_trace, around=f"{SCRIPT}.weight").items():
        strings = list(_strings(json.loads(fig.to_json())))
        assert not [s for s in strings if "<script" in s.lower() or "</script" in s.lower()], name
        assert any(escaped in s for s in strings), name  # the text is there, as text
        assert "<script>alert" not in fig.to_html(include_plotlyjs=False), name
    # the names reach the hover of the tree and the alias graph
    ic = V.layer_tree_figure(weird_trace).data[0]
    assert escaped in ic.hovertext[0] and ic.labels[0] == escaped
    # user text is never in a hovertemplate, where %{...} would be interpreted
    for fig in _all_figures(weird_trace).values():
        for tr in fig.data:
            tmpl = getattr(tr, "hovertemplate", None) or ""
            assert "script" not in tmpl


@pytest.mark.parametrize(
    "name", ["layer_tree", "layer_tree_unfolded", "memory_bars", "memory_timeline", "alias_graph", "ops_table"]
)
def test_figures_serialize(llama_trace, name):
    fig = _all_figures(llama_trace)[name]
    data = json.loads(fig.to_json())
    assert data["data"]
    html = fig.to_html(include_plotlyjs=False)
    assert "Plotly.newPlot" in html


FIGURE_MODULES = ("style", "tree", "memory", "graph", "table")


@pytest.mark.parametrize("name", ["views", *FIGURE_MODULES])
def test_views_import_only_numpy_pandas_plotly(name):
    path = Path(V.__file__) if name == "views" else Path(V.__file__).parent / "_views" / f"{name}.py"
    src = path.read_text()
    allowed = {"numpy", "pandas", "plotly", "__future__", "html", "re", "collections", "dataclasses", "typing"}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # fakeviz's own analysis modules
                continue
            mods = [node.module or ""]
        else:
            continue
        for m in mods:
            assert m.split(".")[0] in allowed, m


def test_views_of_runs_without_modules_or_ops():
    with fv.record(device="cuda:0") as empty:
        pass
    with fv.record(device="cuda:0") as plain:  # tensor code, no module
        a = torch.randn(64, 64)
        (a @ a).sum()
    for trace in (empty, plain):
        tree = V.layer_tree_figure(trace)
        assert "no module was seen" in tree.layout.title.text and len(tree.data[0].ids) == 0
        for fig in (
            V.memory_bars_figure(trace, "H100"),
            V.memory_timeline_figure(trace),
            V.alias_graph_figure(trace),
            V.ops_table_figure(trace),
        ):
            json.loads(fig.to_json())
    assert V.memory_bars_figure(empty).layout.title.text.startswith("no memory was recorded")
    assert V.memory_timeline_figure(empty).layout.title.text == "Memory: no memory was recorded"
    assert len(V.ops_table_data(plain)) == plain.num_ops


# ------------------------------------------------------------- one format for bytes
BYTE_VALUES = [
    0, 1, 512, 1000, 1023, 1023.9, 1024, 1280, 1536, 1792, 1800, 10 * 2**10 + 2**8, 2**20 - 1, 2**20, 1.05 * 2**20,
    3.25 * 2**20, 123456789, 2**30, 85520809984, 282248397320, 2**40 * 5.75, 2**50, 2**60, 1e30, 2**53 + 1,
    -1, -0.5, -1280, -259924164608, 0.25, 7.75 * 2**30, float("inf"), float("nan"), None,
]  # fmt: skip


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed: js/src/format.js cannot run")
def test_js_formats_bytes_as_python(tmp_path):
    """js/src/format.js (the explorer) writes every byte count exactly as fakeviz._core.fmt.format_bytes:
    ties at one decimal (1280 B = 1.25 KiB) to the even digit, bytes truncated, '?' for a missing value."""
    js = Path(V.__file__).resolve().parents[1] / "js" / "src" / "format.js"
    script = tmp_path / "bytes.mjs"
    script.write_text(
        f"import {{ fmtBytes }} from '{js.as_uri()}';\n"
        "const values = JSON.parse(process.argv[2]).map((v) => (v === 'nan' ? NaN : v === 'inf' ? Infinity : v));\n"
        "process.stdout.write(JSON.stringify(values.map(fmtBytes)));\n"
    )
    wire = ["nan" if v != v else "inf" if v == float("inf") else v for v in BYTE_VALUES]  # JSON has no NaN or inf
    proc = subprocess.run(["node", str(script), json.dumps(wire)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    want = [format_bytes(v) for v in BYTE_VALUES]
    assert got == want, [(v, g, w) for v, g, w in zip(BYTE_VALUES, got, want) if g != w]


# ------------------------------------------------------------------ issue 15: axes, counts, sizes
def test_timeline_axis_fits_the_data_and_one_op_has_one_tick():
    with fv.record(device="cuda:0") as trace:
        torch.empty(10)
    fig = V.memory_timeline_figure(trace, capacity="H100")
    assert fig.layout.yaxis.range[1] < GPUS["H100"]  # the curve is not squashed under an 80 GB axis
    assert any("above the axis" in a.text for a in fig.layout.annotations)
    assert [s.y0 for s in fig.layout.shapes if s.name == "capacity"] == [GPUS["H100"]]
    # one op: whole-number ticks, one per op, and the range around it
    assert fig.layout.xaxis.tickformat == "d" and fig.layout.xaxis.dtick == 1
    assert tuple(fig.layout.xaxis.range) == (-0.5, 0.5)
    full = V.memory_timeline_figure(trace, capacity="H100", full_capacity=True)
    assert full.layout.yaxis.range[1] >= GPUS["H100"]


def test_ops_table_figure_says_how_many_of_how_many(llama_trace):
    n = llama_trace.num_ops
    assert n > 50
    fig = V.ops_table_figure(llama_trace, limit=50)
    assert fig.layout.title.text.startswith(f"50 of {n:,} ops")
    assert V.ops_table_data(llama_trace, limit=50).attrs["matched"] == n
    assert V.ops_table_figure(llama_trace, limit=None).layout.title.text.startswith(f"{n:,} ops")


def test_alias_graph_is_labelled_and_at_most_a_screen_tall(llama_trace):
    fig = V.alias_graph_figure(llama_trace, max_nodes=200)
    assert fig.layout.height <= 720
    nodes = [tr for tr in fig.data if tr.name in ("storages", "tensors", "names")]
    assert nodes and all(tr.mode == "markers+text" and tr.text and all(tr.text) for tr in nodes)
    heads = {a.text for a in fig.layout.annotations}
    assert {"<b>storages</b>", "<b>tensors and views</b>"} <= heads
    if "drag up and down" in fig.layout.title.text:  # taller than a screen: shows the first rows, pans
        assert fig.layout.dragmode == "pan" and fig.layout.yaxis.range is not None


def test_icicle_draws_no_zero_size_sector(mlp_trace):
    """No zero-size sector, and one outline width (a width per sector makes plotly.js log NaN paths on drill-down,
    tests/browser/test_saved_notebook.py clicks one)."""
    data = V.tree_data(mlp_trace, "params")
    zero = set(data.table.loc[data.table["value"] <= 0, "id"].astype(str))
    ids = set(V.layer_tree_figure(mlp_trace, "params").data[0].ids)
    assert zero and not (zero - {data.table["id"].iloc[0]}) & ids
    icicle = V.layer_tree_figure(mlp_trace, "params").data[0]
    assert all(v > 0 for v in icicle["values"]) and isinstance(icicle.marker.line.width, (int, float))


def test_alias_graph_title_names_a_tensor_by_its_metadata_not_its_repr():
    with fv.record() as trace:
        w = torch.empty(64, 64)
        w.t().contiguous()
    fig = V.alias_graph_figure(trace, around=w)
    title = fig.layout.title.text
    assert "around a tensor float32[64, 64] on cpu" in title and "FakeTensor" not in title
    assert "around storage 0" in V.alias_graph_figure(trace, around=("storage", 0)).layout.title.text
