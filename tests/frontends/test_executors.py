"""executor=: the points of a sweep (and max_batch's probes, a parallel plan's rank classes) one after another here
(the default), on a pool over this machine's cores (executor="processes") or on a concurrent.futures executor,
records back as .fvz bytes (Note: [points on an executor] in fakeviz/_frontends/executors.py). One spawn pool serves the whole file (a worker imports torch and transformers
once: seconds); the dask test starts a two-worker LocalCluster."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fakeviz as fv
from fakeviz._core.errors import ArgumentError, TraceFormatError
from fakeviz._frontends import executors

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip
FIGURES = ("peak", "weights", "gradients", "optimizer", "activations", "temporaries")


@pytest.fixture(scope="module")
def cfg():
    return fv.models.config("meta-llama/Llama-3.1-8B", **TINY)


@pytest.fixture(scope="module")
def pool():
    with cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield ex


def _no_session_left() -> None:
    from torch._guards import active_fake_mode

    assert active_fake_mode() is None
    assert not torch.cuda.is_available()  # no fake GPU session left answering in this process


def test_a_trace_goes_through_bytes_unchanged(cfg) -> None:
    p = fv.plan(cfg, gpus="H100", seq=16, train=True)
    data = p.trace.to_bytes()
    back = fv.load(data)
    assert isinstance(data, bytes) and back.num_ops == p.trace.num_ops
    assert back.peak_bytes() == p.trace.peak_bytes()
    assert (back.ops.nbytes.to_numpy() == p.trace.ops.nbytes.to_numpy()).all()
    with pytest.raises(TraceFormatError, match="<bytes>"):
        fv.load(data[: len(data) // 2])


def test_a_sweep_through_a_process_pool_gives_the_sequential_figures(cfg, pool) -> None:
    axes = {"batch": [1, 2], "train": [True, False], "seq": 32}
    here = fv.sweep(cfg, gpus="2xH100", progress=False, executor=False, rank_by=None, **axes)
    there = fv.sweep(cfg, gpus="2xH100", progress=False, executor=pool, rank_by=None, **axes)
    assert there.attrs["executor"] == "4 of 4 points on ProcessPoolExecutor"
    assert here.attrs["executor"].startswith("executor=False")
    cols = [c for c in here.columns if c.split(" ")[-1] in FIGURES] + ["max peak", "fits", "step_s"]
    assert len(cols) >= 12
    pd_equal = (here[cols].to_numpy() == there[cols].to_numpy()).all()
    assert pd_equal, (here[cols], there[cols])
    for a, b in zip(here.attrs["plans"], there.attrs["plans"]):
        assert a.trace.peak_bytes() == b.trace.peak_bytes() and a.device_map == b.device_map
        assert b.module is None and a.trace.num_ops == b.trace.num_ops
    # each point as fv.plan alone: a forward after a training point holds no optimizer state
    alone = fv.plan(cfg, gpus="2xH100", seq=32, batch=1, train=False)
    assert alone.trace.peak_bytes() == here.attrs["plans"][1].trace.peak_bytes()
    assert here.loc[1, "cuda:0 optimizer"] == 0
    _no_session_left()


def _boom(shared: int, task: int) -> fv.Trace:
    """A point function for the pool: task 1 raises, the others record a tiny step (test-module level: picklable)."""
    if task == 1:
        raise ValueError(f"point {task} refused")
    with fv.record() as t:
        torch.ones(shared, task + 1, device="cuda") @ torch.ones(task + 1, 4, device="cuda")
    return t


def test_fit_through_the_pool_finds_what_it_finds_here(cfg, pool) -> None:
    kw = {"gpus": "2xH100", "seq": 16, "batch": 4, "parallel": ["balanced", {"dp_shard": 2}], "progress": False}
    here = fv.fit(cfg, executor=False, **kw)
    there = fv.fit(cfg, executor=pool, **kw)
    cols = ["layout", "checkpointing", "micro_batch", "accumulation", "max peak", "global_step_s"]
    assert here[cols].equals(there[cols]) and there.attrs["recordings"] == here.attrs["recordings"]
    assert there.attrs["executor"].endswith("on ProcessPoolExecutor")
    sims = [p for p in there.attrs["plans"] if isinstance(p, fv.Simulation)]
    assert len(sims) == 1 and sims[0].fits and sims[0].stand_ins == {1: 0}  # rebuilt from the worker's bytes
    _no_session_left()


def test_a_failing_point_is_reported_and_the_others_come_back(pool) -> None:
    with executors.Runner(executor=pool) as run:
        out = run.run([0, 1, 2], local=lambda t: pytest.fail("ran here"), remote=_boom, shared=8)
    assert isinstance(out[1], executors.Failed) and out[1].error == "ValueError: point 1 refused"
    assert not out[1].fits and out[1].trace is None
    for k in (0, 2):  # 8 x 4 float32 outputs, by hand
        assert isinstance(out[k], fv.Trace) and out[k].ops.nbytes.iloc[-1] == 8 * 4 * 4
    _no_session_left()


def _die(shared: int, task: int) -> int:
    if task == 1:
        os._exit(3)  # the worker process dies, as when the kernel kills it for memory
    return task


def test_a_dying_worker_fails_its_points_not_the_call() -> None:
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        ex.submit(int).result()  # started
        with executors.Runner(executor=ex) as run:
            out = run.run([0, 1, 2], local=lambda t: pytest.fail("ran here"), remote=_die, shared=0)
    assert isinstance(out[1], executors.Failed) and "BrokenProcessPool" in out[1].error
    assert all(r == k or isinstance(r, executors.Failed) for k, r in enumerate(out))


def test_the_default_runs_here_processes_keep_fast_points_here_and_other_values_are_refused(cfg, monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # a pool could start: the default starts none all the same
    monkeypatch.setattr(executors, "POOL_AFTER_S", 0.0)
    df = fv.sweep(cfg, gpus="H100", batch=[1, 2], seq=16, progress=False)
    assert df.attrs["executor"] == "in this process, one point after another (executor='processes' uses this " \
        "machine's cores)"  # fmt: skip
    monkeypatch.undo()
    df = fv.sweep(cfg, gpus="H100", batch=[1, 2], seq=16, progress=False, executor="processes")
    assert df.attrs["executor"].startswith("in this process")  # tiny points: a pool would not pay for itself
    module = fv.models.build(cfg, device="cuda:0")
    for executor in (cf.ThreadPoolExecutor(1), "processes"):
        with pytest.warns(UserWarning, match="module"):
            df = fv.sweep(module, gpus="H100", batch=[1, 2], seq=16, progress=False, executor=executor)
        assert "module" in df.attrs["executor"]
    for bad in (4, "threads", True):
        with pytest.raises(ArgumentError, match=r"executor=.*: not an executor\nGive None .* 'processes' .*Executor"):
            fv.sweep(cfg, gpus="H100", batch=[1, 2], executor=bad, progress=False)
    with pytest.raises(ArgumentError, match="executor='threads': not an executor"):
        fv.plan(cfg, gpus="2xH100", parallel={"dp_shard": 2}, seq=16, executor="threads")


def test_the_pool_shares_the_points_with_this_process(cfg, monkeypatch) -> None:
    # the threshold at 0 s: any point is "slow", so "processes" starts its pool while the first point runs
    monkeypatch.setattr(executors, "POOL_AFTER_S", 0.0)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    axes = {"batch": [1, 2, 3], "seq": 16, "train": True}
    df = fv.sweep(cfg, gpus="H100", progress=False, rank_by=None, executor="processes", **axes)
    here = fv.sweep(cfg, gpus="H100", progress=False, rank_by=None, executor=False, **axes)
    where = df.attrs["executor"]
    assert where.endswith("points in a pool of 1 worker processes, the rest in this process"), where
    assert [p.trace.peak_bytes() for p in df.attrs["plans"]] == [p.trace.peak_bytes() for p in here.attrs["plans"]]
    assert any(p.module is None for p in df.attrs["plans"]) and df.attrs["plans"][0].module is not None
    _no_session_left()


def _dask_distributed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """dask.distributed, whose package is the top-level ``distributed``: other tests of the same worker put
    ``benchmarks/`` first on sys.path, whose ``distributed.py`` would be imported in its place, here and in the
    cluster's worker processes (spawn hands them this sys.path): kept off sys.path for the whole test."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).name != "benchmarks"])
    if "distributed" in sys.modules and not hasattr(sys.modules["distributed"], "LocalCluster"):
        monkeypatch.delitem(sys.modules, "distributed")
    return pytest.importorskip("dask.distributed")


