"""The explorer panel (fakeviz._views.explorer.Explorer): its state, its data against the trace, its size, its build.

The browser side has its own unit tests (vitest, ``js/test``); ``test_vitest`` runs them.
Tests that need the JavaScript bundle build it with npm first (``js/``: ``npm ci``,
``npm run build``) and are skipped, saying so, where npm is not installed and no bundle
was built before.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from js_bundle import ensure_bundle  # tests/ is on sys.path (tests/conftest.py)

import fakeviz as fv

warnings.filterwarnings("ignore", message=".*loss_type=None.*")

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "js"
STATIC = ROOT / "fakeviz" / "static"
NPM = shutil.which("npm")
needs_npm = pytest.mark.skipif(NPM is None, reason="npm is not installed: the explorer's JavaScript cannot be built")
needs_fake_cuda = pytest.mark.skipif(
    not fv.fake_cuda_status().cuda_ok, reason="no fake cuda in this process (no C++ compiler for the shim)"
)


def _npm(*args: str, cwd: Path = JS, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([NPM, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"npm {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _npm_install() -> None:
    ensure_bundle()  # `npm ci` when node_modules lacks esbuild or vitest, under the build's lock


@pytest.fixture(scope="session")
def bundle() -> Path:
    """The built bundle, rebuilt from js/src when npm is here and a source changed (js_bundle: one build per run)."""
    out = ensure_bundle()
    if out is None:
        pytest.skip("npm is not installed and fakeviz/static/explorer.js was never built")
    return out


@pytest.fixture(scope="module")
def gpt2_trace():
    """GPT-2 (2 layers, tied embedding) fwd + bwd + AdamW step on fake cuda:0."""
    if not fv.fake_cuda_status().cuda_ok:
        pytest.skip("no fake cuda in this process (no C++ compiler for the shim)")
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0)
    with fv.record(device="cuda:0") as trace:
        torch.manual_seed(0)
        m = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, 1000, (2, 16))
        m(ids, labels=ids).loss.backward()
        torch.optim.AdamW(m.parameters()).step()
    return trace


@pytest.fixture(scope="module")
def explorer(bundle, gpt2_trace):
    from fakeviz._views.explorer import Explorer

    return Explorer.from_trace(gpt2_trace, "24GB", max_points=64, alias_nodes=40)


def _wire(state: dict) -> tuple[dict, int]:
    """What the notebook stores for a widget state: JSON with base64 buffers; returns (state, bytes)."""
    from ipywidgets.widgets.widget import _remove_buffers

    plain, paths, buffers = _remove_buffers(state)
    size = len(json.dumps(plain)) + sum(len(base64.b64encode(bytes(b))) for b in buffers)
    return (plain, paths, buffers), size


# ------------------------------------------------------------------------ the state
def test_esm_is_the_built_bundle(bundle, explorer):
    from fakeviz._views.explorer import Explorer

    text = bundle.read_text()
    assert str(Explorer._esm) == text
    assert explorer.get_state()["_esm"] == text
    assert "render" in text and text.lstrip().startswith(("var", "function", "const", "let", "import"))
    assert explorer.get_state()["_css"] == (STATIC / "explorer.css").read_text()


def test_state_round_trip(bundle, gpt2_trace):
    from ipywidgets.widgets.widget import _put_buffers

    from fakeviz._views.explorer import Explorer

    explorer = Explorer.from_trace(gpt2_trace, "24GB", max_points=64, alias_nodes=40)
    explorer.selected_module = "GPT2LMHeadModel.transformer.h.0-1.attn"
    explorer.phase = "backward"
    explorer.device = "cuda:0"
    explorer.search = "mlp"
    explorer.size_by = "flops"
    (plain, paths, buffers), _ = _wire(explorer.get_state())
    # through JSON and back, buffers as the memoryviews a comm message carries
    plain = json.loads(json.dumps(plain))
    _put_buffers(plain, paths, [memoryview(bytes(b)) for b in buffers])
    fresh = Explorer()
    fresh.set_state(plain)
    for name in (
        "summary",
        "tree",
        "memory",
        "ops",
        "alias",
        "selected_module",
        "device",
        "phase",
        "search",
        "size_by",
    ):
        assert getattr(fresh, name) == getattr(explorer, name), name
    assert isinstance(fresh.tree, bytes)
    assert fresh.get_state() == explorer.get_state()


def test_selection_traits_are_validated(explorer):
    import traitlets

    with pytest.raises(traitlets.TraitError, match="phase"):
        explorer.phase = "training"
    with pytest.raises(traitlets.TraitError, match="not in this trace"):
        explorer.device = "cuda:7"
    with pytest.raises(traitlets.TraitError, match="size_by"):
        explorer.size_by = "colour"


def test_missing_bundle_is_explained(monkeypatch, bundle):
    from fakeviz._views import explorer as _widget

    monkeypatch.setattr(_widget, "_BUNDLE", Path("/nonexistent/explorer.js"))
    with pytest.raises(FileNotFoundError, match="npm run build"):
        _widget.Explorer()


# ----------------------------------------------------------- the data against the trace
def test_memory_timeline_keeps_the_peak(explorer, gpt2_trace):
    meta, arrays, _ = explorer.decoded("memory")
    mem = gpt2_trace.memory()
    peaks = gpt2_trace.peak()
    assert [d["device"] for d in meta["devices"]] == list(peaks)
    for dev, pk in peaks.items():
        seq = arrays[f"{dev}/seq"]
        assert len(seq) <= 64 < gpt2_trace.num_ops  # decimated
        cats = np.stack([arrays[f"{dev}/{c}"] for c in fv.CATEGORIES], axis=1)
        total = cats.sum(axis=1)
        assert total.max() == pk.bytes
        assert seq[int(np.argmax(total))] == pk.seq
        # every kept row is the trace's row, exactly
        rows = mem[mem.device == dev].set_index("seq").loc[seq]
        assert np.array_equal(cats, rows[list(fv.CATEGORIES)].to_numpy())
        if dev.startswith("cuda"):
            assert np.array_equal(arrays[f"{dev}/reserved"], rows["reserved"].to_numpy())
            assert np.array_equal(arrays[f"{dev}/allocated"], rows["allocated"].to_numpy())
            assert arrays[f"{dev}/reserved"].max() == pk.reserved
        else:
            assert f"{dev}/reserved" not in arrays
        # the peak's attribution adds up to the peak, category by category
        by_cat = np.bincount(arrays[f"{dev}/attr_category"].astype(np.int64), weights=arrays[f"{dev}/attr_bytes"],
                             minlength=len(fv.CATEGORIES))  # fmt: skip
        assert by_cat.tolist() == [pk.by_category[c] for c in fv.CATEGORIES]
    phases = gpt2_trace.col("phase")
    runs = zip(arrays["phase_runs/phase"], arrays["phase_runs/start"], arrays["phase_runs/stop"])
    assert all((phases[a:b] == p).all() for p, a, b in runs)
    assert arrays["phase_runs/stop"][-1] == gpt2_trace.num_ops


def test_peak_attribution_follows_modules(explorer, gpt2_trace):
    """Parameters, their gradients and optimizer state count to the module holding the parameter."""
    _, arrays, _ = explorer.decoded("memory")
    _, ops_arrays, strings = explorer.decoded("ops")
    modules = strings["modules"]
    mt = gpt2_trace.modules.set_index("path")
    mod = arrays["cuda:0/attr_module"].astype(np.int64)
    cat = arrays["cuda:0/attr_category"].astype(np.int64)
    nbytes = arrays["cuda:0/attr_bytes"]
    for path in ("GPT2LMHeadModel.transformer.h.0.mlp.c_fc", "GPT2LMHeadModel.transformer.wte"):
        i = modules.index(path)
        param = nbytes[(mod == i) & (cat == fv.CATEGORIES.index("Parameter"))].sum()
        grad = nbytes[(mod == i) & (cat == fv.CATEGORIES.index("Gradient"))].sum()
        opt = nbytes[(mod == i) & (cat == fv.CATEGORIES.index("Optimizer state"))].sum()
        assert param == mt.loc[path, "param_bytes"]
        assert grad == mt.loc[path, "grad_bytes"]
        # AdamW keeps exp_avg and exp_avg_sq on the parameter's device (its `step` scalars live on cpu)
        assert opt == 2 * param and mt.loc[path, "opt_bytes"] > opt


def test_tree_matches_folded_modules(explorer, gpt2_trace):
    meta, arrays, strings = explorer.decoded("tree")
    folded = gpt2_trace.folded_modules()
    assert strings["path"] == folded.path.tolist()
    assert strings["name"] == folded.name.tolist()
    assert strings["class"] == folded["class"].tolist()
    for k in meta["figures"]:
        assert np.array_equal(arrays[k], folded[k].to_numpy()), k
    assert np.array_equal(arrays["count"], folded["count"].to_numpy())
    parents = [strings["path"][p] if p >= 0 else None for p in arrays["parent"]]
    assert parents == [p if isinstance(p, str) else None for p in folded.parent]
    # every module of the trace maps to the folded row holding it
    modules = gpt2_trace.strings("modules")
    for m, row in enumerate(arrays["module_node"].tolist()):
        assert modules[m] in folded.members.iloc[row].split("|")
    assert "GPT2LMHeadModel.transformer.h.0-1" in strings["path"]


def test_ops_columns_match_the_trace(explorer, gpt2_trace):
    meta, a, s = explorer.decoded("ops")
    ops = gpt2_trace.ops
    assert meta == {"n_ops": len(ops), "start": 0, "stop": len(ops), "truncated": False, "phases": list(fv.PHASES)}
    assert np.array_equal(a["seq"], ops.seq.to_numpy())
    assert [s["ops"][i] for i in a["op"]] == ops.op.astype(str).tolist()
    assert [s["modules"][i] if i >= 0 else None for i in a["module"]] == [
        m if isinstance(m, str) else None for m in ops.module.tolist()
    ]
    assert [fv.PHASES[i] for i in a["phase"]] == ops.phase.astype(str).tolist()
    assert [s["devices"][i] if i >= 0 else None for i in a["device"]] == [
        d if isinstance(d, str) else None for d in ops.device.tolist()
    ]
    assert [s["shapes"][i] if i >= 0 else None for i in a["shape"]] == [
        x if isinstance(x, str) else None for x in ops["shape"].tolist()
    ]
    assert [s["lines"][i] if i >= 0 else None for i in a["line"]] == [
        x if isinstance(x, str) else None for x in ops.user_line.tolist()
    ]
    assert np.array_equal(a["nbytes"], ops.nbytes.to_numpy())
    assert np.array_equal(a["flops"], gpt2_trace.col("flops"))
    assert "bf16" not in s["dtypes"] and "f32" in s["dtypes"]  # abbreviated as the op log writes them


def test_alias_graph_is_bounded_and_consistent(explorer, gpt2_trace):
    meta, a, s = explorer.decoded("alias")
    n = len(a["node_kind"])
    assert 0 < n <= meta["max_nodes"] == 40
    assert meta["truncated"] and meta["total_nodes"] > n
    assert a["edge_src"].max() < n and a["edge_dst"].max() < n
    from fakeviz._analysis.selection import aliased_storages as _aliased_storages
    from fakeviz._analysis.selection import fit_storages as _fit

    focus = _fit(gpt2_trace, _aliased_storages(gpt2_trace), 40)
    nodes, _ = gpt2_trace.alias_graph(("storages", focus), max_nodes=meta["budget"])
    assert s["label"] == nodes.label.astype(str).tolist()[:n]
    assert meta["around"].startswith("the most aliased storages")
    # the tied embedding shows as two names on one tensor, both pointing at their modules
    names = [s["label"][i] for i in range(n) if meta["node_kinds"][a["node_kind"][i]] == "name"]
    assert "GPT2LMHeadModel.transformer.wte.weight" in names and "GPT2LMHeadModel.lm_head.weight" in names
    tied = [k for k in a["edge_kind"] if meta["edge_kinds"][k] == "tied"]
    assert len(tied) == 2
    modules = gpt2_trace.strings("modules")
    i = s["label"].index("GPT2LMHeadModel.lm_head.weight")
    assert modules[a["node_module"][i]] == "GPT2LMHeadModel.lm_head"


def test_default_alias_focus_is_the_most_aliased(gpt2_trace):
    """With nothing selected the graph starts at the tied embedding, then the storages most tensors alias."""
    from fakeviz._analysis.selection import aliased_storages as _aliased_storages

    tt = gpt2_trace.tensors
    tt = tt[tt.storage >= 0]
    ranked = _aliased_storages(gpt2_trace, limit=10)
    tied_storage = int(tt[tt.names.astype(str).str.contains("|", regex=False)].storage.iloc[0])
    assert ranked[0] == tied_storage
    counts = tt.groupby("storage").size() + tt.groupby("storage").writes.sum() * 10
    assert [counts[s] for s in ranked[1:]] == sorted((counts[s] for s in ranked[1:]), reverse=True)
    assert counts[ranked[1]] == counts.drop(tied_storage).max()


def test_module_ids_resolve_folded_paths(gpt2_trace):
    from fakeviz._analysis.selection import module_ids

    modules = list(gpt2_trace.strings("modules"))
    ids = module_ids(gpt2_trace, "GPT2LMHeadModel.transformer.h.1.mlp")
    assert {modules[i] for i in ids} == {
        "GPT2LMHeadModel.transformer.h.1.mlp" + s for s in ("", ".c_fc", ".c_proj", ".act", ".dropout")
    } & set(modules)
    folded = module_ids(gpt2_trace, "GPT2LMHeadModel.transformer.h.0-1.mlp")  # a folded tree path: its first member
    assert {modules[i] for i in folded} == {m.replace(".h.1.", ".h.0.") for m in (modules[i] for i in ids)}
    assert len(module_ids(gpt2_trace, "GPT2LMHeadModel.nothing")) == 0 and len(module_ids(gpt2_trace, "")) == 0


def test_selecting_a_module_redraws_the_alias_graph_around_it(gpt2_trace):
    """A selection (from the browser or Python) redraws the neighbourhood: the module's
    parameters, their gradients, and its largest activations; clearing it goes back."""
    from fakeviz._views.explorer import Explorer

    w = Explorer.from_trace(gpt2_trace, alias_nodes=60)
    default = w.alias
    w.selected_module = "GPT2LMHeadModel.transformer.h.0-1.mlp"
    meta, a, s = w.decoded("alias")
    assert w.alias != default and meta["around"].startswith("GPT2LMHeadModel.transformer.h.0-1.mlp")
    kinds = [meta["node_kinds"][k] for k in a["node_kind"]]
    names = {s["label"][i] for i, k in enumerate(kinds) if k == "name"}
    mlp = "GPT2LMHeadModel.transformer.h.0.mlp."
    assert names == {mlp + p for p in ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias")}
    st = gpt2_trace.storages.set_index("storage")
    cats = {st.category[r] for r, k in zip(a["node_ref"].tolist(), kinds) if k == "storage"}
    assert {"Parameter", "Gradient"} <= cats and cats & {"Activation", "Temporary"}
    # every storage shown belongs to the module (linked back to the tree)
    modules = gpt2_trace.strings("modules")
    assert all(modules[a["node_module"][i]].startswith(mlp[:-1]) for i, k in enumerate(kinds) if k == "storage")
    w.selected_module = ""
    assert w.alias == default
    # a fixed neighbourhood stays put
    fixed = Explorer.from_trace(gpt2_trace, alias_nodes=60, around="lm_head.weight")
    before = fixed.alias
    fixed.selected_module = "GPT2LMHeadModel.transformer.h.0.mlp"
    assert fixed.alias == before


def test_summary_has_peaks_capacity_and_verdict(explorer, gpt2_trace):
    summary = explorer.summary
    v = gpt2_trace.verdict("24GB")
    assert summary["capacity"] == v["capacity"] and summary["capacity_spec"] == "24GB"
    assert summary["verdict"]["text"] == v["text"] and summary["verdict"]["fits"]
    pk = gpt2_trace.peak()["cuda:0"]
    assert summary["peaks"]["cuda:0"]["bytes"] == pk.bytes
    assert summary["peaks"]["cuda:0"]["by_category"] == pk.by_category
    assert summary["categories"] == list(fv.CATEGORIES)


def test_summary_carries_the_python_palette(explorer):
    """The panel's colours are Python's: summary["palette"] is fakeviz._core.palette.palette() (plus the
    colour of each tree key), which js/src/palette.js sets as CSS custom properties."""
    from fakeviz._core.palette import CATEGORY_COLORS, PHASE_COLORS, palette

    sent = dict(explorer.summary["palette"])
    tree = sent.pop("tree")
    assert sent == palette()
    assert sent["categories"] == [CATEGORY_COLORS[c] for c in explorer.summary["categories"]]
    assert sent["phases"] == [PHASE_COLORS[p] for p in explorer.summary["phases"]]
    _, _, strings = explorer.decoded("tree")
    for color in ("device", "dtype"):
        assert len(tree[color]) == len(strings[f"color_{color}"]) and all(c.startswith("#") for c in tree[color])


def test_js_defines_no_data_colour():
    """No colour of the palette (categories, phases, edges, the cycle, the neutral one) is written in js/src:
    the explorer takes them from the summary, so Python's palette is the only definition."""
    from fakeviz._core.palette import palette

    p = palette()
    colors = {*p["categories"], *p["phases"], *p["edges"].values(), *p["cycle"], p["none"]}
    found = [
        (str(f.relative_to(JS)), c)
        for f in sorted((JS / "src").rglob("*"))
        if f.suffix in (".js", ".css")
        for c in sorted(colors)
        if c.lower() in f.read_text().lower()
    ]
    assert not found, f"palette colours defined again in js/src: {found}"


