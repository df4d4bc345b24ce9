"""``%%fake`` through a real IPython InteractiveShell: errors are asserted from results, not from printed text."""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402

from fakeviz._frontends.magic import FakeMagics  # noqa: E402


def run(ip, code: str):
    result = ip.run_cell(code, store_history=False)
    return result


def test_cell_runs_fake_keeps_variables_and_trace(ip, capsys):
    r = run(
        ip,
        "%%fake --device cuda:0 --dtype bfloat16 -o trace\nm = torch.nn.Linear(64, 32)\ny = m(torch.randn(4, 64))\ny.sum().backward()\n",
    )
    assert r.error_in_exec is None
    ns = ip.user_ns
    assert fv.is_fake(ns["m"].weight) and ns["m"].weight.device == torch.device("cuda", 0)
    assert ns["m"].weight.dtype == torch.bfloat16 and ns["m"].weight.grad is not None
    trace = ns["trace"]
    assert isinstance(trace, fv.Trace) and trace.num_ops > 5
    assert {"init", "forward", "backward"} <= set(trace.ops.phase)
    assert torch.get_default_dtype() == torch.float32
    assert not fv.is_fake(torch.ones(1))  # the next normal code computes real tensors


def test_session_lasts_across_cells_and_reset(ip):
    assert run(ip, "%%fake -d cuda:1\nm = torch.nn.Linear(8, 8)\n").error_in_exec is None
    r = run(ip, "%%fake -d cuda:1 -o t2\nz = m(torch.randn(2, 8))\n")
    assert r.error_in_exec is None and fv.is_fake(ip.user_ns["z"])
    t2 = ip.user_ns["t2"]
    assert t2.ops.op.str.contains("addmm").any()
    # the module was registered with its parameters on first use in the second cell
    assert set(t2.storages[t2.storages.category == "Parameter"].name) == {"Linear.weight", "Linear.bias"}
    # a different session is a different fake mode (torch converts the other session's tensors)
    r = run(ip, "%%fake --session other -d cuda:1\nw = m(torch.randn(2, 8))\n")
    assert r.error_in_exec is None
    assert ip.user_ns["w"].fake_mode is not ip.user_ns["z"].fake_mode
    assert not fv.is_fake(torch.ones(1))
    ip.run_line_magic("fake_reset", "")
    assert ip.magics_manager.registry["FakeMagics"].sessions == {}


def test_default_output_name_and_semicolon_and_no_display(ip, capsys):
    r = run(ip, "%%fake\nx = torch.ones(3) * 2\n")
    assert r.error_in_exec is None and isinstance(ip.user_ns["_fake"], fv.Trace)
    shown = capsys.readouterr().out
    assert "fakeviz" in shown  # the trace was displayed
    run(ip, "%%fake -o t1\nx = torch.ones(3) * 2;\n")
    assert "fakeviz" not in capsys.readouterr().out
    run(ip, "%%fake -o t1 --no-display\nx = torch.ones(3) * 2\n")
    assert "fakeviz" not in capsys.readouterr().out and ip.user_ns["t1"].num_ops == 2


def test_verdict_gpu_and_capacity(ip, capsys):
    run(ip, "%%fake -d cuda:0 --gpu H100 -o t1\nx = torch.empty(1024, 1024, 1024, dtype=torch.bfloat16)\n")
    t1 = ip.user_ns["t1"]
    v = t1.verdict(t1.meta["capacity"])
    assert v["fits"] and v["devices"]["cuda:0"]["peak"] == 2 * 2**30
    run(
        ip,
        "%%fake -d cuda:0 --capacity 1GiB -o t1 --session cap\nx = torch.empty(1024, 1024, 1024, dtype=torch.bfloat16)\n",
    )
    v = ip.user_ns["t1"].verdict(ip.user_ns["t1"].meta["capacity"])
    assert not v["fits"] and v["text"].startswith("does not fit 1.0 GiB")
    r = run(ip, "%%fake --gpu NoSuchGPU\nx = 1\n")
    assert isinstance(r.error_in_exec, UsageError) and "unknown GPU" in str(r.error_in_exec)


def test_real_option_records_real_tensors(ip):
    r = run(ip, "%%fake --real -o t1\nx = torch.ones(3) * 2\n")
    assert r.error_in_exec is None
    assert not fv.is_fake(ip.user_ns["x"]) and ip.user_ns["x"].sum().item() == 6
    assert ip.user_ns["t1"].meta["fake"] is False


