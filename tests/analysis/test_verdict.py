"""The verdict: fits / does not fit, and never "fits" for a record that an error stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fakeviz as fv


def _prefix() -> torch.Tensor:
    x = torch.randn(256, 256)
    return x @ x


def _stopped() -> fv.Trace:
    with pytest.raises(fv.DataDependentError):
        with fv.record(device="cuda:0", gpu="H100") as trace:
            y = _prefix()
            torch.nonzero(y > 0).sum().item()  # needs values: the run stops here
    return trace


def test_complete_run_fits() -> None:
    with fv.record(device="cuda:0", gpu="H100") as trace:
        _prefix()
    v = trace.verdict("H100")
    assert v["fits"] and not v["incomplete"] and v["text"].startswith("fits: cuda:0 peaks at")


def test_stopped_run_is_incomplete_never_fits(tmp_path: Path) -> None:
    with fv.record(device="cuda:0", gpu="H100") as complete:
        _prefix()
    trace = _stopped()
    v = trace.verdict("H100")
    assert v["incomplete"] and v["fits"] is False
    assert v["text"].startswith("incomplete: the run stopped at op ") and trace.error["op"] in v["text"]
    assert "the rest is unknown" in v["text"]
    # what was recorded before the error is the complete run's memory, per device
    assert v["devices"]["cuda:0"]["raw"] >= complete.verdict("H100")["devices"]["cuda:0"]["raw"]
    assert "incomplete" in repr(trace) and "fv-over" in trace._repr_html_()
    assert fv.load(trace.save(tmp_path / "stopped.fvz")).verdict("H100") == v  # the error travels with the file


def test_stopped_run_over_capacity_says_both() -> None:
    v = _stopped().verdict(4096)
    assert not v["fits"] and v["incomplete"]
    assert v["text"].startswith("does not fit 4.0 KiB: cuda:0 peaks at") and "the run stopped at op" in v["text"]


def _grows() -> tuple[torch.Tensor, torch.Tensor]:
    """Three 32 MiB tensors made one after another on a fake cuda:0, then one of 64 MiB."""
    a = torch.empty(8 << 20)
    b = torch.empty(8 << 20)
    c = torch.empty(8 << 20)
    return torch.cat([a, b]), c  # line of the 64 MiB request


def test_one_reserved_at_peak_everywhere() -> None:
    """verdict(), Peak, the timeline, the text summary and the explorer's summary show one reserved peak."""
    from fakeviz._core.fmt import format_bytes
    from fakeviz._views.payload import build_state
    from fakeviz._views.text import summary

    with fv.record(device="cuda:0", gpu="H100") as trace:
        _grows()
    reserved = trace.peak()["cuda:0"].reserved
    assert reserved == trace.memory()["reserved"].max() > 0
    for cap in ("H100", 100 << 20, 60 << 20):  # fits, does not fit (twice): the figure does not move
        v = trace.verdict(cap)
        assert v["devices"]["cuda:0"]["peak"] == reserved
        state = build_state(trace, cap)
        assert state["summary"]["verdict"]["devices"]["cuda:0"]["peak"] == reserved
    trace.meta["capacity"] = 60 << 20
    assert format_bytes(reserved) in summary(trace)


def test_first_failing_op_is_named() -> None:
    """A device that does not fit names the first op the allocator model cannot serve and what was live."""
    with fv.record(device="cuda:0", gpu="H100") as trace:
        _grows()
    cap = 100 << 20  # three 32 MiB segments fit, the 64 MiB cat does not
    v = trace.verdict(cap)
    assert not v["fits"]
    o = v["devices"]["cuda:0"]["first_oom"]
    cat = int((trace.ops.op == "aten.cat.default").to_numpy().argmax())
    assert o["seq"] == v["devices"]["cuda:0"]["oom_seq"] == cat and o["op"] == "aten.cat.default"
    assert o["live"] == 3 * (32 << 20) == trace.live_bytes()["cuda:0"][cat - 1]
    assert o["request"] == 64 << 20 and o["line"].endswith(
        f"test_verdict.py:{_grows.__code__.co_firstlineno + 5} in _grows"
    )
    assert f"first fails at op {cat} aten.cat.default" in v["text"] and "with 96.0 MiB live" in v["text"]
    # it fits where the whole run fits, and then names no failing op
    ok = trace.verdict("H100")["devices"]["cuda:0"]
    assert ok["fits"] and ok["first_oom"] is None and ok["oom_seq"] == -1


def test_weights_alone_over_capacity_never_fits() -> None:
    """Weights built before the recording that exceed the capacity by themselves: the model runs out before
    op 0 (Note: [out of memory before the first op]); that is "does not fit", never "fits"."""
    import torch

    import fakeviz as fv

    with fv.fake_mode(device="cuda:0"):
        model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4)))  # 16 MiB of weights
    with fv.record(device="cuda:0", modules=[model]) as trace:
        model(torch.randn(2, 1024))
    v = trace.verdict("8MiB")
    assert v["fits"] is False
    o = v["devices"]["cuda:0"]["first_oom"]
    assert o["seq"] == -1 and o["op"] is None and o["live"] >= 4 * 1024 * 1024 * 4
    assert o["where"].startswith("fails before the first op") and o["where"] in v["text"]
    assert trace.verdict("1GiB")["fits"] is True


