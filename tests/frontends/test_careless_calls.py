"""Careless calls (issue 30): each is a short error naming the argument as written, never a wrong answer.

A typo in a config override, a GPU count where a plan needs GPUs, a dtype by name, a device fakeviz does
not fake, an empty sweep axis, and the command line's versions of them. Every refusal is an
``ArgumentError`` (a ``ValueError``) whose first line is the user's argument and what is wrong, and whose
next lines say what to give instead; the command line prints that first line after ``fakeviz: error:``
with exit code 2, before any model is built or recorded. Each case is paired with the call that works, so
a check that refused everything would fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fakeviz as fv
from fakeviz import models
from fakeviz._core.errors import ArgumentError, CheckpointError
from fakeviz._core.gpus import GPUS, parse_gpus, read_gpus
from fakeviz._frontends.cli import main

ROOT = Path(__file__).resolve().parents[2]
LLAMA = "meta-llama/Llama-3.1-8B"


def _first(exc: pytest.ExceptionInfo) -> str:
    return str(exc.value).splitlines()[0]


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """The command line in this process: exit code, first line of stderr, stdout."""
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, (out.err.splitlines() or [""])[0], out.out


# ------------------------------------------------------------------------------- 1. config overrides
def test_an_override_the_config_lacks_is_refused_with_the_near_name():
    with pytest.raises(ArgumentError) as e:
        models.build(LLAMA, num_hidden_layer=2)
    assert _first(e) == f"num_hidden_layer=2: LlamaConfig of {LLAMA} has no field 'num_hidden_layer'"
    assert e.value.suggestions == ("num_hidden_layers",) and "Did you mean 'num_hidden_layers'?" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ArgumentError, match="no field 'n_layr'") as e:  # a transformers config given as is
        models.build(models.config("gpt2"), n_layr=1)
    assert e.value.suggestions == ("n_layer",)
    # the names the config has, its aliases and the keyword arguments every config takes still work
    assert models.config(LLAMA, num_hidden_layers=2).num_hidden_layers == 2
    assert models.config("gpt2", num_hidden_layers=1).n_layer == 1  # GPT2Config.attribute_map
    assert models.config(LLAMA, attn_implementation="eager")._attn_implementation == "eager"


def test_the_cli_refuses_an_override_the_config_lacks(capsys):
    rc, first, out = _cli(capsys, "report", LLAMA, "--set", "num_hidden_layer=1")
    assert rc == 2 and out == ""  # nothing built, no report of the full 8B model
    assert first == f"fakeviz: error: --set num_hidden_layer=1: LlamaConfig of {LLAMA} has no field 'num_hidden_layer'"


@pytest.mark.parametrize("value", [-1, 0, 2.0, "two", True])
def test_a_layer_count_below_one_or_not_whole_is_refused(value):
    with pytest.raises(ArgumentError) as e:
        models.build("gpt2", num_hidden_layers=value)
    assert _first(e) == f"num_hidden_layers={value!r}: num_hidden_layers is a size: a whole number of at least 1"
    assert "openai-community/gpt2 has num_hidden_layers=12" in str(e.value)


def test_other_nonsensical_sizes_are_refused_and_a_none_default_still_works():
    with pytest.raises(ArgumentError, match=r"^hidden_size=0: hidden_size is a size"):
        models.config(LLAMA, hidden_size=0)
    with pytest.raises(ArgumentError, match=r"^vocab_size=-5: vocab_size is a size"):
        models.config("gpt2", vocab_size=-5)
    with pytest.raises(ArgumentError, match=r"^hidden_size=100: transformers refuses the config: The hidden size"):
        models.config(LLAMA, hidden_size=100)  # not a multiple of the 32 heads: transformers' own check, named
    # None where the class's own default is None: Llama then takes the attention heads' count, as transformers does
    assert models.config(LLAMA, num_key_value_heads=None).num_key_value_heads == 32
    assert len(models.build("gpt2", n_layer=1).transformer.h) == 1


def test_the_cli_refuses_a_negative_layer_count(capsys):
    rc, first, out = _cli(capsys, "report", "gpt2", "--set", "num_hidden_layers=-1")
    assert rc == 2 and out == ""
    want = "--set num_hidden_layers=-1: num_hidden_layers is a size: a whole number of at least 1"
    assert first == f"fakeviz: error: {want}"


def _contradicting_config(folder: Path) -> Path:
    cfg = models.config("gpt2", n_layer=1).to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_architectures_contradicting_model_type_names_both(tmp_path, capsys):
    folder = _contradicting_config(tmp_path)
    want = f"{folder}: architectures names LlamaForCausalLM (a 'llama' model), but model_type is 'gpt2'"
    with pytest.raises(CheckpointError) as e:
        models.build(folder)
    assert _first(e) == want and "['GPT2LMHeadModel']" in str(e.value)
    rc, first, out = _cli(capsys, "report", str(folder), "--seq", "16")
    assert rc == 2 and first == f"fakeviz: error: {want}" and out == ""


# ------------------------------------------------------------------------------------------ 2. gpus=
@pytest.mark.parametrize(
    ("gpus", "first"),
    [
        (8, "gpus=8: 8 GPUs of which kind? A plan needs each GPU's memory"),
        ("8", "gpus='8': 8 GPUs of which kind? A plan needs each GPU's memory"),
        (1.5, "gpus=1.5: a number of GPUs is a whole number (and gpus= never takes bytes)"),
        ("1.5", "gpus='1.5': '1.5' is neither a whole count nor a size with its unit"),
        ([8], "gpus=[8]: 8 in the list: each item is a GPU or a size ('H100', '80GB'), or a count with its kind"),
        ("0xH100", "gpus='0xH100': 0 GPUs; a fake machine has between 1 and 64 GPUs"),
    ],
)
def test_plan_reads_an_integer_as_a_gpu_count_never_as_bytes(gpus, first):
    with pytest.raises(ArgumentError) as e:
        fv.plan("gpt2", gpus=gpus)
    assert _first(e) == first
    with pytest.raises(ArgumentError) as e2:  # the same one parser behind every planning entry point
        fv.max_batch("gpt2", gpus=gpus)
    assert _first(e2) == first


def test_one_reading_of_gpus():
    assert read_gpus(8) == read_gpus("8") == (8, None)
    n, caps = read_gpus("8xA100")
    assert n == 8 and caps is not None and {c.bytes for c in caps} == {GPUS["A100"]}
    assert [c.bytes for c in parse_gpus(["80GB", "2xH100"])] == [80 * 10**9, GPUS["H100"], GPUS["H100"]]


def test_record_reads_gpus_as_plan_does():
    for gpus in (8, "8"):
        with fv.record(device="cuda:0", gpus=gpus):
            assert torch.cuda.device_count() == 8
    with fv.record(device="cuda:0", gpus="2xA100") as trace:
        assert torch.cuda.device_count() == 2 and "A100" in torch.cuda.get_device_name(0)
    assert trace.meta["gpu"] == "A100"
    with pytest.raises(ArgumentError, match=r"^gpus=1\.5: a number of GPUs is a whole number"):
        fv.record(gpus=1.5)
    with pytest.raises(ArgumentError, match=r"^gpus='2xA100': a record's GPUs are one kind, and gpu='H100'"):
        fv.record(gpus="2xA100", gpu="H100")


def test_the_cli_gpus_count_alone_is_refused(capsys):
    rc, first, _ = _cli(capsys, "report", "gpt2", "--gpus", "8")
    assert rc == 2
    assert first == "fakeviz: error: --gpus '8': 8 GPUs of which kind? (write e.g. --gpus 8xH100, H100 or 2x80GB)"


# ------------------------------------------------------------------------------ 3. record() arguments
def test_exclude_takes_one_name_as_one_name():
    with fv.record(exclude="transformers") as trace:
        torch.ones(2) + 1
    assert trace.num_ops > 0
    with pytest.raises(ArgumentError) as e:
        with fv.record(exclude="aten"):
            pass
    assert _first(e) == "exclude='aten': no package named 'aten'"  # the name, not its first letter


def test_record_reads_a_dtype_name_as_build_does():
    with fv.record(dtype="bf16"):
        assert torch.get_default_dtype() == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32
    built = next(models.build("gpt2", n_layer=1, dtype="bf16").parameters()).dtype
    assert built == torch.bfloat16
    with pytest.raises(ArgumentError) as e:
        fv.record(dtype="bf17")
    assert _first(e) == "dtype='bf17': not a dtype fakeviz knows"
    with pytest.raises(ArgumentError) as e:
        models.build("gpt2", dtype="bf17")
    assert _first(e) == "dtype='bf17': not a dtype fakeviz knows"
    with pytest.raises(ArgumentError, match=r"^dtype=torch\.int32: int32 cannot be the default dtype of a block"):
        fv.record(dtype=torch.int32)


@pytest.mark.parametrize("device", ["mps", "xla:0", "xpu"])
def test_devices_fakeviz_does_not_fake_are_refused(device):
    kind = device.partition(":")[0]
    with pytest.raises(ArgumentError) as e:
        fv.record(device=device)
    assert _first(e) == f"device={device!r}: fakeviz does not fake {kind} devices"
    assert "cuda (cuda:0 .. cuda:63" in str(e.value) and "cpu or meta" in str(e.value)
    with pytest.raises(ArgumentError, match=f"^device={device!r}: fakeviz does not fake"):
        models.build("gpt2", n_layer=1, device=device)
    assert fv.record(device=device, fake=False).device == torch.device(device)  # a real run is the user's to make


def test_a_device_that_is_no_device_is_named():
    with pytest.raises(ArgumentError) as e:
        fv.record(device="gpu0")
    assert _first(e) == "device='gpu0': not a device name"


def test_sweep_refuses_an_empty_axis():
    with pytest.raises(ArgumentError) as e:
        fv.sweep("gpt2", gpus="H100", batch=[], progress=False)
    assert _first(e) == "batch=[]: an empty axis: a sweep over it has no point to run"
    with pytest.raises(ArgumentError, match=r"^seq=range\(0, 0\): an empty axis"):
        fv.sweep("gpt2", gpus="H100", seq=range(0), progress=False)
    with pytest.raises(ArgumentError, match=r"^batch=1\.5: batch is a whole number of at least 1"):
        fv.plan("gpt2", gpus="H100", batch=1.5)


# ------------------------------------------------------------------------------------ 4. command line
@pytest.mark.parametrize(
    ("argv", "first"),
    [
        (["--gpus", "0xH100"], "--gpus '0xH100': 0 GPUs; a fake machine has between 1 and 64 GPUs (write e.g. --gpus 8xH100, H100 or 2x80GB)"),
        (["--gpus", "-1GB"], "--gpus '-1GB': '-1GB' is below zero (write e.g. --gpus 8xH100, H100 or 2x80GB)"),
        (["--gpus", "-2xH100"], "--gpus '-2xH100': -2 GPUs; a fake machine has between 1 and 64 GPUs (write e.g. --gpus 8xH100, H100 or 2x80GB)"),
        (["--device", "mps"], "--device 'mps': fakeviz does not fake mps devices (use cuda:N, cpu or meta)"),
        (["--dtype", "bf17"], "argument --dtype: unknown dtype 'bf17': use bf16, fp16, fp32, fp64 or fp8 (see 'fakeviz report --help')"),
        (["--html", "/nonexistent/x.html"], "--html '/nonexistent/x.html': no folder '/nonexistent' to write it in"),
        (["--save", "/nonexistent/x.fvz"], "--save '/nonexistent/x.fvz': no folder '/nonexistent' to write it in"),
        (["--json", "/nonexistent/x.json"], "--json '/nonexistent/x.json': no folder '/nonexistent' to write it in"),
    ],
)  # fmt: skip
def test_cli_option_errors_are_one_line_naming_the_option(capsys, argv, first):
    rc = main(["report", "gpt2", "--set", "n_layer=1", "--seq", "16", *argv])
    err = capsys.readouterr()
    assert rc == 2 and err.err.splitlines() == [f"fakeviz: error: {first}"], err.err  # once, and nothing else
    assert err.out == ""  # refused before anything was built or recorded


def test_cli_output_folder_is_checked_for_a_saved_trace_too(tmp_path, capsys):
    fvz = tmp_path / "t.fvz"
    assert main(["report", "gpt2", "--set", "n_layer=1", "--seq", "16", "--save", str(fvz)]) == 0
    capsys.readouterr()
    html = tmp_path / "no" / "x.html"
    rc, first, _ = _cli(capsys, "report", str(fvz), "--html", str(html))
    assert rc == 2 and first == f"fakeviz: error: --html '{html}': no folder '{html.parent}' to write it in"
    rc, first, _ = _cli(capsys, "report", str(fvz), "--gpus", "8")
    assert rc == 2 and first.startswith("fakeviz: error: --gpus '8': 8 GPUs of which kind?")
    assert main(["report", str(fvz), "--gpus", "2xA100"]) == 0  # and a good one still reports
    assert "ops recorded" in capsys.readouterr().out


def test_cli_negative_value_in_a_subprocess():
    """The real entry point (``python -m fakeviz``, argv from the shell): ``--gpus -1GB`` is --gpus's value."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "fakeviz", "report", "gpt2", "--gpus", "-1GB"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "fakeviz: error: --gpus '-1GB': '-1GB' is below zero (write e.g. --gpus 8xH100, H100 or 2x80GB)"
    ]


