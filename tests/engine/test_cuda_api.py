"""``torch.cuda`` inside a fake cuda session answers as the named GPU (fakeviz._engine.cuda_api).

One test per API group, compared with what a real GPU says where that is known (capability, name and
memory of the catalog GPU, CUDA's default seed and RNG-state layout, torch's memory_stats keys), the memory
figures compared with the trace's own allocator model and live bytes at the same op, restoration after the
block (also after an error), nesting, autograd's worker threads, and a tiny Mixtral on fake cuda:0.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fakeviz as fv
from fakeviz._analysis.allocator import replay_trace
from fakeviz._core.gpus import GPUS, capacity_of
from fakeviz._engine import cuda_api, cuda_shim

_MODULES = ("cuda", "cuda.memory", "cuda.random", "cuda.graphs", "cuda.streams", "cuda.amp.common", "accelerator",
            "accelerator.memory")  # fmt: skip


@pytest.fixture(autouse=True)
def _shim() -> None:
    if fv.fake_cuda_status().mode != "shim":
        pytest.skip("torch.cuda is only answered on the CPU-only shim (a CUDA build answers itself)")


def _snapshot() -> dict[tuple[str, str], Any]:
    """Every attribute of the torch.cuda modules, FakeTensorMode's avoid_device_init and the current device."""
    import importlib

    snap: dict[tuple[str, str], Any] = {}
    for name in _MODULES:
        mod = importlib.import_module(f"torch.{name}")
        snap.update({(name, k): v for k, v in vars(mod).items()})
    snap[("FakeTensorMode", "avoid_device_init")] = FakeTensorMode.__dict__["avoid_device_init"]
    snap[("shim", "current_device")] = cuda_shim.current_device()
    return snap


def _changed(before: dict[tuple[str, str], Any]) -> list[tuple[str, str]]:
    after = _snapshot()
    return [k for k, v in before.items() if after.get(k) is not v and k != ("shim", "current_device")] + (
        [("shim", "current_device")] if after[("shim", "current_device")] != before[("shim", "current_device")] else []
    )


# ---------------------------------------------------------------- when it is on
def test_the_rule_when_torch_cuda_answers_as_a_gpu():
    rule = cuda_api.answers_as_gpu
    assert rule(fake=True, device="cuda:0", gpu=None, gpus=None)
    assert rule(fake=True, device=torch.device("cuda"), gpu=None, gpus=None)
    assert rule(fake=True, device=None, gpu="A100", gpus=None) and rule(fake=True, device=None, gpu=None, gpus=2)
    assert not rule(fake=True, device="cpu", gpu="H100", gpus=None)  # pinned to the cpu: a CPU machine
    assert not rule(fake=True, device=None, gpu=None, gpus=None)  # as a real CPU run of the same code
    assert not rule(fake=False, device="cuda:0", gpu="H100", gpus=None)
    assert cuda_api.device_count_for("cuda:3", None) == 4 and cuda_api.device_count_for(None, None) == 1
    assert cuda_api.device_count_for("cuda", 8) == 8
    with pytest.raises(ValueError, match="needs at least 4 GPUs"):
        cuda_api.device_count_for("cuda:3", 2)
    with pytest.raises(ValueError, match=r"gpus=0: give the number of GPUs"):
        fv.record(device="cuda:0", gpus=0)


def test_outside_and_in_cpu_sessions_the_build_answers_as_always():
    def answers() -> tuple[Any, ...]:
        try:
            cap: Any = torch.cuda.get_device_capability()
        except (AssertionError, RuntimeError) as exc:
            cap = f"{type(exc).__name__}: {str(exc)[:40]}"
        return torch.cuda.is_available(), torch.cuda.device_count(), torch.accelerator.device_count(), cap

    outside = answers()
    if cuda_shim.status().build == "cpu":
        assert outside == (False, 0, 0, "AssertionError: Torch not compiled with CUDA enabled")
    else:  # a CUDA build that sees no GPU (Note: [fake cuda on a CUDA build without a GPU]): the driver's word
        assert outside == (False, 0, 0, "RuntimeError: Found no NVIDIA driver on your system. P")
    with fv.record(device="cpu"):
        assert answers() == outside
    with fv.record():
        assert answers() == outside
    with fv.record(fake=False, device="cpu"):
        assert answers() == outside
    with fv.fake_mode():
        assert answers() == outside
    assert answers() == outside