# Note: [the verdict]. gpt2 cut to one layer, two AdamW steps: its reserved peak is over CAPACITY, and the
# caching-allocator model run with CAPACITY as its limit serves every request by freeing its cached blocks.
CLI_RUN = ["gpt2", "--set", "n_layer=1", "--seq", "16", "--train", "--steps", "2"]
CAPACITY = "1100MB"


def test_one_verdict_with_the_bytes_it_judged_on_every_surface(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run that fits only after freeing cached blocks: the API, the CLI's text and JSON, the text summaries,
    the explorer's payload and the HTML file give one verdict, naming the same judged bytes in the same words."""
    import json

    from fakeviz._analysis.memory import allocator_run
    from fakeviz._analysis.verdict import judged_text
    from fakeviz._core.fmt import format_bytes, html_text
    from fakeviz._frontends.cli import main
    from fakeviz._views.payload import build_state
    from fakeviz._views.text import summary, summary_html

    js, page, fvz = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "r.fvz"
    assert main(["report", *CLI_RUN, "--capacity", CAPACITY, "--json", str(js), "--html", str(page),
                 "--save", str(fvz)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    trace = fv.load(fvz)
    v = trace.verdict(CAPACITY)
    d = v["devices"]["cuda:0"]
    # the run this test is about: over the capacity without a limit, within it once cached blocks are freed
    assert v["fits"] and d["fits"] and d["freed"] and d["peak"] > d["capacity"] >= d["judged"] > d["allocated"] * 0.9
    limited = allocator_run(trace, "cuda:0", d["capacity"])
    assert d["judged"] == limited.peak_reserved and limited.num_ooms == 0 and limited.segments_freed > 0
    assert d["peak"] == trace.peak()["cuda:0"].reserved  # the charts' "reserved at peak" (no limit)
    text = v["text"]
    assert text == "fits: " + judged_text("cuda:0", d) == "fits: " + d["text"]
    # the figure it names is the judged bytes (with the decimals that keep it apart from the capacity's)
    said, unit = text.split("peaks at ")[1].split(" reserved of ")[0].split()
    assert unit == format_bytes(d["judged"]).split()[1] == "GiB" and abs(float(said) - d["judged"] / 2**30) < 0.01
    assert "after freeing cached blocks" in text and "without a limit" in text
    # the command line: the verdict line is the text; its JSON the same text and bytes
    assert f"\nverdict: {text}\n" in out
    data = json.loads(js.read_text())
    assert data["verdict"]["text"] == text and data["verdict"]["fits"] is True
    assert data["devices"]["cuda:0"]["judged"] == d["judged"] and data["devices"]["cuda:0"]["freed"] is True
    # the text summaries, the explorer's payload and the HTML file
    assert text in summary(trace) and text in repr(trace) and html_text(text) in summary_html(trace)
    state = build_state(trace)
    assert state["summary"]["verdict"]["text"] == text
    assert state["summary"]["verdict"]["devices"]["cuda:0"]["judged"] == d["judged"]
    assert state["summary"]["verdict"]["devices"]["cuda:0"]["text"] == d["text"]
    assert html_text(text) in page.read_text()


def test_plan_and_simulation_judge_the_same_bytes() -> None:
    """``Plan.fits``, ``Plan.peaks``, ``Simulation.fits`` and their texts read the verdict: on a capacity the run
    fits only after freeing cached blocks, each says so with the verdict's bytes and words."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=32000, max_position_embeddings=4096)  # fmt: skip
    p = fv.plan(cfg, gpus="360MiB", batch=2, seq=64, train=True)
    d = p.verdict["devices"]["cuda:0"]
    assert p.fits and d["freed"] and d["peak"] > d["capacity"] >= d["judged"]
    assert p.fit_text == p.verdict["text"] == "fits: " + d["text"] and d["text"] in p.text
    row = p.peaks.iloc[0]
    assert row.judged == d["judged"] and row.peak == d["peak"] and row.headroom == d["capacity"] - d["judged"]
    assert row.verdict == d["text"] and row.fits
    sim = fv.plan(cfg, gpus="2x360MiB", batch=2, seq=64, train=True, parallel={"dp_shard": 2})
    assert sim.fits
    for r in sim.peaks.itertuples():
        rec = sim.trace(r.rank if r.recorded else sim.stand_ins[r.rank])
        dv = next(iter(rec.verdict(360 << 20)["devices"].values()))
        assert r.judged == dv["judged"] < r.peak and r.headroom == dv["capacity"] - dv["judged"] >= 0
        assert r.verdict.endswith(dv["text"].partition(" ")[2]) and "after freeing cached blocks" in r.verdict
    assert any(r.verdict in sim.text for r in sim.peaks.itertuples())
