"""``fakeviz report`` on the command line, in a subprocess and in-process.

The figures the CLI prints and writes are checked against the same run made with the API (``fv.record``
around ``fakeviz.models.build`` and the same steps): the CLI adds no figure of its own. Usage errors are
one line on stderr and exit code 2, without a traceback unless ``--verbose``. Models are catalog entries
cut to one or two layers with ``--set``, so each run records a few hundred ops.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fakeviz as fv
from fakeviz import models
from fakeviz._frontends.cli import gpus_option, main

ROOT = Path(__file__).resolve().parents[2]
TINY_GPT2 = ["gpt2", "--set", "n_layer=1", "--seq", "16"]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "fakeviz", *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )


def test_report_in_a_subprocess(tmp_path):
    html, js = tmp_path / "out.html", tmp_path / "out.json"
    r = _cli("report", *TINY_GPT2, "--train", "--steps", "1", "--gpus", "8xH100", "--progress",
             "--html", str(html), "--json", str(js))  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "GPT2LMHeadModel" in out and "parameters" in out and "peak per device" in out
    assert "verdict: fits: cuda:0 peaks at" in out and "train, 1 step, adamw" in out
    assert "recording" in r.stderr  # the progress line, asked for with --progress (stderr is not a terminal)
    assert "Traceback" not in r.stderr
    page = html.read_text()
    assert page.startswith("<!doctype html>") or page.lower().startswith("<!doctype html")
    assert "<script src=" not in page  # self-contained
    data = json.loads(js.read_text())
    assert data["gpus"] == 8 and data["capacity"] == "H100" and data["verdict"]["fits"] is True
    dev = data["devices"]["cuda:0"]
    assert dev["by_category"]["Gradient"] > 0 and dev["by_category"]["Optimizer state"] > 0


def test_no_progress_line_when_not_asked(tmp_path):
    r = _cli("report", *TINY_GPT2)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # stderr is a pipe: no progress line, nothing else
    assert "inference forward" in r.stdout


def _api_run(train: bool, generate: int = 0) -> tuple[fv.Trace, int]:
    """What the CLI does, with the API: build outside the recording, record the run."""
    gc.collect()
    model = models.build("gpt2", device="cuda:0", n_layer=1)
    n_params = sum(p.numel() for p in model.parameters())
    with fv.record(device="cuda:0", gpu="H100", gpus=1, modules=[model]) as trace:
        if train:
            model.train()
            batch = models.inputs(model, batch=2, seq=16, labels=True)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
            for _ in range(2):
                out = model(**batch)
                loss = out["loss"]
                loss.backward()
                del out, loss
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            model.eval()
            batch = models.inputs(model, batch=2, seq=16, labels=False)
            with torch.no_grad():
                model.generate(**batch, max_new_tokens=generate, min_new_tokens=generate, do_sample=False,
                               num_beams=1, cache_implementation="dynamic", pad_token_id=50256)  # fmt: skip
        del model
    return trace, n_params


@pytest.mark.parametrize("mode", ["train", "generate"])
def test_report_equals_the_api_run(tmp_path, capsys, mode):
    js = tmp_path / "r.json"
    extra = ["--train"] if mode == "train" else ["--generate", "3"]
    rc = main(["report", *TINY_GPT2, "--batch", "2", *extra, "--json", str(js)])
    assert rc == 0
    data = json.loads(js.read_text())
    trace, n_params = _api_run(mode == "train", 3)
    assert data["parameters"] == n_params
    assert data["ops"] == trace.num_ops
    pk = trace.peak()["cuda:0"]
    dev = data["devices"]["cuda:0"]
    assert dev["tensors"] == pk.bytes and dev["by_category"] == {c: pk.by_category[c] for c in fv.CATEGORIES}
    assert dev["peak"] == trace.verdict("H100")["devices"]["cuda:0"]["peak"]
    if mode == "generate":
        assert [s[2] for s in data["steps"]] == ["prefill", "decode 1", "decode 2"]
        assert data["steps"] == trace.meta["steps"]
        assert trace.memory()["KV cache"].max() > 0
    out = capsys.readouterr().out
    assert f"{n_params / 1e9:,.3f} B" in out


def test_does_not_fit_names_the_first_op_that_fails(tmp_path, capsys):
    js = tmp_path / "r.json"
    rc = main(["report", *TINY_GPT2, "--train", "--steps", "1", "--capacity", "300MB", "--json", str(js)])
    assert rc == 0
    out = capsys.readouterr().out
    data = json.loads(js.read_text())
    assert data["verdict"]["fits"] is False
    o = data["devices"]["cuda:0"]["first_oom"]
    assert o is not None and o["seq"] >= 0
    assert o["where"].startswith(f"first fails at op {o['seq']:,} {o['op']} in ")
    # the verdict's one text, with the bytes it judged (Note: [the verdict] in fakeviz/_analysis/verdict.py)
    assert f"\nverdict: {data['verdict']['text']}\n" in out and data["verdict"]["text"].startswith("does not fit ")
    assert o["where"] in data["verdict"]["text"] and data["devices"]["cuda:0"]["judged"] > data["verdict"]["capacity"]


def test_unknown_model_suggests_near_names():
    r = _cli("report", "llama-3.1-450b")
    assert r.returncode == 2
    assert "unknown model 'llama-3.1-450b'" in r.stderr and "meta-llama/Llama-3.1-405B" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    v = _cli("report", "llama-3.1-450b", "--verbose")
    assert v.returncode == 2 and "Traceback" in v.stderr and "UnknownModelError" in v.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--batch", "0"], "--batch must be at least 1"),
        (["--seq", "x"], "--seq takes a whole number"),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
        (["--gpus", "8xH900"], "unknown GPU or capacity 'H900'"),
        (["--gpus", "100xH100"], "between 1 and 64 GPUs"),
        (["--capacity", "lots"], "--capacity 'lots'"),
        (["--gpus", "H100", "--capacity", "80GB"], "not allowed with argument --gpus"),
        (["--train", "--generate", "2"], "not allowed with argument --train"),
        (["--optimizer", "adamw"], "--optim needs --train"),
        (["--optim", "sgd"], "--optim needs --train"),
        (["--checkpointing"], "--checkpointing needs --train"),
        (["--cache", "static"], "--cache needs --generate"),
        (["--set", "n_layer"], "use KEY=VALUE"),
        (["--optimizer", "lion", "--train"], "--optim 'lion': not an optimizer fakeviz knows"),
        (["--optim", "adamw_8bit", "--train"], "did you mean 'adamw8bit'?"),
        (["--quant", "nf4", "--train"], "quantized weights do not train; add --lora RANK"),
        (["--quant", "q4"], "invalid choice: 'q4'"),
        (["--lora", "0"], "--lora must be at least 1"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(capsys, argv, says):
    assert main(["report", "gpt2", *argv]) == 2
    err = capsys.readouterr()
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fakeviz: error: ") and says in lines[0], err.err
    assert err.out == ""


def test_no_subcommand_is_a_usage_error(capsys):
    assert main([]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_gpus_option():
    assert gpus_option("8xH100") == (8, "H100")
    assert gpus_option("H100") == (1, "H100")
    assert gpus_option("2x80GB") == (2, "80GB")
    with pytest.raises(ValueError, match="unknown GPU"):
        gpus_option("4xH900")


def test_saved_trace_report_and_missing_file(tmp_path, capsys):
    fvz = tmp_path / "t.fvz"
    assert main(["report", *TINY_GPT2, "--save", str(fvz)]) == 0
    capsys.readouterr()
    assert main(["report", str(fvz), "--oplog", "3"]) == 0
    out = capsys.readouterr().out
    assert "ops recorded" in out and "peak memory per device" in out
    assert main(["report", str(tmp_path / "missing.fvz")]) == 2
    assert "no such trace file" in capsys.readouterr().err


def test_config_json_folder(tmp_path, capsys):
    """A folder with only a config.json is built from it (no weights): the same model as the catalog's."""
    cfg = models.config("gpt2", n_layer=1)
    cfg.save_pretrained(tmp_path)
    js = tmp_path / "r.json"
    assert main(["report", str(tmp_path), "--seq", "16", "--json", str(js)]) == 0
    folder = json.loads(js.read_text())
    assert main(["report", *TINY_GPT2, "--json", str(js)]) == 0
    named = json.loads(js.read_text())
    assert folder["parameters"] == named["parameters"] and folder["devices"] == named["devices"]