def test_failing_cell_keeps_partial_trace_banner_and_clean_state(ip, capsys):
    r = run(ip, "%%fake -o t3\nx = torch.ones(4) * 3\nraise ValueError('boom')\n")
    err = r.error_in_exec
    assert isinstance(err, ValueError) and str(err) == "boom"  # the cell's own error, named as the user wrote it
    t3 = ip.user_ns["t3"]
    assert err.fakeviz_trace is t3 and t3.num_ops == 2 and t3.error["type"] == "ValueError"
    assert "ValueError" in t3._repr_html_() and "boom" in t3._repr_html_()  # the banner names the same error
    out = capsys.readouterr()
    assert "ValueError" in out.out + out.err and "boom" in out.out + out.err
    assert torch._guards.detect_fake_mode() is None and not fv.is_fake(torch.ones(1))


def test_data_dependent_cell_explains(ip):
    r = run(ip, "%%fake -o t3\nx = torch.empty(3)\nif x.sum() > 0:\n    pass\n")
    err = r.error_in_exec
    assert isinstance(err, fv.DataDependentError)
    assert "fake tensors carry no data" in str(err) or "does not know" in str(err)
    assert "if x.sum() > 0" in str(err)
    assert ip.user_ns["t3"].error["op"] == "aten._local_scalar_dense.default"
    assert ip.user_ns["t3"].error["type"] == "DataDependentError"


def test_keyboard_interrupt_leaves_clean_state(ip):
    r = run(ip, "%%fake -o t3\nx = torch.ones(2)\nraise KeyboardInterrupt\n")
    assert isinstance(r.error_in_exec, KeyboardInterrupt)
    assert ip.user_ns["t3"].num_ops == 1
    assert torch._guards.detect_fake_mode() is None and not fv.is_fake(torch.ones(1))


def test_dollar_stays_literal_and_attention_option(ip):
    r = run(
        ip,
        "%%fake -o t1 --attention math\nprice = '$HOME'\nq = torch.randn(1, 2, 4, 8)\no = torch.nn.functional.scaled_dot_product_attention(q, q, q)\n",
    )
    assert r.error_in_exec is None and ip.user_ns["price"] == "$HOME"
    t1 = ip.user_ns["t1"]
    assert t1.meta["attention"] == "math"
    assert not t1.ops.op.str.contains("flash").any()


def test_nested_and_repeated_cells(ip):
    code = "%%fake -o t1\nx = torch.ones(2)\nget_ipython().run_cell_magic('fake', '-o t2', 'y = x * 2')\nz = y + 1\n"
    r = run(ip, code)
    assert r.error_in_exec is None
    assert ip.user_ns["t2"] is ip.user_ns["t1"]  # the nested cell recorded into the enclosing trace
    assert [o for o in ip.user_ns["t1"].ops.op] == ["aten.ones.default", "aten.mul.Tensor", "aten.add.Tensor"]
    for _ in range(3):
        assert run(ip, "%%fake -o t3\nx = torch.ones(2) + 1\n").error_in_exec is None


def test_config_defaults_and_help(ip):
    ip.run_line_magic("config", 'FakeMagics.device = "cuda:5"')
    try:
        run(ip, "%%fake -o t1\nx = torch.ones(2)\n")
        assert ip.user_ns["x"].device == torch.device("cuda", 5)
    finally:
        ip.run_line_magic("config", "FakeMagics.device = None")
    doc = FakeMagics.fake.__doc__
    assert "%%fake [" in doc and "%fake [" not in doc.replace("%%fake [", "")
    for opt in (
        "--device",
        "--dtype",
        "--gpu",
        "--capacity",
        "--output",
        "--real",
        "--no-display",
        "--attention",
        "--session",
        "--symbolic",
        "--tb",
    ):
        assert opt in doc


def test_unload_removes_magics(ip):
    ip.run_line_magic("unload_ext", "fakeviz")
    assert "fake" not in ip.magics_manager.magics["cell"]
    assert not {"fake_reset", "fake_trace", "fake_tb"} & set(ip.magics_manager.magics["line"])
    ip.run_line_magic("load_ext", "fakeviz")  # the fixture unloads again


def test_engine_imports_no_ipython():
    import subprocess
    import sys

    code = "import sys, fakeviz, fakeviz.models; import fakeviz._engine.recorder; print(any(m.startswith(('IPython', 'ipywidgets')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