def test_on_a_cuda_build_nothing_is_patched(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cuda_shim, "_status", cuda_shim.ShimStatus(mode="native", device_count=64))
    assert not cuda_api.answers_as_gpu(fake=True, device="cuda:0", gpu="H100", gpus=None)
    before = _snapshot()
    cuda_api.autocast_support(True)
    assert not _changed(before)
    cuda_api.autocast_support(False)


# ---------------------------------------------------------------- device queries
@pytest.mark.parametrize(("gpu", "capability", "name"), [
    ("H100", (9, 0), "NVIDIA H100 80GB HBM3"), ("A100 40GB", (8, 0), "NVIDIA A100-SXM4-40GB"),
    ("T4", (7, 5), "Tesla T4"),
])  # fmt: skip
def test_device_queries_answer_as_the_named_gpu(gpu: str, capability: tuple[int, int], name: str):
    with fv.record(device="cuda:0", gpu=gpu, gpus=2):
        assert torch.cuda.is_available() and torch.cuda.is_initialized()
        assert torch.cuda.device_count() == 2 and torch.accelerator.device_count() == 2
        assert torch.accelerator.is_available()
        assert torch.cuda.get_device_capability() == capability == torch.cuda.get_device_capability("cuda:1")
        assert torch.cuda.get_device_name(0) == name
        props = torch.cuda.get_device_properties(torch.device("cuda", 1))
        assert (props.name, props.major, props.minor) == (name, *capability)
        assert props.total_memory == GPUS[gpu] and props.warp_size == 32
        assert props.multi_processor_count == {"H100": 132, "A100 40GB": 108, "T4": 40}[gpu]
        assert torch.cuda.get_arch_list() == [f"sm_{capability[0]}{capability[1]}"]
        assert torch.cuda.is_bf16_supported()  # emulated below 8.0, as torch's own check finds
        assert torch.cuda.is_bf16_supported(including_emulation=False) == (capability >= (8, 0))
        assert torch.cuda.is_tf32_supported() == (capability >= (8, 0))
        assert torch.cuda.synchronize() is None and torch.cuda.synchronize(1) is None
        with pytest.raises(AssertionError, match="Invalid device id.*gpus=3"):
            torch.cuda.get_device_properties(2)
        with pytest.raises(RuntimeError, match="has 2 GPU"):
            torch.cuda.set_device(2)
        with pytest.raises(ValueError, match="Expected a cuda device"):
            torch.cuda.get_device_properties("cpu")


def test_current_device_set_device_and_the_device_context():
    with fv.record(device="cuda:0", gpus=4) as tr:
        assert torch.cuda.current_device() == 0
        with torch.cuda.device(2):
            assert torch.cuda.current_device() == 2 == torch.accelerator.current_device_index()
            a = torch.empty(3, device="cuda")  # no index: the current device, as on a GPU
        assert torch.cuda.current_device() == 0
        torch.cuda.set_device(3)
        b = torch.ones(2, device="cuda")
        other: list[tuple[bool, int]] = []
        t = threading.Thread(target=lambda: other.append((torch.cuda.is_available(), cuda_shim.current_device())))
        t.start()
        t.join()
    assert (a.device, b.device) == (torch.device("cuda", 2), torch.device("cuda", 3))
    # the current device is per thread; another thread is not the record's: torch.cuda answers as torch there
    assert other == [(torch.cuda.is_available(), 0)]
    assert cuda_shim.current_device() == 0  # put back after the block
    assert tr.meta["cuda_api"]["device_count"] == 4


def test_streams_and_events():
    with fv.record(device="cuda:1", gpus=2) as tr:
        assert torch.cuda.current_device() == 0  # torch.device("cuda:1") as default device does not select it
        torch.cuda.set_device(1)
        default = torch.cuda.current_stream()
        assert default == torch.cuda.default_stream() and default.stream_id == 0 and default.device_index == 1
        s = torch.cuda.Stream()
        assert isinstance(s, torch.cuda.Stream) and isinstance(s, torch.Stream) and s != default
        assert s.device == torch.device("cuda", 1) and s.query()
        x = torch.randn(16)
        with torch.cuda.stream(s):
            assert torch.cuda.current_stream() == s
            y = x * 2
        assert torch.cuda.current_stream() == default
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = y + 1
        end.record(s)
        s.wait_stream(default)
        default.wait_event(end)
        end.synchronize()
        s.synchronize()
        assert end.query() and start.elapsed_time(end) == 0.0
        with pytest.raises(ValueError, match="enable_timing=True"):
            torch.cuda.Event().elapsed_time(end)
        with pytest.raises(ValueError, match="recorded"):
            torch.cuda.Event(enable_timing=True).elapsed_time(end)
        assert isinstance(s.record_event(), torch.cuda.Event)
    assert tr.meta["cuda_api"]["elapsed_time"] == 1  # for the fidelity report: no time passes on a fake GPU
    assert y.device == torch.device("cuda", 1)