def test_a_dask_cluster_runs_the_points(cfg, monkeypatch) -> None:
    distributed = _dask_distributed(monkeypatch)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        with distributed.Client(lc) as client:
            df = fv.sweep(cfg, gpus="H100", batch=[1, 2], seq=16, train=True, progress=False, rank_by=None,
                          executor=client.get_executor())  # fmt: skip
    here = fv.sweep(cfg, gpus="H100", batch=[1, 2], seq=16, train=True, progress=False, rank_by=None, executor=False)
    assert df.attrs["executor"] == "2 of 2 points on ClientExecutor"
    assert np.array_equal(df["max peak"].to_numpy(), here["max peak"].to_numpy())
    # the bytes of each device's peak, not the op's seq: now and then (after other tests of this file, never alone;
    # a bisection blamed a commit that changes no record) a worker's record of the second point has its cpu peak,
    # the last AdamW step counter's lift_fresh, one op later (seq 517, here 516); cause not found (closing note)
    bytes_of = [{d: v["bytes"] for d, v in p.trace.peak_bytes().items()} for p in df.attrs["plans"]]
    assert bytes_of == [{d: v["bytes"] for d, v in p.trace.peak_bytes().items()} for p in here.attrs["plans"]]
    _no_session_left()


def test_max_batch_probes_rounds_of_values_on_the_pool(cfg, pool) -> None:
    kw = {"gpus": "5MB", "seq": 64, "train": True, "limit": 16}
    here = fv.max_batch(cfg, executor=False, **kw)
    there = fv.max_batch(cfg, executor=pool, **kw)
    assert there.value == here.value >= 1 and there.failing is not None and not there.failing.fits
    # two workers: the doubling phase probes two values a round (1, 2; then 4, 8 ...), all of them recorded
    assert [v for v, _ in there.tried[:2]] == [1, 2] and len(there.tried) >= len(here.tried)
    alone = fv.plan(cfg, gpus="5MB", seq=64, train=True, batch=there.value)
    assert there.plan.trace.peak_bytes() == alone.trace.peak_bytes() and there.plan.module is None
    _no_session_left()