def test_ops_window_when_over_max_ops(bundle, gpt2_trace):
    """Above max_ops, the table gets the max_ops consecutive ops around the highest peak; the rest stays whole."""
    from fakeviz._views.explorer import Explorer

    w = Explorer.from_trace(gpt2_trace, max_ops=100, max_points=50)
    meta, a, _ = w.decoded("ops")
    peak = max(gpt2_trace.peak().values(), key=lambda p: p.bytes)
    assert meta["truncated"] and meta["stop"] - meta["start"] == 100 == len(a["seq"])
    assert meta["start"] <= peak.seq < meta["stop"]
    assert np.array_equal(a["seq"], np.arange(meta["start"], meta["stop"]))
    assert np.array_equal(a["flops"], gpt2_trace.col("flops")[meta["start"] : meta["stop"]])
    assert w.decoded("memory")[0]["n_ops"] == gpt2_trace.num_ops
    assert w.summary["capacity"] is None and w.summary["verdict"] is None


def test_empty_and_cpu_only_traces(bundle):
    from fakeviz._views.explorer import Explorer

    with fv.record() as empty:
        pass
    w = Explorer.from_trace(empty)
    assert w.summary["n_ops"] == 0 and w.summary["peaks"] == {}
    assert w.decoded("tree")[0]["rows"] == 0 and len(w.decoded("ops")[1]["seq"]) == 0
    with fv.record() as cpu:
        x = torch.randn(4, 4)
        (x @ x).relu().sum()
    w = Explorer.from_trace(cpu, "1GB")
    meta, arrays, _ = w.decoded("memory")
    assert [d["device"] for d in meta["devices"]] == ["cpu"] and not meta["devices"][0]["allocator"]
    assert w.summary["verdict"]["text"] == "no accelerator memory was used"
    assert sum(arrays[f"cpu/{c}"] for c in fv.CATEGORIES).max() == cpu.peak()["cpu"].bytes


