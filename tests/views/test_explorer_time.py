"""The explorer's time axis (issue 32): the ``time`` pack carries every op's estimated time on one GPU.

Checked against ``Trace.time(gpu)`` and ``Trace.step_time(gpu)`` of the same record (Note: [time model] in
``fakeviz/_analysis/timing.py``): the payload ships ``end_s`` and ``est_s`` as float32 and class and bound as one
int8 per op; the panel reads them (``js/src/data.js``, run here by node), the ``gpu`` trait re-estimates them and
``x_axis`` picks the axis. The browser side is in ``js/test/time.test.js`` and ``render.test.js`` (vitest:
``tests/views/test_explorer.py::test_vitest``) and ``tests/browser/test_timeline_time.py`` (Chromium).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from js_bundle import ensure_bundle  # tests/ is on sys.path (tests/conftest.py)

import fakeviz as fv

warnings.filterwarnings("ignore", message=".*loss_type=None.*")

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "js"


@pytest.fixture(scope="module")
def bundle() -> Path:
    """The built bundle (js_bundle.ensure_bundle, as tests/views/test_explorer.py builds it): the widget needs it."""
    out = ensure_bundle()
    if out is None:
        pytest.skip("npm is not installed and fakeviz/static/explorer.js was never built")
    return out


def _gpt2_step(gpu: str | None = None) -> fv.Trace:
    """GPT-2 (2 layers, 1024 wide, batch 8 x 512: big enough for compute- and memory-bound kernels) fwd + bwd + AdamW
    step on fake cuda:0 (cpu without the shim)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    device = "cuda:0" if fv.fake_cuda_status().cuda_ok else "cpu"
    cfg = GPT2Config(
        n_layer=2, n_embd=1024, n_head=16, vocab_size=8192, n_positions=512, bos_token_id=0, eos_token_id=0
    )
    with fv.record(device=device, **({"gpu": gpu} if gpu else {})) as trace:
        torch.manual_seed(0)
        m = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, 8192, (8, 512))
        m(ids, labels=ids).loss.backward()
        torch.optim.AdamW(m.parameters()).step()
    return trace


@pytest.fixture(scope="module")
def trace() -> fv.Trace:
    return _gpt2_step()


