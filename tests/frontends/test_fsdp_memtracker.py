"""fakeviz's memory categories side by side with PyTorch's own ``FSDPMemTracker`` on one FSDP2 training step.

The step: a tiny transformer-like model (embedding of 65 rows, 2 blocks of Linear / ReLU / Linear + residual +
LayerNorm, output Linear of 65 rows), ``fully_shard`` on each block and then the root, AdamW (foreach, as on a
GPU), ``model(ids).sum().backward()`` and ``opt.step()``, on rank 0 and 1 of world size 2 and rank 3 of world
size 4, in torch's fake process group on fake H100s. 65 rows split unevenly, so FSDP2 pads every rank's shard
to ``ceil(65 / world)`` rows and the ranks differ.

Two instruments, run separately on the same step (same build, same fake session, same statements):

* ``fv.record(device="cuda:R", gpu="H100", gpus=W)``: one storage per row, its bytes, lifetime and category;
* ``FSDPMemTracker`` (``torch/distributed/_tools/fsdp2_mem_tracker.py``) under ``fv.fake_mode(device="cuda:R")``:
  snapshots (bytes per reftype per device) after the forward, after backward, after the step, at its peak
  and, per FSDP module, at the module's forward and backward peaks. ``fv.fake_mode`` is used because fake
  ``cuda`` needs fakeviz's shim on a CPU-only build, and so that both runs take the same paths (Note: [session
  patches]: foreach kernels for fake tensors; DTensor's shape propagation in a fresh fake mode, as in an eager
  run). Under a plain ``FakeTensorMode`` DTensor propagates shapes in the user's fake mode
  (``ShardingPropagator._propagate_tensor_meta_non_cached``: ``detect_fake_mode() or FakeTensorMode()``), a fake
  mode runs after every user dispatch mode, and ``FSDPMemTracker`` counts those global-shape shadow tensors as
  ``OptState`` (``test_plain_fake_mode_adds_dtensor_shadow_tensors``).

Can ``FSDPMemTracker`` run *inside* ``fv.record``? Yes (``test_memtracker_inside_record``): its snapshots
are identical to its own standalone run, and fakeviz's storages, categories and peaks are identical to
fakeviz's standalone run (with the C recorder; the Python recorder then loses the Parameter role of FSDP2's
unsharded parameters, an xfail there). Only the op log changes: ``FSDPMemTracker.__torch_dispatch__`` returns
``NotImplemented`` for ``DTensor`` arguments, so the DTensor-level call of each of AdamW's ops no longer reaches
fakeviz's mode (see ``test_a_dtensor_op_is_one_op``). The comparison below uses the two standalone runs, so
that neither instrument sees the other.

Units. ``FSDPMemTracker`` counts a cuda storage as ``ceil(bytes / 512) * 512``
(``mem_tracker._WeakRefInfo._calculate_mem_consumed``, the caching allocator's 512-byte minimum block) and a
cpu storage as its bytes; fakeviz's categories are exact bytes. The comparison rounds each fakeviz storage the
same way (``_r``), which is also what fakeviz's own allocator model reports as ``allocated``
(``fakeviz/_analysis/allocator.py``: ``round_size``). With that, every total agrees to the byte: after the
forward, after backward, after the step, the step's peak, the root module's forward and backward peaks.

Categories. Each storage is one category in fakeviz for its whole life; ``FSDPMemTracker`` tags a storage when
its dispatch first sees it (``ACT`` outside backward, ``TEMP`` in backward, ``OPT`` inside ``optimizer.step``)
and re-tags it at FSDP hooks. The map, and where the bytes land differently (each asserted below):

====================================  =====================================================================
FSDPMemTracker                        fakeviz
====================================  =====================================================================
Sharded Param                         Parameter (the DTensor parameter's local, padded storage)
Unsharded Param                       Parameter (the all-gather copy-out buffers FSDP2 frees with
                                      ``untyped_storage().resize_(0)`` and makes again with ``resize_(n)``)
Sharded Grad                          Gradient (the reduce-scatter output: one flat storage per FSDP group)
OptState                              Optimizer state (``exp_avg``, ``exp_avg_sq`` on cuda, ``step`` on cpu)
                                      + Temporary (a)
Inputs                                Input
Activation                            Activation (saved for backward) + Temporary (b) + Parameter (c, d)
Temp, All Gather, Reduce Scatter,     Temporary (an unsharded gradient is the ``.grad`` of FSDP2's unsharded
Unsharded Grad                        parameter only until FSDP2's post-backward takes it and sets ``.grad =
                                      None``; ``Unsharded Grad`` is 0 at every point compared here)
====================================  =====================================================================

(a) Everything made inside ``optimizer.step`` is ``OPT`` to ``FSDPMemTracker`` (``self._in_opt``); fakeviz's
    Optimizer state is what ``optimizer.state`` holds, AdamW's foreach temporaries are Temporary. Only the
    step's peak shows it: the difference is exactly those temporaries.
(b) The loss (``aten.sum``) and backward's seed (``ones_like``, made by ``torch.autograd.backward`` before
    autograd's engine runs): ``ACT`` to ``FSDPMemTracker`` (made outside backward), Temporary to fakeviz (not
    saved for backward). 4 bytes each, 512 after rounding.
(c) The all-gather copy-out buffers of a module being gathered: ``FSDPMemTracker`` sees them made by ops in
    its dispatch (``ACT``) and re-tags them ``UNSHARDED_PARAM`` only once ``FSDPState._pre_forward`` returns
    (``_fsdp_state_pre_forward``); fakeviz calls them Parameter from their first op. At the forward peak (block
    1's copy-out: its all-gather output, block 0's still kept by FSDP2, and its six copy-out buffers alive) the
    block's unsharded bytes are in ``FSDPMemTracker``'s Activation.
(d) Under fake tensors ``data_ptr()`` is 0, so FSDP2's lazy init, on a rank whose shard is padded (owns fewer
    rows than ``ceil(65 / world)``), finds the local tensor "not the same" and pads it again into a new storage
    (``FSDPParam.reset_sharded_param``: ``same_local_tensor`` needs ``data_ptr() > 0``); the old one is freed.
    Both instruments see the new storage (so totals agree); ``FSDPMemTracker`` registered the sharded
    parameters' storages at ``__enter__`` (``_instrument_fsdp_sharded_params_grads``), so the new one is made
    in its dispatch during the forward and stays ``ACT``; fakeviz calls it Parameter (the DTensor parameter's
    local storage). On rank 0 of world 2 the shards own all their rows and nothing moves.

fakeviz's exact (unrounded) bytes are checked against the model's shapes: sharded parameters and gradients
are the padded shards, optimizer state is two unpadded local shards per parameter (AdamW's ``zeros_like`` of
the DTensor), saved activations are what each op saves. ``FSDPMemTracker``'s own storage table (``_WINFO``)
at the end of the step holds the same storages as fakeviz's, byte for byte.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import fakeviz as fv

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
fsdp2_mem_tracker = pytest.importorskip("torch.distributed._tools.fsdp2_mem_tracker")
from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: E402
from torch.distributed._tools import mem_tracker  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

if mem_tracker._PYTORCH_MIN_ALLOCATE != 512:
    pytest.skip("PYTORCH_NO_CUDA_MEMORY_CACHING=1: FSDPMemTracker does not round to 512 bytes", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")  # the head returns a view; harmless here

FSDPMemTracker = fsdp2_mem_tracker.FSDPMemTracker
_FSDPModState = fsdp2_mem_tracker._FSDPModState

VOCAB, D, H, BATCH, SEQ = 65, 32, 128, 2, 8
F32, I64 = 4, 8
ROOT = ("emb.weight", "out.weight", "out.bias")  # the root's own FSDP group; each block is a group
CONFIGS = [(2, 0), (2, 1), (4, 3)]  # (world size, rank)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, H)
        self.fc2 = nn.Linear(H, D)
        self.norm = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.relu(self.fc1(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.out = nn.Linear(D, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


# ------------------------------------------------------------------ the step, under each instrument
def _build(rank: int, world: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.cuda.set_device(rank)
    with unset_fake_temporarily():  # DeviceMesh reads its rank map with .tolist(): a real CPU tensor
        mesh = init_device_mesh("cuda", (world,))
    with torch.device(f"cuda:{rank}"):
        model = Net()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=f"cuda:{rank}")
    return model, opt, ids


def _plain(snap: dict) -> dict[str, dict[str, int]]:
    """A snapshot as {"cuda:0": {"Sharded Param": bytes, ..., "Total": bytes}}."""
    return {str(dev): {getattr(k, "value", k): v for k, v in cats.items()} for dev, cats in snap.items()}


def _tracked_step(model: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> dict[str, Any]:
    mt = FSDPMemTracker(mod=model, optm=opt)
    mt.track_inputs((ids,))
    out: dict[str, Any] = {}
    with mt:
        loss = model(ids).sum()
        out["forward"] = _plain(mt.get_tracker_snapshot())
        loss.backward()
        out["backward"] = _plain(mt.get_tracker_snapshot())
        opt.step()
        out["step"] = _plain(mt.get_tracker_snapshot())
    out["peak"] = _plain(mt.get_tracker_snapshot("peak"))
    root = mt.memory_tracking[model].snapshots
    out["peak_fw"] = _plain(root[_FSDPModState.PEAK_FW][0])
    out["peak_bw"] = _plain(root[_FSDPModState.PEAK_BW][0])
    # its table of live storages (reftype, unrounded bytes, device), read while the step's tensors are alive
    out["winfo"] = Counter(
        (w.reftype.value, w.size, str(w.device)) for w, _ in mt._WINFO.values() if w.size > 0
    )  # fmt: skip
    return out


def _memtracker_run(rank: int, world: int) -> dict[str, Any]:
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=world)
    try:
        with fv.fake_mode(device=f"cuda:{rank}"):
            return _tracked_step(*_build(rank, world))
    finally:
        dist.destroy_process_group()


def _fakeviz_run(rank: int, world: int, *, nested: bool = False) -> tuple[Any, dict[str, Any] | None]:
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=world)
    mt = None
    try:
        with fv.record(device=f"cuda:{rank}", gpu="H100", gpus=world) as trace:
            model, opt, ids = _build(rank, world)
            if nested:
                mt = _tracked_step(model, opt, ids)
            else:
                loss = model(ids).sum()
                loss.backward()
                opt.step()  # the loss stays alive, as in the tracked step
    finally:
        dist.destroy_process_group()
    return trace, mt


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda p: f"world{p[0]}-rank{p[1]}")
def runs(request: pytest.FixtureRequest) -> dict[str, Any]:
    world, rank = request.param
    trace, _ = _fakeviz_run(rank, world)
    return {"world": world, "rank": rank, "dev": f"cuda:{rank}", "mt": _memtracker_run(rank, world), "trace": trace}


# ------------------------------------------------------------------ figures from the shapes
def _r(n: Any) -> Any:
    """FSDPMemTracker's bytes for a cuda storage of ``n`` bytes (0 stays 0)."""
    return -(-np.asarray(n) // 512) * 512


def _hand(world: int, rank: int) -> dict[str, Any]:
    """Bytes per parameter from its global shape: FSDP2 shards dim 0 into ``ceil(d0 / world)`` rows per rank
    (the storage, padded) of which the rank owns ``min(rows, d0 - rank * rows)`` (its local tensor)."""
    with torch.device("meta"):
        shapes = {n: tuple(p.shape) for n, p in Net().named_parameters()}
    padded, owned, rows_owned, rows_padded = {}, {}, {}, {}
    for n, s in shapes.items():
        rows, rest = math.ceil(s[0] / world), math.prod(s[1:])
        rows_padded[n], rows_owned[n] = rows, max(0, min(rows, s[0] - rank * rows))
        padded[n], owned[n] = rows * rest * F32, rows_owned[n] * rest * F32
    groups = [list(ROOT)] + [[n for n in shapes if n.startswith(f"blocks.{i}.")] for i in range(2)]
    repadded = [n for n in shapes if rows_owned[n] != rows_padded[n]]  # (d) of the module docstring
    tokens = BATCH * SEQ
    # saved for backward: the embedding's output (fc1's input); per block fc1's ReLU output (also fc2's
    # input), the residual sum (LayerNorm's input), LayerNorm's output (the next Linear's input), mean, rstd
    saved = [tokens * D * F32] + 2 * [tokens * H * F32, tokens * D * F32, tokens * D * F32, tokens * F32, tokens * F32]
    return {
        "sharded": sum(padded.values()),  # exact
        "mt_sharded": int(sum(_r(padded[n]) for n in shapes if n not in repadded)),
        "repad": int(sum(_r(padded[n]) for n in repadded)),
        "root_unsharded": int(sum(_r(world * padded[n]) for n in ROOT)),  # the copy-out buffers (padded)
        "block_unsharded": int(sum(_r(world * padded[n]) for n in groups[1])),
        "block_all_gather": int(_r(world * sum(padded[n] for n in groups[1]))),  # one flat buffer per group
        "grads": sum(padded.values()),  # one flat reduce-scatter output per group, the padded shards
        "mt_grads": int(sum(_r(sum(padded[n] for n in g)) for g in groups)),
        "opt": 2 * sum(owned.values()),  # exp_avg and exp_avg_sq: zeros_like of the (unpadded) local shard
        "mt_opt": int(2 * sum(_r(b) for b in owned.values())),
        "steps": len(shapes) * F32,  # AdamW's step: a 0-dim float32 tensor per parameter, on cpu
        "saved": sum(saved),
        "mt_saved": int(sum(_r(b) for b in saved)),
        "input": BATCH * SEQ * I64,
        "scalar": int(_r(F32)),  # the loss, backward's seed
    }


# ------------------------------------------------------------------ fakeviz's storages at a point
class _Fv:
    """fakeviz's storages on one device, with their bytes as FSDPMemTracker counts them (``r``)."""

    def __init__(self, trace: Any, dev: str) -> None:
        st = trace.storages
        self.st = st[st.device == dev].copy()
        self.st["r"] = _r(self.st.nbytes.to_numpy())
        self.a, self.f = self.st.alloc_seq.to_numpy(), self.st.free_seq.to_numpy()
        ops = trace.ops
        self.phase = ops.phase.astype(str).to_numpy()
        losses = ops.seq[ops.op == "aten.sum.default"]
        assert len(losses) == 1
        self.loss_seq = int(losses.iloc[0])  # the forward ends at the loss (no other full sum in the step)
        self.last_bwd = int(ops.seq[ops.phase == "optimizer"].min()) - 1  # the last op before the step
        self.n = trace.num_ops

    def row(self, s: int) -> np.ndarray:
        """Alive right after op ``s`` (a row of ``trace.memory()``)."""
        return (self.a <= s) & ((self.f < 0) | (self.f > s))

    def after(self, s: int) -> np.ndarray:
        """Alive after op ``s`` once Python has dropped what it drops before the next op (a snapshot taken
        between two statements: a storage freed after op ``s`` carries ``free_seq == s + 1``)."""
        return (self.a <= s) & ((self.f < 0) | (self.f > s + 1))

    def end(self) -> np.ndarray:
        return self.f < 0

    def cats(self, mask: np.ndarray, col: str = "r") -> dict[str, int]:
        got = self.st[mask].groupby("category", observed=True)[col].sum()
        return {str(k): int(v) for k, v in got.items() if v}

    def curve(self) -> np.ndarray:
        return np.array([int(self.st.r[self.row(s)].sum()) for s in range(self.n)])


def _nonzero(snap: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in snap.items() if v and k != "Total"}


# ------------------------------------------------------------------ the tests
def test_memtracker_figures_are_the_shapes(runs: dict[str, Any]) -> None:
    """The reference first: FSDPMemTracker's categories after the step are the hand-computed ones."""
    hand, mt, dev = _hand(runs["world"], runs["rank"]), runs["mt"], runs["dev"]
    assert _nonzero(mt["step"][dev]) == {
        "Sharded Param": hand["mt_sharded"],
        "Sharded Grad": hand["mt_grads"],
        "OptState": hand["mt_opt"],
        "Inputs": int(_r(hand["input"])),
        "Activation": hand["scalar"] + hand["repad"],  # the loss (b) and the re-padded shards (d)
    }
    assert _nonzero(mt["step"]["cpu"]) == {"OptState": hand["steps"]}
    # forward: the root keeps its parameters gathered (FSDP2 does not reshard the root after forward)
    assert mt["forward"][dev]["Unsharded Param"] == hand["root_unsharded"]
    assert mt["forward"][dev]["Activation"] == hand["mt_saved"] + hand["scalar"] + hand["repad"]
    assert (hand["repad"] == 0) == ((runs["world"], runs["rank"]) == (2, 0))  # rank 0 of 2 owns all its rows


def test_totals_agree_to_the_byte(runs: dict[str, Any]) -> None:
    """After the forward, after backward, after the step: the same bytes on the GPU and on the CPU."""
    fvs, mt, dev, trace = _Fv(runs["trace"], runs["dev"]), runs["mt"], runs["dev"], runs["trace"]
    for name, mask in (("forward", fvs.after(fvs.loss_seq)), ("backward", fvs.after(fvs.last_bwd)),
                       ("step", fvs.end())):  # fmt: skip
        assert mt[name][dev]["Total"] == int(fvs.st.r[mask].sum()), name
    # cpu: nothing before the step; after it AdamW's step tensors, unrounded in both
    assert "cpu" not in mt["forward"] and "cpu" not in mt["backward"]
    cpu = trace.storages[trace.storages.device == "cpu"]
    hand = _hand(runs["world"], runs["rank"])
    assert mt["step"]["cpu"]["Total"] == int(cpu.nbytes[cpu.free_seq < 0].sum()) == hand["steps"]


def test_peaks_agree_to_the_byte(runs: dict[str, Any]) -> None:
    """The step's peak per device, and the root module's forward and backward peaks."""
    fvs, mt, dev, trace = _Fv(runs["trace"], runs["dev"]), runs["mt"], runs["dev"], runs["trace"]
    curve = fvs.curve()
    assert mt["peak"][dev]["Total"] == curve.max()
    # fakeviz's own allocator model rounds every request to 512 bytes as FSDPMemTracker does: its
    # `allocated` column is this curve, its maximum the tracker's peak
    mem = trace.memory()
    mem = mem[mem.device == dev]
    assert (mem.allocated.to_numpy() == curve).all()
    assert mem.allocated.max() == mt["peak"][dev]["Total"]
    # fakeviz's exact peak is at the same op; exact bytes there are the rounded ones less the rounding
    pk = trace.peak_bytes()[dev]
    s = int(curve.argmax())
    assert pk["seq"] == s
    assert pk["bytes"] == mt["peak"][dev]["Total"] - int((fvs.st.r - fvs.st.nbytes)[fvs.row(s)].sum())
    # where: in the step (AdamW's temporaries on the state) at world 2; in backward at world 4, where the
    # state is a quarter of the parameters and the gathered block dominates
    assert fvs.phase[s] == ("optimizer" if runs["world"] == 2 else "backward")
    assert (mt["peak"][dev]["OptState"] > 0) == (fvs.phase[s] == "optimizer")
    # cpu: 15 step tensors and the `torch.tensor(1.0)` AdamW adds to them, unrounded in both
    assert mt["peak"]["cpu"]["Total"] == trace.peak_bytes()["cpu"]["bytes"] == _hand(2, 0)["steps"] + F32
    # the root module's peaks: FSDPMemTracker's PEAK_FW / PEAK_BW are the highest point of the forward and
    # of the backward, fakeviz's the highest row of each phase
    for phase, key in (("forward", "peak_fw"), ("backward", "peak_bw")):
        rows = np.flatnonzero(fvs.phase == phase)
        assert mt[key][dev]["Total"] == curve[rows].max(), phase


def test_categories_after_forward(runs: dict[str, Any]) -> None:
    hand, fvs, dev = _hand(runs["world"], runs["rank"]), _Fv(runs["trace"], runs["dev"]), runs["dev"]
    mt, ours = runs["mt"]["forward"][dev], fvs.cats(fvs.after(fvs.loss_seq))
    exact = fvs.cats(fvs.after(fvs.loss_seq), "nbytes")
    assert set(ours) == {"Parameter", "Activation", "Temporary", "Input"}
    assert _nonzero(mt).keys() == {"Sharded Param", "Unsharded Param", "Activation", "Inputs"}
    # Parameter: the shards and the root's gathered parameters, plus the re-padded shards (d)
    assert ours["Parameter"] == mt["Sharded Param"] + mt["Unsharded Param"] + hand["repad"]
    assert mt["Sharded Param"] == hand["mt_sharded"] and mt["Unsharded Param"] == hand["root_unsharded"]
    # Activation: fakeviz's saved tensors, the loss (b) and the re-padded shards (d)
    assert ours["Activation"] == hand["mt_saved"] and exact["Activation"] == hand["saved"]
    assert ours["Temporary"] == hand["scalar"]  # the loss
    assert mt["Activation"] == ours["Activation"] + ours["Temporary"] + hand["repad"]
    assert mt["Inputs"] == ours["Input"] and exact["Input"] == hand["input"]


def test_categories_after_backward(runs: dict[str, Any]) -> None:
    hand, fvs, dev = _hand(runs["world"], runs["rank"]), _Fv(runs["trace"], runs["dev"]), runs["dev"]
    mt, ours = runs["mt"]["backward"][dev], fvs.cats(fvs.after(fvs.last_bwd))
    exact = fvs.cats(fvs.after(fvs.last_bwd), "nbytes")
    assert set(ours) == {"Parameter", "Gradient", "Temporary", "Input"}
    assert _nonzero(mt).keys() == {"Sharded Param", "Sharded Grad", "Activation", "Inputs"}
    # every unsharded parameter is resharded (resize_(0)) in both; the shards are Parameter, exact bytes
    assert ours["Parameter"] == mt["Sharded Param"] + hand["repad"] and exact["Parameter"] == hand["sharded"]
    # the reduce-scatter outputs: Sharded Grad there, Gradient here, the padded shards exactly
    assert ours["Gradient"] == mt["Sharded Grad"] == hand["mt_grads"] and exact["Gradient"] == hand["grads"]
    assert mt["Activation"] == ours["Temporary"] + hand["repad"] == hand["scalar"] + hand["repad"]  # (b), (d)
    assert mt["Inputs"] == ours["Input"]


def test_categories_after_the_step(runs: dict[str, Any]) -> None:
    hand, fvs, dev = _hand(runs["world"], runs["rank"]), _Fv(runs["trace"], runs["dev"]), runs["dev"]
    trace = runs["trace"]
    mt, ours, exact = runs["mt"]["step"][dev], fvs.cats(fvs.end()), fvs.cats(fvs.end(), "nbytes")
    assert set(ours) == {"Parameter", "Gradient", "Optimizer state", "Temporary", "Input"}
    assert ours["Parameter"] == mt["Sharded Param"] + hand["repad"] and exact["Parameter"] == hand["sharded"]
    assert ours["Gradient"] == mt["Sharded Grad"] and exact["Gradient"] == hand["grads"]
    # optimizer state: the same storages, exact bytes 2 x the unpadded local shards
    assert ours["Optimizer state"] == mt["OptState"] == hand["mt_opt"] and exact["Optimizer state"] == hand["opt"]
    assert mt["Activation"] == ours["Temporary"] + hand["repad"]  # the loss (b), the re-padded shards (d)
    cpu = trace.storages[(trace.storages.device == "cpu") & (trace.storages.free_seq < 0)]
    assert set(cpu.category) == {"Optimizer state"} and int(cpu.nbytes.sum()) == runs["mt"]["step"]["cpu"]["OptState"]
    # FSDPMemTracker's own storage table: the same storages, byte for byte, category for category
    to_ours = {"Sharded Param": "Parameter", "Sharded Grad": "Gradient", "OptState": "Optimizer state",
               "Inputs": "Input"}  # fmt: skip
    theirs = Counter()
    for (ref, size, d), k in runs["mt"]["winfo"].items():
        if ref == "Activation":  # the loss (b) is Temporary here, a re-padded shard (d) a Parameter
            ref = "Temporary" if size == F32 else "Parameter"
        theirs[(to_ours.get(ref, ref), size, d)] += k
    live = trace.storages[(trace.storages.free_seq < 0) & (trace.storages.nbytes > 0)]
    assert theirs == Counter(zip(live.category.astype(str), live.nbytes, live.device.astype(str)))


def test_categories_at_the_peaks(runs: dict[str, Any]) -> None:
    """At each peak the categories move between the two by (a), (b), (c), (d) and nothing else."""
    hand, fvs, dev = _hand(runs["world"], runs["rank"]), _Fv(runs["trace"], runs["dev"]), runs["dev"]
    curve = fvs.curve()
    # the step's peak (world 2: in the optimizer; world 4: in backward, the same point as the root's PEAK_BW)
    s = int(curve.argmax())
    mt, ours = runs["mt"]["peak"][dev], fvs.cats(fvs.row(s))
    assert ours["Parameter"] == mt["Sharded Param"] + mt["Unsharded Param"] + hand["repad"]
    assert ours.get("Gradient", 0) == mt["Sharded Grad"] and mt["Unsharded Grad"] == 0
    assert ours["Input"] == mt["Inputs"]
    if fvs.phase[s] == "optimizer":
        # (a): the tracker's OptState is fakeviz's Optimizer state plus AdamW's temporaries, all of
        # fakeviz's Temporary but the loss (b)
        assert ours["Optimizer state"] == hand["mt_opt"]
        assert mt["OptState"] == ours["Optimizer state"] + ours["Temporary"] - hand["scalar"]
        assert mt["Activation"] == hand["scalar"] + hand["repad"]
    else:
        assert "Optimizer state" not in ours and mt["OptState"] == 0
        # backward, while a block is gathered: fakeviz's Temporary is the tracker's Temp, All Gather and
        # Reduce Scatter, plus the loss and backward's seed (b); its Activation the saved tensors left
        assert ours["Temporary"] == mt["Temp"] + mt["All Gather"] + mt["Reduce Scatter"] + 2 * hand["scalar"]
        assert mt["Activation"] == ours["Activation"] + 2 * hand["scalar"] + hand["repad"]
    # the root's forward peak: a block's all-gather output and its copy-out buffers are alive; the buffers
    # are Parameter here and still Activation there (c); the all-gather output is Temporary here
    rows = np.flatnonzero(fvs.phase == "forward")
    s = int(rows[curve[rows].argmax()])
    mt, ours = runs["mt"]["peak_fw"][dev], fvs.cats(fvs.row(s))
    assert ours["Parameter"] == mt["Sharded Param"] + mt["Unsharded Param"] + hand["block_unsharded"] + hand["repad"]
    assert mt["Unsharded Param"] == hand["root_unsharded"]
    # two all-gather outputs: block 1's, and block 0's, kept until block 1's copy-out is done
    # (FSDPParamGroup.wait_for_unshard defers its free to overlap the next all-gather: AllGatherState)
    assert ours["Temporary"] == mt["All Gather"] == 2 * hand["block_all_gather"]
    assert mt["Activation"] == ours["Activation"] + hand["block_unsharded"] + hand["repad"]
    # the root's backward peak: everything gathered is Unsharded Param there, Parameter here
    rows = np.flatnonzero(fvs.phase == "backward")
    s = int(rows[curve[rows].argmax()])
    mt, ours = runs["mt"]["peak_bw"][dev], fvs.cats(fvs.row(s))
    assert ours["Parameter"] == mt["Sharded Param"] + mt["Unsharded Param"] + hand["repad"]
    assert ours.get("Gradient", 0) == mt["Sharded Grad"] and mt["Unsharded Grad"] == 0
    assert ours["Temporary"] == mt["Temp"] + mt["All Gather"] + mt["Reduce Scatter"] + 2 * hand["scalar"]
    assert mt["Activation"] == ours["Activation"] + 2 * hand["scalar"] + hand["repad"]


def _nested_runs() -> dict[str, Any]:
    world, rank = 2, 1
    inner, mt = _fakeviz_run(rank, world, nested=True)
    alone, _ = _fakeviz_run(rank, world)
    return {"inner": inner, "mt_inner": mt, "alone": alone, "mt_alone": _memtracker_run(rank, world)}


def test_memtracker_inside_record(recorder: str) -> None:
    """FSDPMemTracker inside fv.record: each measures what it measures alone (with the Python recorder too: its
    Note: [Parameter detach] looks far enough up for the tracker's frames)."""
    runs = _nested_runs()
    a, b = runs["mt_inner"], runs["mt_alone"]
    assert all(a[k] == b[k] for k in ("forward", "backward", "step", "peak", "peak_fw", "peak_bw", "winfo"))
    inner, alone = runs["inner"], runs["alone"]
    for dev in ("cuda:1", "cpu"):
        assert inner.peak_bytes()[dev]["bytes"] == alone.peak_bytes()[dev]["bytes"], dev
    key = ["device", "nbytes", "category", "phase", "op"]
    assert Counter(map(tuple, inner.storages[key].astype(str).values)) == Counter(
        map(tuple, alone.storages[key].astype(str).values)
    )
    for t in (inner, alone):  # and fakeviz agrees with the tracker that ran inside it
        assert int(t.memory().query("device == 'cuda:1'").allocated.max()) == a["peak"]["cuda:1"]["Total"]
    # the same op log: the DTensor-level calls the tracker turns away (NotImplemented for DTensor arguments,
    # FSDPMemTracker.__torch_dispatch__) fakeviz does not record alone either (Note: [wrapper calls are not ops])
    assert Counter(alone.ops.op) == Counter(inner.ops.op)


def test_a_dtensor_op_is_one_op() -> None:
    """Inside FSDPMemTracker fakeviz sees each DTensor op once (the local op), and alone too (Note: [wrapper
    calls are not ops]); the FLOPs agree (the outer call's were once counted on top of the local op's)."""
    runs = _nested_runs()
    inner, alone = runs["inner"], runs["alone"]
    assert Counter(alone.ops.op) == Counter(inner.ops.op)
    assert alone.flops()["optimizer"] == inner.flops()["optimizer"]


def test_plain_fake_mode_adds_dtensor_shadow_tensors() -> None:
    """Why the tracker runs under ``fv.fake_mode``: under a plain FakeTensorMode it also counts DTensor's shape
    propagation (global-shape tensors made inside ``optimizer.step``, so ``OptState``), which an eager run
    does not have. On cpu (no fake cuda needed), rank 0 of 2: the same step, the same end state, a higher
    peak, and the whole difference in OptState."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def run(mode: Any) -> dict[str, Any]:
        dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
        try:
            with mode():
                with unset_fake_temporarily():
                    mesh = init_device_mesh("cpu", (2,))
                model = Net()
                for b in model.blocks:
                    fully_shard(b, mesh=mesh)
                fully_shard(model, mesh=mesh)
                opt = torch.optim.AdamW(model.parameters(), foreach=True)  # as on cuda
                return _tracked_step(model, opt, torch.randint(0, VOCAB, (BATCH, SEQ)))
        finally:
            dist.destroy_process_group()

    plain, ours = run(FakeTensorMode), run(fv.fake_mode)
    assert plain["step"] == ours["step"] and plain["winfo"] == ours["winfo"]
    extra = plain["peak"]["cpu"]["OptState"] - ours["peak"]["cpu"]["OptState"]
    assert extra > 0 and plain["peak"]["cpu"]["Total"] - ours["peak"]["cpu"]["Total"] == extra
    assert {k: v for k, v in plain["peak"]["cpu"].items() if k not in ("OptState", "Total")} == {
        k: v for k, v in ours["peak"]["cpu"].items() if k not in ("OptState", "Total")
    }
    # the tracker's peak is now the last shadow argument of AdamW's last foreach call,
    # _foreach_addcdiv_(params, exp_avgs, denominators): three lists of global-shape tensors, each list the
    # global parameters' bytes, on top of the same local tensors as at the peak under fv.fake_mode
    with torch.device("meta"):
        global_bytes = sum(p.numel() for p in Net().parameters()) * F32
    assert extra == 3 * global_bytes