def test_pack_encodings_round_trip():
    from fakeviz._views.payload import pack, unpack

    arrays = {
        "range": np.arange(5, 105),
        "const": np.zeros(7, np.int64),
        "small": np.array([-3, 0, 100], np.int64),
        "i32": np.arange(0, 10**7, 997, dtype=np.int64) * 3,
        "big_few": np.array([282248397320, 512] * 50, np.int64),
        "big_many": np.arange(100, dtype=np.int64) * 2**40,
        "floats": np.array([0.5, np.nan, -2.25]),
        "bools": np.array([True, False, True]),
        "empty": np.zeros(0, np.int64),
    }
    meta, out, strings = unpack(pack(arrays, strings={"s": ["<script>", "ü"]}, meta={"k": 1}))
    assert meta == {"k": 1} and strings == {"s": ["<script>", "ü"]}
    for k, v in arrays.items():
        np.testing.assert_array_equal(out[k], v.astype(np.float64) if k != "bools" else v.astype(np.int8), err_msg=k)
    header = json.loads(pack(arrays)[8:].split(b"\0", 1)[0].decode())
    enc = {k: v["enc"] for k, v in header["arrays"].items()}
    assert enc["range"] == "range" and enc["const"] == "const" and enc["big_few"] == "dict"
    assert header["arrays"]["small"]["dtype"] == "i1" and header["arrays"]["i32"]["dtype"] == "i4"
    with pytest.raises(ValueError, match="magic"):
        unpack(b"PK\x03\x04")