def test_demo_still_runs(tmp_path, capsys):
    out = tmp_path / "demo.fvz"
    assert main(["demo", "--layers", "1", "--seq", "16", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "B parameters, recorded in" in text and out.exists() and out.with_suffix(".html").exists()
    # one step (Note: [one step]): the demo's fwd+bwd without the model's build, as the report of its trace and
    # the page's time model (Trace.step_time) say it
    trace = fv.load(out)
    st = trace.step_time("H100")
    init = [fv._core.schema.PHASES[x] == "init" for x in trace.col("phase")]
    assert st.start > 0 and any(init[: st.start]) and not any(init[st.start :])
    line = next(x for x in text.splitlines() if x.startswith("time: "))
    assert f"step {fv._core.fmt.format_seconds(st.step_s)} on H100" in line and f"timed: {st.timed}" in line
    assert st.step_s < trace.step_time("H100", start=0).step_s
    # the page's "estimated step": the time pack its explorer state carries (fakeviz/_views/report.py)
    from fakeviz._views.payload import build_state, unpack

    meta = unpack(build_state(trace, gpu="H100")["time"])[0]
    assert meta["step_s"] == pytest.approx(st.step_s, rel=1e-12) and meta["timed"] == st.timed
    assert main(["report", str(out), "--gpus", "H100"]) == 0
    again = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("time: "))
    assert again.split(",")[0] == line.split(",")[0] and f"timed: {st.timed}" in again


# ------------------------------------------------------------------------- adapters and optimizers
TINY_LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip
TINY_LLAMA_ARGV = ["meta-llama/Llama-3.1-8B", *(a for k, v in TINY_LLAMA.items() for a in ("--set", f"{k}={v}")),
                   "--seq", "16", "--batch", "2"]  # fmt: skip


def _api_lora_run(optim: str, lora: int | None, quantization: str | None = None) -> tuple[fv.Trace, int]:
    """What ``[--lora R] --train --steps 1 --optim NAME [--quant Q]`` does, with the API and peft as a script uses
    them: the (quantized) model and its adapters made in one fake mode, one training step recorded."""
    peft = pytest.importorskip("peft")
    from transformers.optimization import Adafactor

    gc.collect()
    with fv.fake_mode(device="cuda:0"):
        model = models.build("meta-llama/Llama-3.1-8B", quantization=quantization, **TINY_LLAMA)
        if quantization is not None:
            peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        pm = model
        if lora is not None:
            pm = peft.get_peft_model(model, peft.LoraConfig(r=lora, target_modules="all-linear", task_type="CAUSAL_LM"))
    with fv.record(device="cuda:0", gpu="H100", gpus=1, modules=[model]) as trace:
        pm.train()
        batch = models.inputs(model, batch=2, seq=16, labels=True)
        params = [p for p in pm.parameters() if p.requires_grad]
        if optim == "adamw8bit_ao":
            import torchao.optim

            opt = torchao.optim.AdamW8bit(params, lr=1e-4)
        elif optim == "paged_adamw8bit":
            import bitsandbytes as bnb

            opt = bnb.optim.PagedAdamW8bit(params, lr=1e-4)
        else:
            opt = (torch.optim.AdamW(params, lr=1e-4) if optim == "adamw"
                   else Adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False))  # fmt: skip
        out = pm(**batch)
        out["loss"].backward()
        del out
        opt.step()
        opt.zero_grad(set_to_none=True)
        trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
        del model, pm, opt
    return trace, trainable