def test_a_parallel_plans_rank_classes_on_the_pool(cfg, pool) -> None:
    # dp_shard 3 of 64-wide weights: torch's chunks are 22, 22 and 20 rows, so rank 1 stands in by rank 0 and rank
    # 2 is a class of its own, recorded in a worker
    kw = {"gpus": "3xH100", "parallel": {"dp_shard": 3}, "train": True, "seq": 16}
    here = fv.plan(cfg, executor=False, **kw)
    there = fv.plan(cfg, executor=pool, **kw)
    assert here.stand_ins == there.stand_ins == {1: 0} and there.ranks == [0, 2]
    assert list(here.peaks.peak) == list(there.peaks.peak)
    for r in (0, 2):  # the worker's record of rank 2 is this process's, op for op
        a, b = here.trace(r), there.trace(r)
        assert a.peak_bytes() == b.peak_bytes() and list(a.ops.shape) == list(b.ops.shape)
    assert list(here.trace(0).ops.shape) != list(there.trace(2).ops.shape)  # two classes indeed
    assert list(here.classes["count"]) == list(there.classes["count"]) == [2, 1]
    _no_session_left()


@pytest.mark.parametrize("offload", [None, "cpu"])
def test_a_parallel_plan_whose_ranks_all_stand_in_records_rank_0_only(cfg, offload) -> None:
    # dp_shard 2 of 64-wide weights: rank 1 stands in by rank 0, so no class is left for the executor (a round of
    # no point: it raised "pop from an empty deque" under the old default pool)
    kw = {"gpus": "2xH100", "parallel": {"dp_shard": 2}, "train": True, "seq": 16, "offload": offload}
    default = fv.plan(cfg, **kw)
    pooled = fv.plan(cfg, executor="processes", **kw)
    for sim in (default, pooled):
        assert sim.stand_ins == {1: 0} and sim.ranks == [0] and sim.fits
        assert list(sim.classes["count"]) == [2]
    assert list(default.peaks.peak) == list(pooled.peaks.peak)
    assert ("cpu" in list(default.peaks.device)) == (offload == "cpu")
    for executor in (None, "processes"):
        with executors.runner("name", executor) as run:
            assert run.run([], local=lambda t: pytest.fail("ran"), remote=_boom) == [] and run.points == 0
    _no_session_left()


def test_the_search_in_rounds_finds_what_one_at_a_time_finds() -> None:
    def probe_for(largest: int, seen: dict[int, bool]):
        def probe(values: list[int]) -> list[bool]:
            assert not set(values) & set(seen)  # no value probed twice
            seen.update({v: v <= largest for v in values})
            return [v <= largest for v in values]

        return probe

    for limit in (1, 5, 16, 100):
        for largest in range(limit + 1):
            for w in (1, 2, 3):
                seen: dict[int, bool] = {}
                width = (lambda k: lambda _: k)(w)
                assert executors.search_largest(probe_for(largest, seen), limit, width) == (largest, largest + 1)
                assert all(1 <= v <= limit for v in seen)