def _decoded_times(pack_meta: dict, arrays: dict) -> tuple[np.ndarray, list[str], list[str]]:
    """Per op: own time (0 for untimed ops), kernel class and bound, from the pack's columns."""
    bounds, classes = pack_meta["bounds"], pack_meta["classes"]
    code = arrays["code"].astype(np.int64)
    cls = [classes[c // len(bounds)] for c in code]
    bound = [bounds[c % len(bounds)] for c in code]
    est = np.zeros(len(code), np.float32)
    timed = np.array([c != pack_meta["untimed"] for c in cls], bool)
    est[timed] = arrays["est_s"]
    return est, cls, bound


def test_time_pack_is_the_trace_times(bundle, trace):
    """``end_s`` is ``trace.time(gpu)["end_s"]`` (as float32), ``est_s``/class/bound are its columns, the meta is
    ``trace.step_time(gpu)``; a record without a GPU is timed on an H100."""
    from fakeviz._views.explorer import Explorer

    w = Explorer.from_trace(trace, "24GB")
    assert w.gpu == "H100" and w.x_axis == "op"
    meta, arrays, _ = w.decoded("time")
    df = trace.time("H100")
    n = trace.num_ops
    assert meta["n_ops"] == n == len(arrays["end_s"]) == len(arrays["code"])
    assert arrays["end_s"].dtype == np.float32 and arrays["est_s"].dtype == np.float32
    assert np.array_equal(arrays["end_s"], df["end_s"].to_numpy().astype(np.float32))
    np.testing.assert_allclose(arrays["end_s"], df["end_s"].to_numpy(), rtol=1e-6, atol=0)
    est, cls, bound = _decoded_times(meta, arrays)
    assert np.array_equal(est, df["est_s"].to_numpy().astype(np.float32))
    assert cls == df["cls"].astype(str).tolist()
    assert bound == df["bound"].astype(str).tolist()
    assert {"gemm", "elementwise", "foreach"} <= set(cls) and {"compute", "memory", "latency"} <= set(bound)
    # the ops of no time (views) have no est_s entry: the pack is smaller than one float per op
    assert len(arrays["est_s"]) == sum(c != "none" for c in cls) < n
    step = trace.step_time("H100")
    assert meta["gpu"] == step.gpu == "H100"
    assert meta["step_s"] == pytest.approx(step.step_s, rel=1e-12) and meta["bound"] == step.bound
    assert meta["gpu_s"] == pytest.approx(step.gpu_s, rel=1e-12)
    assert "H100" in meta["source"]


def test_which_gpu_times_the_axis(bundle, trace):
    """``gpu=`` first, then the GPU the capacity names, then the record's GPU, then an H100; ``False``: no times."""
    from fakeviz._views.explorer import Explorer

    on_l4 = _gpt2_step(gpu="L4")
    assert Explorer.from_trace(on_l4).gpu == "L4"
    assert Explorer.from_trace(on_l4, "80GB").gpu == "L4"  # a size names no GPU
    assert Explorer.from_trace(on_l4, "A100").gpu == "A100"  # the GPU the verdict is against
    assert Explorer.from_trace(on_l4, "A100", gpu="h200").gpu == "H200"
    w = Explorer.from_trace(trace, gpu="A100 40GB")
    meta, arrays, _ = w.decoded("time")
    assert meta["gpu"] == w.gpu == "A100 40GB"
    assert np.array_equal(arrays["end_s"], trace.time("A100 40GB")["end_s"].to_numpy().astype(np.float32))
    # an A100 is slower than an H100 on the same step
    assert meta["step_s"] > Explorer.from_trace(trace).decoded("time")[0]["step_s"]
    with pytest.raises(ValueError, match="gpu") as err:
        Explorer.from_trace(trace, gpu="H1000")
    assert "H100" in str(err.value)
    bare = Explorer.from_trace(trace, gpu=False)
    assert bare.time == b"" and bare.gpu == ""


def test_gpu_and_x_axis_traits(bundle, trace):
    """Setting ``gpu`` re-estimates the times on that GPU (live kernel); both traits are validated."""
    import traitlets

    from fakeviz._views.explorer import Explorer

    w = Explorer.from_trace(trace, x_axis="time")
    assert w.x_axis == "time"
    before = w.time
    w.gpu = "l40s"
    assert w.gpu == "L40S" and w.time != before
    meta, arrays, _ = w.decoded("time")
    assert meta["gpu"] == "L40S"
    assert np.array_equal(arrays["end_s"], trace.time("L40S")["end_s"].to_numpy().astype(np.float32))
    with pytest.raises(traitlets.TraitError, match="not a GPU fakeviz knows"):
        w.gpu = "H1000"
    with pytest.raises(traitlets.TraitError, match="a memory size"):
        w.gpu = "80GB"
    assert w.gpu == "L40S"
    with pytest.raises(traitlets.TraitError, match="x_axis"):
        w.x_axis = "seconds"
    w.gpu = ""
    assert w.time == b""
    # the facade passes both through
    e = trace.explore("H100", gpu="A100", x_axis="time")
    assert (e.gpu, e.x_axis, e.decoded("time")[0]["gpu"]) == ("A100", "time", "A100")


def test_state_round_trip_keeps_the_times(bundle, trace):
    """Through the comm's JSON + buffers into a fresh widget (what a saved notebook reloads)."""
    from ipywidgets.widgets.widget import _put_buffers, _remove_buffers

    from fakeviz._views.explorer import Explorer

    w = Explorer.from_trace(trace, gpu="H200", x_axis="time")
    plain, paths, buffers = _remove_buffers(w.get_state())
    plain = json.loads(json.dumps(plain))
    _put_buffers(plain, paths, [memoryview(bytes(b)) for b in buffers])
    fresh = Explorer()
    fresh.set_state(plain)  # no trace behind it: the gpu trait does not recompute
    assert (fresh.time, fresh.gpu, fresh.x_axis) == (w.time, "H200", "time")
    assert fresh.get_state() == w.get_state()


def test_report_carries_the_times(bundle, trace, tmp_path):
    """``trace.to_html`` ships the same time pack as the widget (the offline report's switch)."""
    import re

    from fakeviz._views.explorer import Explorer

    html = trace.to_html(tmp_path / "r.html").read_text()
    state = json.loads(re.search(r"<script type='application/json' id='fv-state'>(.*?)</script>", html, re.S).group(1))
    assert "time" in state["__binary__"]
    assert base64.b64decode(state["traits"]["time"]) == Explorer.from_trace(trace).time


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_js_reads_the_time_pack(bundle, trace, tmp_path):
    """``js/src/data.js``'s readTime, run by node on the pack Python wrote, gives each op's end, own time, class and
    bound, and an axis that keeps the op order."""
    from fakeviz._views.explorer import Explorer

    w = Explorer.from_trace(trace, gpu="H100")
    f = tmp_path / "time.bin"
    f.write_bytes(w.time)
    script = tmp_path / "read.mjs"
    script.write_text(
        "import { readFileSync } from 'node:fs';\n"
        f"import {{ unpack }} from '{(JS / 'src' / 'decode.js').as_uri()}';\n"
        f"import {{ readTime }} from '{(JS / 'src' / 'data.js').as_uri()}';\n"
        "const t = readTime(unpack(readFileSync(process.argv[2])));\n"
        "const all = (f) => Array.from({ length: t.n }, (_, i) => f(i));\n"
        "process.stdout.write(JSON.stringify({ gpu: t.gpu, step: t.stepS, end: Array.from(t.end),\n"
        "  est: Array.from(t.est), cls: all(t.cls), bound: all(t.boundOf), edge: Array.from(t.edge) }));\n"
    )
    proc = subprocess.run(["node", str(script), str(f)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    js = json.loads(proc.stdout)
    df = trace.time("H100")
    assert js["gpu"] == "H100" and js["step"] == trace.step_time("H100").step_s
    assert np.array_equal(np.array(js["end"], np.float32), df["end_s"].to_numpy().astype(np.float32))
    assert np.array_equal(np.array(js["est"], np.float32), df["est_s"].to_numpy().astype(np.float32))
    assert js["cls"] == df["cls"].astype(str).tolist() and js["bound"] == df["bound"].astype(str).tolist()
    edge = np.array(js["edge"])
    assert edge[0] == 0 and (np.diff(edge) >= 0).all() and len(edge) == trace.num_ops + 1
    # one stream, no collectives: every op sits at its own end
    assert np.array_equal(edge[1:].astype(np.float32), df["end_s"].to_numpy().astype(np.float32))


@pytest.mark.slow
@pytest.mark.skipif(not fv.fake_cuda_status().cuda_ok, reason="no fake cuda in this process")
def test_time_pack_size_llama3_70b(bundle):
    """On a Llama-3-70B fwd+bwd record (seq 2048) the times add about 7 bytes per op: under 40 % of the other packs."""
    from fakeviz import models
    from fakeviz._views.explorer import Explorer

    cfg = models.config("llama3-70b")
    with fv.record(device="cuda:0") as trace:
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (1, 2048))
        model(ids, labels=ids).loss.backward()
    del model
    w = Explorer.from_trace(trace, "H100")
    others = sum(len(getattr(w, k)) for k in ("tree", "memory", "ops", "alias"))
    added = len(w.time)
    n = trace.num_ops
    print(f"\n70B: {n} ops, time pack {added} bytes ({added / n:.1f} B/op), other packs {others} bytes "
          f"(+{100 * added / others:.0f} %)")  # fmt: skip
    assert added < 8 * n and added < 0.4 * others
    assert Explorer.from_trace(trace, "H100", gpu=False).time == b""
    meta, arrays, _ = w.decoded("time")
    assert np.array_equal(arrays["end_s"], trace.time("H100")["end_s"].to_numpy().astype(np.float32))
    assert meta["step_s"] == pytest.approx(trace.step_time("H100").step_s)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_js_seconds_are_pythons(tmp_path):
    """The panel's ``fmtSeconds`` (js/src/format.js) writes what ``fakeviz._core.fmt.format_seconds`` writes."""
    from fakeviz._core.fmt import format_seconds

    values = [0, 1.689, 0.512, 0.0123, 12.3e-6, 1.5e-7, 9.99999e-6, 0.9996, 999.6e-6, 1234.5, 0.125, 2.5e-3, -0.0042,
              float(np.float32(1e-5)), 3e-9, 59.99]  # fmt: skip
    script = tmp_path / "fmt.mjs"
    script.write_text(
        f"import {{ fmtSeconds }} from '{(JS / 'src' / 'format.js').as_uri()}';\n"
        f"process.stdout.write(JSON.stringify({json.dumps(values)}.map(fmtSeconds)));\n"
    )
    proc = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [format_seconds(v) for v in values]