@pytest.mark.parametrize("optim", ["adamw", "adafactor", "adamw8bit_ao", "paged_adamw8bit"])
def test_lora_report_equals_the_api_run(tmp_path, capsys, optim):
    if optim.endswith("_ao"):
        pytest.importorskip("torchao")
    if optim.endswith("8bit"):
        pytest.importorskip("bitsandbytes")
    js = tmp_path / "r.json"
    rc = main(
        ["report", *TINY_LLAMA_ARGV, "--train", "--steps", "1", "--lora", "8", "--optim", optim, "--json", str(js)]
    )
    assert rc == 0
    data = json.loads(js.read_text())
    trace, trainable = _api_lora_run(optim, 8)
    assert data["lora"] == "LoRA r=8" and data["quantization"] is None and data["optimizer"] == optim
    assert data["trainable_parameters"] == trainable
    assert data["ops"] == trace.num_ops
    pk = trace.peak()["cuda:0"]
    dev = data["devices"]["cuda:0"]
    assert dev["tensors"] == pk.bytes and dev["by_category"] == {c: pk.by_category[c] for c in fv.CATEGORIES}
    grads = int(trace.memory(device="cuda:0", allocator=False)["Gradient"].max())
    assert grads == 4 * trainable  # the adapters' float32 gradients only
    out = capsys.readouterr().out
    assert f"LoRA r=8; {trainable:,} trainable" in out and f"train, 1 step, {optim}" in out