def test_rng_state_and_seeding():
    bad = torch.zeros(5, dtype=torch.uint8)
    torch.manual_seed(1234)  # outside: torch queues the cuda seeding for CUDA's lazy init
    with fv.record(device="cuda:0", gpus=2):
        assert torch.cuda.initial_seed() == 1234  # as on a GPU, where lazy init applies the queued seed
        torch.cuda.manual_seed(7)
        state = torch.cuda.get_rng_state()
        # CUDAGeneratorImpl::get_state: 16 bytes, the seed as uint64 then the Philox offset, in a CPU ByteTensor
        assert state.dtype == torch.uint8 and state.device.type == "cpu" and not fv.is_fake(state)
        assert state.tolist() == list((7).to_bytes(8, "little") + bytes(8))
        assert torch.cuda.get_rng_state(1).tolist()[:8] == list((1234).to_bytes(8, "little"))
        torch.cuda.manual_seed_all(99)
        assert [torch.cuda.initial_seed() for _ in range(1)] == [99]
        assert [g.initial_seed() for g in torch.cuda.default_generators] == [99, 99]
        torch.cuda.set_rng_state(state)
        assert torch.cuda.initial_seed() == 7
        torch.cuda.seed()
        assert torch.cuda.initial_seed() != 7
        torch.manual_seed(5)  # seeds the cpu and every cuda generator
        assert torch.cuda.initial_seed() == 5 and torch.cuda.get_rng_state_all()[1].tolist()[0] == 5
        with torch.random.fork_rng(devices=[0], device_type="cuda"):
            torch.cuda.manual_seed(11)
        assert torch.cuda.initial_seed() == 5
        with pytest.raises(RuntimeError, match="wrong size"):
            torch.cuda.set_rng_state(bad)
        with pytest.raises(fv.FakeVizError, match="a fake tensor .* pass the tensor torch.cuda.get_rng_state"):
            torch.cuda.set_rng_state(state.clone())  # made inside the session: fake, no bytes
    assert cuda_api.objects.FakeCudaGenerator(0).initial_seed() == 67280421310721  # a fresh CUDA generator's seed
    assert torch.cuda.default_generators == ()


def test_checkpoint_with_dropout_and_a_backward_hook_on_the_worker_thread():
    seen: list[tuple[bool, int, bool, int]] = []

    def hook(g: torch.Tensor) -> torch.Tensor:
        main = threading.current_thread() is threading.main_thread()
        seen.append((main, torch.cuda.current_device(), torch.cuda.is_available(), torch.cuda.memory_allocated()))
        return g

    with fv.record(device="cuda:1", gpus=2) as tr:
        lin = torch.nn.Linear(8, 8)
        w = torch.randn(4, 8, requires_grad=True)
        w.register_hook(hook)
        out = torch.utils.checkpoint.checkpoint(  # saves and restores the cuda RNG state (preserve_rng_state)
            lambda a: torch.nn.functional.dropout(lin(a), 0.5, training=True), w, use_reentrant=False
        )
        out.sum().backward()
    assert tr.error is None and w.grad is not None
    # autograd ran the hook on its cuda:1 device thread, which sees the session and its current device
    assert len(seen) == 1 and seen[0][:3] == (False, 1, True) and seen[0][3] > 0


def test_autocast_cuda():
    with fv.record(device="cuda:0", gpu="T4") as tr:
        a = torch.randn(8, 8, requires_grad=True)
        with torch.autocast("cuda", dtype=torch.float16):
            h = a @ a
        with torch.autocast("cuda", dtype=torch.bfloat16):
            b = a @ a
        (h.float().sum() + b.float().sum()).backward()
    assert (h.dtype, b.dtype, a.grad.dtype) == (torch.float16, torch.bfloat16, torch.float32)
    assert tr.error is None