def test_fake_mode_refuses_devices_it_does_not_fake_like_record() -> None:
    with pytest.raises(ArgumentError) as err:
        with fv.fake_mode(device="mps"):
            pass
    assert str(err.value).splitlines()[0] == "device='mps': fakeviz does not fake mps devices"
    with fv.fake_mode(device="cuda:1"):
        assert torch.randn(2).device == torch.device("cuda:1")


def test_save_into_a_missing_folder_names_the_users_path(tmp_path) -> None:
    with fv.record() as trace:
        torch.randn(2)
    target = tmp_path / "missing" / "x.fvz"
    with pytest.raises(FileNotFoundError) as err:
        trace.save(target)
    assert str(err.value) == f"{target}: the folder {target.parent} does not exist; create it or save elsewhere"
    assert not list(tmp_path.rglob("*.tmp"))
    trace.save(tmp_path / "x.fvz")  # the working call
    assert fv.load(tmp_path / "x.fvz").num_ops == trace.num_ops


def test_sweep_names_the_near_axis_of_a_typo() -> None:
    with pytest.raises(ArgumentError) as err:
        fv.sweep("gpt2", gpus="H100", batchs=[1, 2])
    first, second = str(err.value).splitlines()
    assert first == "batchs=[1, 2]: sweep has no such axis"
    assert second.startswith("Did you mean 'batch'? The axes are ") and err.value.suggestions[0] == "batch"


@pytest.mark.parametrize("gpu", [8, "8", 1.5])
def test_simulate_gpu_is_a_kind_not_a_count(gpu) -> None:
    with pytest.raises(ArgumentError) as err:
        fv.simulate(lambda rank, mesh: None, 2, gpu=gpu)
    assert str(err.value).splitlines()[0] == f"gpu={gpu!r}: a number is not a GPU kind"
    assert "the number of ranks is world_size" in str(err.value)
    with pytest.raises(ArgumentError) as err:
        fv.simulate(lambda rank, mesh: None, 2, gpu="H1000")
    assert str(err.value).startswith("gpu='H1000': ") and "gpus=" not in str(err.value)