def test_decimation_rule():
    from fakeviz._analysis.memory import decimate_minmax

    rng = np.random.default_rng(0)
    v = np.cumsum(rng.integers(-5, 6, 50_000))
    idx = decimate_minmax(v, 1000, keep=(17,))
    assert len(idx) <= 1000 and (np.diff(idx) > 0).all()
    assert {0, len(v) - 1, int(np.argmax(v)), int(np.argmin(v)), 17} <= set(idx.tolist())
    assert np.array_equal(decimate_minmax(v[:10], 1000), np.arange(10))


@needs_npm
def test_js_decoder_reads_python_packs(explorer, tmp_path):
    """js/src/decode.js, run by node on the packs Python wrote, gives the same arrays."""
    from fakeviz._views.payload import SIZE_BY

    script = tmp_path / "dump.mjs"
    script.write_text(
        "import { readFileSync } from 'node:fs';\n"
        f"import {{ unpack }} from '{(JS / 'src' / 'decode.js').as_uri()}';\n"
        f"import {{ SIZE_BY }} from '{(JS / 'src' / 'format.js').as_uri()}';\n"
        "const out = { sizeBy: Object.keys(SIZE_BY) };\n"
        "for (const name of process.argv.slice(2)) {\n"
        "  const p = unpack(readFileSync(name));\n"
        "  out[name] = { meta: p.meta, strings: p.strings,\n"
        "    arrays: Object.fromEntries(Object.entries(p.arrays).map(([k, v]) => [k, Array.from(v)])) };\n"
        "}\n"
        "process.stdout.write(JSON.stringify(out));\n"
    )
    names = {}
    for trait in ("tree", "memory", "ops", "alias"):
        f = tmp_path / f"{trait}.bin"
        f.write_bytes(getattr(explorer, trait))
        names[trait] = str(f)
    proc = subprocess.run(["node", str(script), *names.values()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    js = json.loads(proc.stdout)
    assert js["sizeBy"] == list(SIZE_BY)  # what the panel offers is what the trait accepts
    for trait, f in names.items():
        meta, arrays, strings = explorer.decoded(trait)
        assert js[f]["meta"] == meta and js[f]["strings"] == strings
        assert set(js[f]["arrays"]) == set(arrays)
        for k, v in arrays.items():
            np.testing.assert_array_equal(
                np.array(js[f]["arrays"][k], dtype=np.float64), v.astype(np.float64), err_msg=k
            )


# ------------------------------------------------------------------------- size
@pytest.mark.slow
@needs_fake_cuda
def test_state_size_llama3_70b(bundle):
    """The whole explorer of a Llama-3-70B fwd+bwd trace (seq 2048, fake cuda:0) saves in well under 2 MB."""
    from fakeviz import models
    from fakeviz._views.explorer import Explorer

    cfg = models.config("llama3-70b")
    with fv.record(device="cuda:0") as trace:
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (1, 2048))
        model(ids, labels=ids).loss.backward()
    del model
    w = Explorer.from_trace(trace, "H100")
    (plain, _, buffers), size = _wire(w.get_state())
    per_trait = {k: len(getattr(w, k)) for k in ("tree", "memory", "ops", "alias")}
    json_bytes = len(json.dumps({k: v for k, v in plain.items() if k not in ("_esm", "_css")}))
    print(f"\n70B explorer state: {size} bytes saved ({trace.num_ops} ops), buffers {per_trait}, "
          f"JSON {json_bytes} bytes, _esm {len(plain['_esm'])} bytes, _css {len(plain['_css'])} bytes")  # fmt: skip
    assert size < 2_000_000
    assert json_bytes < 20_000  # no per-op JSON: the summary only
    meta, arrays, _ = w.decoded("memory")
    assert meta["devices"][0]["points"] <= 4000
    pk = trace.peak()["cuda:0"]
    total = sum(arrays[f"cuda:0/{c}"] for c in fv.CATEGORIES)
    assert total.max() == pk.bytes and arrays["cuda:0/seq"][int(np.argmax(total))] == pk.seq
    assert w.summary["verdict"]["fits"] is False


# ------------------------------------------------------------------------- JS and the build
@needs_npm
def test_vitest():
    """The browser-side unit tests (decoding, decimation, filtering, layout, formatting, a jsdom render)."""
    _npm_install()
    proc = _npm("test")  # vitest exits non-zero on any failure
    assert "passed" in proc.stdout


@needs_npm
@pytest.mark.slow
def test_wheel_contains_bundle(tmp_path):
    """A wheel built from a clean copy of the sources (no bundle, no node_modules) carries the built JS."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", ".gitignore"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("static", "node_modules", "__pycache__", "*.pyc")
    shutil.copytree(ROOT / "fakeviz", src / "fakeviz", ignore=ignore)
    shutil.copytree(ROOT / "js", src / "js", ignore=ignore)
    assert not (src / "fakeviz" / "static").exists()
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(out), "--no-deps", "-q"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (wheel,) = out.glob("fakeviz-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        js = zf.read("fakeviz/static/explorer.js").decode()
    assert {"fakeviz/static/explorer.js", "fakeviz/static/explorer.css", "fakeviz/_views/explorer.py"} <= names
    assert not any("node_modules" in n or n.startswith("js/") for n in names)
    assert "render" in js and len(js) > 10_000


def test_tree_colour_keys_follow_the_parameters(bundle):
    """The tree's colour keys name the device / dtype holding most of each module's parameter
    bytes, as the plotly layer tree colours them."""
    from fakeviz import views
    from fakeviz._core.palette import palette
    from fakeviz._views.explorer import Explorer

    class Hybrid(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(8, 8, device="cuda:0")
            self.fc2 = torch.nn.Linear(8, 64, dtype=torch.float16)
            self.act = torch.nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x.cuda())).cpu().half())

    with fv.record() as trace:
        Hybrid()(torch.randn(2, 8)).float().sum().backward()
    widget = Explorer.from_trace(trace)
    meta, a, s = widget.decoded("tree")
    paths = s["path"]
    device = dict(zip(paths, (s["color_device"][i] for i in a["color_device"])))
    dtype = dict(zip(paths, (s["color_dtype"][i] for i in a["color_dtype"])))
    assert device["Hybrid.fc1"] == "cuda:0" and device["Hybrid.fc2"] == "cpu"
    assert device["Hybrid"] == "cpu"  # fc2: 64x8 + 64 half = 1152 B, fc1: 8x8 + 8 float = 288 B
    assert dtype["Hybrid.fc1"] == "f32" and dtype["Hybrid.fc2"] == "f16"
    assert device["Hybrid.act"] == dtype["Hybrid.act"] == "no parameters"
    for color, got in (("device", device), ("dtype", dtype)):
        data = views.tree_data(trace, color=color)
        assert dict(zip(data.table["path"], data.table["color_key"])) == got
        # and the panel paints each key in the plotly figure's colour (the neutral one for "no parameters")
        colors = dict(zip(s[f"color_{color}"], widget.summary["palette"]["tree"][color]))
        assert colors == {k: data.colors[k] for k in colors}
        assert colors["no parameters"] == palette()["none"]


def test_tree_names_the_precision_of_the_weights(bundle):
    """Each tree row carries the folded tree's ``precision`` (Note: [weight precision]) and a colour key for it."""
    from fakeviz._core.palette import palette
    from fakeviz._views.explorer import Explorer

    class Half(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8, dtype=torch.float16) for _ in range(3)])
            self.head = torch.nn.Linear(8, 4)
            self.act = torch.nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = self.act(b(x))
            return self.head(x.float())

    with fv.record(device="cuda:0") as trace:
        Half()(torch.randn(2, 8, dtype=torch.float16, device="cuda:0")).sum().backward()
    widget = Explorer.from_trace(trace)
    _, a, s = widget.decoded("tree")
    folded = trace.folded_modules()
    assert s["precision"] == folded["precision"].tolist()
    got = dict(zip(s["path"], s["precision"]))
    assert got == {"Half": "mixed", "Half.blocks": "fp16", "Half.blocks.0-2": "fp16", "Half.head": "fp32",
                   "Half.act": ""}  # fmt: skip
    keys = [s["color_precision"][i] for i in a["color_precision"]]
    assert keys == [p or "no parameters" for p in s["precision"]]
    colors = dict(zip(s["color_precision"], widget.summary["palette"]["tree"]["precision"]))
    assert colors["no parameters"] == palette()["none"] and len(set(colors.values())) == len(colors)