# ---------------------------------------------------------------- memory
def _expected(trace: Any, n: int, since: int = -1, at_reset: int = 0) -> dict[str, int]:
    """The allocator model of the finished trace, replayed up to "between op n-1 and op n" (the frees seen
    before op n, none of op n's allocations), from its event log."""
    run = replay_trace(trace, "cuda:0", capacity=capacity_of(trace.meta))
    row = {sid: i for i, sid in enumerate(run.storage.tolist())}
    fig = {"allocated": 0, "reserved": 0, "requested": 0, "peak": at_reset, "ooms": 0}
    for action, seq, sid, _addr, size in run.events:
        if seq > n or (seq == n and action != "free"):
            break
        if action in ("alloc", "free"):
            sign = 1 if action == "alloc" else -1
            fig["allocated"] += sign * int(run.block_size[row[sid]])
            fig["requested"] += sign * size
            if action == "alloc" and seq >= since:
                fig["peak"] = max(fig["peak"], fig["allocated"])
        elif action in ("segment_alloc", "segment_free"):
            fig["reserved"] += size if action == "segment_alloc" else -size
        else:
            fig["ooms"] += 1
    return fig


def _read() -> dict[str, int]:
    stats = torch.cuda.memory_stats()
    return {
        "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
        "requested": stats["requested_bytes.all.current"], "peak": torch.cuda.max_memory_allocated(),
        "ooms": stats["num_ooms"],
    }  # fmt: skip