def test_one_core_keeps_processes_here(monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert executors.note("name", "processes") == "" and executors.runner("name", "processes").remote
    assert not executors.runner("name", None).remote and not executors.runner("name", False).remote
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert "one core" in executors.note("name", "processes") and not executors.runner("name", "processes").remote
    assert executors.note("name", False).startswith("executor=False")


def _boom_here(task: int) -> fv.Trace:
    return _boom(8, task)


def test_a_failing_point_is_a_row_here_as_in_a_worker_and_a_refused_argument_raises(cfg, pool, monkeypatch) -> None:
    # Note: [failing points]: a point that raises is a Failed in its place, whether it ran in this process
    # (the default, executor=False, "processes"' first point) or in a worker
    for executor in (False, None, "processes", pool):
        with executors.runner("name", executor) as run:
            out = run.run([0, 1, 2], local=_boom_here, remote=_boom, shared=8)
        assert isinstance(out[1], executors.Failed) and out[1].error == "ValueError: point 1 refused", executor
        for k in (0, 2):  # 8 x 4 float32 outputs, by hand
            assert isinstance(out[k], fv.Trace) and out[k].ops.nbytes.iloc[-1] == 8 * 4 * 4
        _no_session_left()
    # a value of the user's is refused before any point runs: the call raises, whatever the executor
    for executor in (False, pool):
        with pytest.raises(ArgumentError, match="optimizer"):
            fv.sweep(cfg, gpus="H100", batch=[1, 2], optimizer=["adamw", "nope"], seq=16, progress=False,
                     executor=executor)  # fmt: skip
        with pytest.raises(ArgumentError, match="batch=0: batch is a whole number of at least 1"):
            fv.sweep(cfg, gpus="H100", batch=[1, 0], seq=16, progress=False, executor=executor)
        with pytest.raises(ValueError, match="train=True and new_tokens"):
            fv.sweep(cfg, gpus="H100", train=True, new_tokens=[0, 4], seq=16, progress=False, executor=executor)
    _no_session_left()


def test_a_probe_that_raises_ends_the_search(cfg) -> None:
    # a probe that fails for another reason than memory says nothing about memory: max_batch raises its error
    # rather than counting it as "does not fit" (which would lower the answer in silence)
    from transformers import LlamaForCausalLM

    with fv.fake_mode():
        model = LlamaForCausalLM(cfg)

    def broken_at_four(module: torch.nn.Module, args: tuple[Any, ...], kw: dict[str, Any]) -> None:  # the user's bug
        if kw.get("hidden_states", args[0] if args else None).shape[0] >= 4:
            raise RuntimeError("probe broke at batch 4")

    model.model.layers[0].register_forward_pre_hook(broken_at_four, with_kwargs=True)
    with pytest.raises(RuntimeError, match="probe broke at batch 4"):
        fv.max_batch(model, gpus="H100", seq=16, limit=64, executor=False)
    _no_session_left()


def _slow_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timed point seems to take 100 s (a loaded machine): the old default then widened its rounds."""
    ticks = iter(range(0, 10**6, 100))
    monkeypatch.setattr(executors, "clock", lambda: float(next(ticks)))


def test_processes_record_the_same_probes_however_long_they_take(cfg, monkeypatch) -> None:
    # Note: [the default executor]: which probes max_batch records with "processes" depends on the first probe's
    # recorded ops and the cores, never on a clock; only where a probe runs may
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    kw = {"gpus": "5MB", "seq": 64, "train": True, "limit": 16}
    serial = fv.max_batch(cfg, **kw)
    default = fv.max_batch(cfg, executor="processes", **kw)
    _slow_clock(monkeypatch)
    loaded = fv.max_batch(cfg, executor="processes", **kw)
    assert 1 <= serial.value < 16 and serial.failing is not None
    for got in (default, loaded):  # a tiny model: one probe after another, as the default
        assert (got.value, got.recordings, got.tried) == (serial.value, serial.recordings, serial.tried)
        assert got.plan.trace.peak_bytes() == serial.plan.trace.peak_bytes()


def test_rounds_of_probes_follow_the_recorded_ops_not_the_clock(cfg, monkeypatch) -> None:
    # a recorded op made to count as a second: the tiny model is "slow", so after the first probe "processes"
    # probes two values a round (two cores); the values are search_largest's with those widths, whatever the clock
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(executors, "OP_S", 1.0)
    _slow_clock(monkeypatch)
    kw = {"gpus": "5MB", "seq": 64, "train": True, "limit": 16}
    got = fv.max_batch(cfg, executor="processes", **kw)
    serial = fv.max_batch(cfg, **kw)
    seen: list[int] = []

    def probe(values: list[int]) -> list[bool]:
        seen.extend(values)
        return [v <= serial.value for v in values]

    assert executors.search_largest(probe, 16, lambda _: 2 if seen else 1) == (serial.value, serial.value + 1)
    assert [v for v, _ in got.tried] == seen and got.value == serial.value
    assert got.tried[:3] == [(1, True), (2, True), (4, 4 <= serial.value)]  # 1 alone, then 2 and 4 at once
    _no_session_left()