def test_qlora_report_equals_the_api_run(tmp_path, capsys):
    """``--quant nf4 --lora 8 --train --steps 1``: as a QLoRA script (NF4 weights, prepare_model_for_kbit_training,
    LoRA), recorded with the API."""
    pytest.importorskip("bitsandbytes")
    js = tmp_path / "r.json"
    rc = main(
        ["report", *TINY_LLAMA_ARGV, "--train", "--steps", "1", "--lora", "8", "--quant", "nf4", "--json", str(js)]
    )
    assert rc == 0
    data = json.loads(js.read_text())
    trace, trainable = _api_lora_run("adamw", 8, quantization="nf4")
    assert data["quantization"] == "nf4" and data["lora"] == "LoRA r=8"
    # MFU's peak: the dtypes the matmuls ran in (Note: [model FLOPs]): the NF4 base layers' in bf16, the LoRA adapters'
    # in float32 (prepare_model_for_kbit_training), weighted by their FLOPs; not the fp32 embeddings' dtype
    from fakeviz._analysis import timing
    from fakeviz._core.gpu_specs import gpu_spec

    peak, ran_in = timing.matmul_peak(trace, "H100", timing.step_start(trace))
    assert data["speed"]["dtype"] == ran_in and ran_in.startswith("torch.bfloat16 ") and "torch.float32" in ran_in
    assert data["speed"]["peak_flops"] == pytest.approx(peak, rel=1e-9)
    assert gpu_spec("H100").peak_flops("torch.float32") < peak < gpu_spec("H100").peak_flops("torch.bfloat16")
    assert data["trainable_parameters"] == trainable
    # the weights a 4-bit parameter stands for, not its packed bytes
    plain = fv.models.build("meta-llama/Llama-3.1-8B", **TINY_LLAMA)
    assert data["parameters"] == sum(q.numel() for q in plain.parameters()) + trainable
    assert data["ops"] == trace.num_ops
    pk = trace.peak()["cuda:0"]
    dev = data["devices"]["cuda:0"]
    assert dev["tensors"] == pk.bytes and dev["by_category"] == {c: pk.by_category[c] for c in fv.CATEGORIES}
    assert int(trace.memory(device="cuda:0", allocator=False)["Gradient"].max()) == 4 * trainable
    assert "nf4, LoRA r=8" in capsys.readouterr().out


def test_full_training_with_a_paged_8bit_optimizer_equals_the_api_run(tmp_path):
    """Every parameter trains with ``--optim paged_adamw8bit``: the tiny Llama's matrices (at least 4,096 elements) get
    8-bit states, as bitsandbytes' own PagedAdamW8bit made by hand in the API run."""
    pytest.importorskip("bitsandbytes")
    js = tmp_path / "r.json"
    assert (
        main(["report", *TINY_LLAMA_ARGV, "--train", "--steps", "1", "--optim", "paged_adamw8bit", "--json", str(js)])
        == 0
    )
    data = json.loads(js.read_text())
    trace, _ = _api_lora_run("paged_adamw8bit", None)
    assert data["optimizer"] == "paged_adamw8bit" and data["lora"] is None
    assert data["ops"] == trace.num_ops
    pk = trace.peak()["cuda:0"]
    assert data["devices"]["cuda:0"]["by_category"] == {c: pk.by_category[c] for c in fv.CATEGORIES}
    assert any(".optimizer_update_8bit_blockwise" in op for op in trace.ops.op)  # the 8-bit step ran


def test_paged_optimizer_state_is_named(tmp_path, capsys):
    pytest.importorskip("bitsandbytes")
    js = tmp_path / "r.json"
    argv = [a if a != "vocab_size=256" else "vocab_size=2048" for a in TINY_LLAMA_ARGV]  # 131,072-element matrices
    assert main(["report", *argv, "--train", "--steps", "1", "--optim", "paged_adamw8bit", "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    # bitsandbytes pages the two uint8 states of each tensor of at least 1e5 elements: the embeddings and the head
    assert data["paged_bytes"] == 2 * 2 * 2048 * 64
    assert "512.0 KiB of the optimizer state is paged" in capsys.readouterr().out


def test_lora_over_weights_without_a_backward_is_one_line(capsys):
    pytest.importorskip("torchao")
    assert main(["report", *TINY_LLAMA_ARGV, "--train", "--steps", "1", "--lora", "8", "--quant", "int4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fakeviz: error: --quant int4 --lora 8 --train: adapters cannot train over these weights")
    assert "aten::_weight_int4pack_mm" in err and "Traceback" not in err


def test_finetune_options_in_a_fresh_process(tmp_path):
    """In a new process, peft (``--lora`` over torchao weights, set up while torch.cuda answers as the fake GPU) and
    transformers' Adafactor (made inside the recording) are first imported under a fake GPU, and both import
    bitsandbytes: they import as a script's imports do (``steps.import_library``)."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("torchao")
    lora_numel = 2 * 8 * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 128))  # two blocks: q o, k v, gate up down
    for extra, want in ((["--quant", "int4", "--lora", "8"], ("int4", "LoRA r=8", None)),
                        (["--train", "--steps", "1", "--optim", "adafactor"], (None, None, "adafactor"))):  # fmt: skip
        js = tmp_path / "r.json"
        r = _cli("report", *TINY_LLAMA_ARGV, *extra, "--json", str(js))
        assert r.returncode == 0, r.stderr
        data = json.loads(js.read_text())
        assert (data["quantization"], data["lora"], data.get("optimizer")) == want and data["error"] is None
        assert data["trainable_parameters"] == (lora_numel if "--lora" in extra else data["parameters"])