@pytest.mark.parametrize("core", ["c", "python"])
def test_memory_figures_equal_the_trace_at_the_same_op(core: str, monkeypatch: pytest.MonkeyPatch):
    if core == "python":
        monkeypatch.setenv("FAKEVIZ_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("FAKEVIZ_PURE_PYTHON", raising=False)
    points: list[tuple[int, dict[str, int]]] = []
    with fv.record(device="cuda:0") as tr:

        def read() -> None:  # call right before an op: nothing is freed between the reading and the op
            points.append((tr.num_ops, _read()))

        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(64, 256)
        read()
        loss = model(x).square().mean()
        read()
        loss.backward()
        read()
        opt.step()
        read()
        opt.zero_grad()
        read()
        big = torch.empty(3 << 20)  # 12 MiB: a large-pool segment of its own
        read()
        one = torch.ones(1)
        del big  # freed now, before the next op: the reading sees it gone, as on a GPU
        read()
        one.add_(1)
    assert tr.meta["recorder_core"] == core
    run = replay_trace(tr, "cuda:0")
    live = tr.live_bytes()["cuda:0"]
    direct = 0
    for n, got in points:
        assert got == _expected(tr, n), n
        freed_since_last_op = any(e[0] == "free" and e[1] == n for e in run.events)
        if n and not freed_since_last_op:  # then the trace's per-op curves hold the same figures
            assert (got["allocated"], got["reserved"]) == (run.allocated[n - 1], run.reserved[n - 1])
            assert got["requested"] == live[n - 1]
            direct += 1
    assert direct >= 4
    assert points[-1][1]["peak"] == run.peak_allocated and points[-2][1]["allocated"] > points[-1][1]["allocated"]


def test_peak_reset_accumulated_reset_and_the_stats_keys():
    with fv.record(device="cuda:0") as tr:
        a = torch.empty(1 << 20)
        b = torch.empty(2 << 20)
        del b
        torch.cuda.reset_peak_memory_stats()
        n_reset, at_reset = tr.num_ops, torch.cuda.memory_allocated()
        assert torch.cuda.max_memory_allocated() == at_reset
        c = torch.empty(256)
        peak_small = torch.cuda.max_memory_allocated()
        d = torch.empty(5 << 20)
        del d
        n_end, end = tr.num_ops, _read()
        stats = torch.cuda.memory_stats()
        nested = torch.cuda.memory_stats_as_nested_dict()
        torch.cuda.reset_accumulated_memory_stats()
        after_acc = torch.cuda.memory_stats()
        free, total = torch.cuda.mem_get_info()
        torch.cuda.empty_cache()
        torch.ones(1)
    assert peak_small == at_reset + 512 * 2  # 1 KiB of floats: two 512-byte blocks of the small pool
    assert end["peak"] == _expected(tr, n_end, n_reset, at_reset)["peak"] > at_reset
    assert _expected(tr, n_reset)["allocated"] == at_reset
    # every key torch documents for the allocator's core statistics, except the inactive splits
    for stat in (
        "allocation",
        "allocated_bytes",
        "active",
        "active_bytes",
        "requested_bytes",
        "segment",
        "reserved_bytes",
    ):
        for pool in ("all", "small_pool", "large_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{stat}.{pool}.{metric}" in stats
                assert nested[stat][pool][metric] == stats[f"{stat}.{pool}.{metric}"]
        assert stats[f"{stat}.all.current"] == stats[f"{stat}.small_pool.current"] + stats[f"{stat}.large_pool.current"]
    assert stats["allocated_bytes.all.current"] == end["allocated"] and stats["num_ooms"] == 0
    assert stats["allocation.all.current"] == 2  # a and c
    assert (
        after_acc["allocated_bytes.all.allocated"] == 0 and after_acc["allocated_bytes.all.current"] == end["allocated"]
    )
    assert (free, total) == (GPUS["H100"] - end["reserved"], GPUS["H100"])
    assert tr.meta["cuda_api"]["empty_cache"] == [n_end]  # listed: the model releases nothing there
    del a, c


def test_a_modelled_oom_is_counted_with_the_gpus_capacity():
    with fv.record(device="cuda:0", gpu="T4") as tr:  # 15 GiB
        xs = [torch.empty(6 << 30, dtype=torch.uint8) for _ in range(3)]
        n, got = tr.num_ops, _read()
        torch.ones(1)
    assert got["ooms"] == 1 == _expected(tr, n)["ooms"] and got == _expected(tr, n)
    del xs


def test_fake_mode_has_no_memory_figures_and_says_so():
    with fv.fake_mode(device="cuda:0"):
        assert torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
        with pytest.raises(fv.FakeVizError, match=r"memory_stats\(\) on a fake GPU: fakeviz.fake_mode\(\) records"):
            torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # nothing to reset: no error
        with pytest.raises(fv.FakeVizError, match="export_memory_snapshot"):
            torch.cuda.memory._snapshot()


# ---------------------------------------------------------------- lifetime
def test_everything_is_put_back_after_the_block_and_after_an_error():
    before = _snapshot()
    with fv.record(device="cuda:0", gpus=2):
        torch.cuda.set_device(1)
        torch.cuda.set_stream(torch.cuda.Stream())
        assert _changed(before)
    assert not _changed(before)
    with pytest.raises(ZeroDivisionError):
        with fv.record(device="cuda:0", gpus=2):
            torch.cuda.set_device(1)
            torch.cuda.set_stream(torch.cuda.Stream())
            1 / 0  # noqa: B018
    assert not _changed(before)
    with fv.fake_mode(device="cuda:0"):
        assert torch.cuda.current_stream().stream_id == 0  # the stream set in the failed block is gone
    assert not _changed(before)


def test_nested_sessions():
    with fv.fake_mode(device="cuda:0"):
        assert torch.cuda.device_count() == 1
        with fv.fake_mode(device="cuda:3"):
            assert torch.cuda.device_count() == 4
        with fv.fake_mode(device="cpu"):
            assert not torch.cuda.is_available() and torch.cuda.default_generators == ()
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert len(torch.cuda.default_generators) == 1
    assert not torch.cuda.is_available()
    s = fv.FakeSession()
    with fv.record(session=s, device="cuda:0", gpu="A100"):
        model = torch.nn.Linear(4, 4)
    with fv.record(session=s, device="cuda:0", gpu="A100") as tr:
        model(torch.randn(2, 4)).sum().backward()
        assert torch.cuda.get_device_capability() == (8, 0) and torch.cuda.memory_allocated() > 0
    assert tr.error is None


def test_tiny_mixtral_fwd_bwd_on_fake_cuda_takes_the_gpu_path():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    ops = {}
    for gpu in ("H100", "T4"):
        with fv.record(device="cuda:0", gpu=gpu) as tr:
            model = transformers.MixtralForCausalLM(cfg).to(torch.bfloat16)
            ids = torch.randint(0, 64, (2, 8))
            model(input_ids=ids, labels=ids).loss.backward()
        assert tr.error is None
        ops[gpu] = set(tr.strings("ops"))
    # transformers asks get_device_capability(weight.device): grouped_mm from capability 8.0, a fallback below
    assert "aten._grouped_mm.default" in ops["H100"] and "aten._grouped_mm.default" not in ops["T4"]
