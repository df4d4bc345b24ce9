"""Many GPUs with torch.distributed itself: :func:`simulate` runs the user's step once per rank under fake
tensors, in torch's own fake process group, and returns a :class:`Simulation`.

Note: [ranks under the fake process group]
Each rank is one recording: ``init_process_group("fake", store=FakeStore(), rank=r, world_size=n)`` (torch's
``torch.testing._internal.distributed.fake_pg``: every collective completes at once and moves no data), the
rank's fake GPU made current (``cuda:{r % gpus_per_node}``, so ``fully_shard`` and ``DeviceMesh`` put it
where a launcher would), ``init_device_mesh(device, mesh_shape, mesh_dim_names=...)``, then ``step(rank,
mesh)``: the user's code builds, shards or parallelizes (``fully_shard``, ``parallelize_module``,
``torch.distributed.pipelining``), and trains. Everything rank dependent is torch's own: DTensor's local
shard shapes (uneven splits differ by rank), FSDP2's padded shards, a pipeline stage's layers. The
collectives are ops in each record with their group and bytes (Note: [collectives in the record]); FSDP2's
all-gather and reduce-scatter buffers are storages like any other, so they are in the peak when they are
alive at it. The group is destroyed after each rank (and DeviceMesh's stack emptied): no state leaks from
one rank into the next, and none is left behind.

What the fake group cannot do is hand a rank data another rank made: a collective whose *result values*
the step reads (``all_gather_object``, a loss all-reduced then ``.item()``) has no values under fake tensors;
the step fails there with the rank, the user's line and what to do (:class:`~fakeviz.SimulationError`).

Classes: two ranks are one class when their records are the same op for op (op, output shapes, dtypes, bytes,
phase), devices and group members aside: "the same up to rank numbering". A rank that was not recorded because
a recorded one stands for it (``stand_ins``: only where fakeviz built the step and knows which ranks are
identical, Note: [parallel plans] in :mod:`fakeviz._frontends.parallel`) is in its stand-in's class.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from .._analysis import placement as _placement
from .._analysis.collectives import ranks_text as _ranks_text
from .._core.errors import ArgumentError, FakeVizError, SimulationError
from .._core.gpus import Capacity, check_count, parse_gpus
from .._engine.distributed import Mailbox as _Mailbox
from . import offload, steps

__all__ = ["Simulation", "simulate"]


@dataclass
class _Rank:
    """One rank as :mod:`fakeviz._views.compare` reads a run: its trace, its GPU's capacity, a label."""

    rank: int
    trace: Any
    capacities: dict[str, int]

    @property
    def label(self) -> str:
        return f"rank {self.rank}"


class Simulation:
    """Every recorded rank of a :func:`simulate` run.

    ``trace(rank)``; ``peaks``: one row per rank (its GPU): peak and bytes by kind, capacity, headroom, fits,
    class, recorded; ``classes``: groups of ranks whose records are the same up to rank numbering; ``fits``;
    ``stand_ins``: rank -> the recorded rank whose record is its own (ranks found identical, not re-recorded);
    ``collectives(rank)``: that rank's collectives (group, bytes in and out, ring bytes sent and received);
    ``explore()``: per-rank bars side by side and a rank picker over each rank's explorer.
    """

    def __init__(self, *, world_size: int, mesh_shape: tuple[int, ...], mesh_dim_names: tuple[str, ...] | None,
                 device: str, gpu: Capacity, gpus_per_node: int, ranks: list[int],
                 tokens: int | None = None) -> None:  # fmt: skip
        self.world_size = world_size
        self.mesh_shape = mesh_shape
        self.mesh_dim_names = mesh_dim_names
        self.device = device
        self.gpu = gpu
        self.gpus_per_node = gpus_per_node
        self.requested = ranks
        self.traces: dict[int, Any] = {}
        self.stand_ins: dict[int, int] = {}
        self.error: SimulationError | None = None
        self.settings: dict[str, Any] = {}
        self.tokens = tokens  # simulate(tokens=): the tokens one step of the whole job processes
        self.mailbox = _Mailbox()  # the values ranks send each other (Note: [values between simulated ranks])

    # ------------------------------------------------------------------------------------------ reading
    @property
    def ranks(self) -> list[int]:
        """The ranks recorded (in order)."""
        return sorted(self.traces)

    @property
    def covered(self) -> list[int]:
        """The ranks recorded or stood in for by a recorded one (in order)."""
        return sorted({*self.traces, *self.stand_ins})

    @property
    def complete(self) -> bool:
        """Every requested rank recorded (or stood in for), none failed."""
        return self.error is None and set(self.requested) <= set(self.covered)

    def device_of(self, rank: int) -> str:
        return f"{self.device}:{rank % self.gpus_per_node}" if self.device != "cpu" else "cpu"

    def trace(self, rank: int) -> Any:
        """The record of ``rank``'s step (partial, with ``error`` set, for the rank that failed); for a stand-in
        rank, the record of the rank recorded for it (``stand_ins[rank]``: its devices are that rank's)."""
        rank = self.stand_ins.get(rank, rank)
        if rank not in self.traces:
            raise KeyError(f"rank {rank} was not recorded; recorded: {_ranks_text(self.ranks)}")
        return self.traces[rank]

    def _runs(self) -> list[_Rank]:
        return [_Rank(r, self.traces[r], {self.device_of(r): self.gpu.bytes}) for r in self.ranks]

    @functools.cached_property
    def _signatures(self) -> dict[int, str]:
        return {r: _signature(self.traces[r]) for r in self.ranks}

    @functools.cached_property
    def _class_index(self) -> dict[int, int]:
        """rank -> class (0, 1, ... in order of each class's first rank)."""
        first: dict[str, int] = {}
        index = {r: first.setdefault(self._signatures[r], len(first)) for r in self.ranks}
        return dict(sorted({**index, **{r: index[s] for r, s in self.stand_ins.items()}}.items()))

    def class_of(self, rank: int) -> int:
        """The class of a recorded rank (a row of :attr:`classes`)."""
        return self._class_index[rank]

    @functools.cached_property
    def classes(self) -> pd.DataFrame:
        """One row per class of ranks whose records are the same up to rank numbering: ``class`` (0, 1, ...
        in order of the first rank), ``ranks``, ``count``, ``recorded`` (its ranks that were recorded; the
        others stood in for), ``ops``, ``peak`` (of its first recorded rank), ``fits``, ``step_s`` (its first
        recorded rank's estimated step time on this GPU kind; NaN without a kind or when a rank failed)."""
        members: dict[int, list[int]] = {}
        for r, k in self._class_index.items():
            members.setdefault(k, []).append(r)
        pk = offload.gpu_rows(self.peaks).set_index("rank")
        rows = []
        for k, rs in sorted(members.items()):
            done = [r for r in rs if r in self.traces]
            st = self._rank_times.get(done[0])
            rows.append({"class": k, "ranks": _ranks_text(rs), "count": len(rs), "recorded": _ranks_text(done),
                         "ops": self.traces[done[0]].num_ops, "peak": int(pk.loc[done[0], "peak"]),
                         "fits": bool(pk.loc[rs, "fits"].all()),
                         "step_s": st.step_s if st is not None else float("nan")})  # fmt: skip
        return pd.DataFrame(rows, columns=["class", "ranks", "count", "recorded", "ops", "peak", "fits", "step_s"])

    @functools.cached_property
    def peaks(self) -> pd.DataFrame:
        """One row per recorded rank: rank, device, the bytes by kind at its peak (weights, gradients, optimizer,
        kv_cache, activations, temporaries, other), peak (the caching allocator's reserved bytes at peak), judged
        (the bytes the verdict judged, Note: [the verdict]), capacity, headroom (capacity - judged), fits (False for
        a rank whose step failed), verdict (its text), class, recorded (False: a stand-in, its row its recorded
        rank's on its own device)."""
        frames = {}
        for run in self._runs():
            t = offload.with_host_row(_placement.peaks_table(run.trace, run.capacities), run.trace, self.settings)
            t.insert(0, "rank", run.rank)
            t["class"] = self._class_index[run.rank]
            t["recorded"] = True
            if run.trace.error is not None:
                t["fits"] = False
            frames[run.rank] = t
        for r, s in self.stand_ins.items():
            t = frames[s].copy()
            t["rank"], t["recorded"] = r, False
            gpu_row = t.device != "cpu"
            # its verdict names its own device (the text starts with the recorded rank's: judged_text)
            t.loc[gpu_row, "verdict"] = [self.device_of(r) + v[len(d):] if v.startswith(d) else v
                                         for d, v in zip(t.device[gpu_row], t.verdict[gpu_row])]  # fmt: skip
            t.loc[gpu_row, "device"] = self.device_of(r)  # its host row stays the host's (Note: [offload])
            frames[r] = t
        if not frames:
            return pd.DataFrame(columns=["rank", "device", "peak", "judged", "capacity", "headroom", "fits", "verdict"])
        return pd.concat([frames[r] for r in sorted(frames)], ignore_index=True)

    @property
    def fits(self) -> bool:
        """Every requested rank recorded, without error, under its GPU's capacity."""
        return self.complete and bool(self.peaks.fits.all())

    def transfers(self, rank: int | None = None) -> pd.DataFrame:
        """Bytes ``rank`` (default: the first recorded) copies between its host and its GPU, one row per direction
        (``src``, ``dst``, ``copies``, ``bytes``; as :attr:`fakeviz.Plan.transfers`; Note: [offload])."""
        return _placement.transfers(self.trace(self.ranks[0] if rank is None else rank))

    def collectives(self, rank: int | None = None) -> pd.DataFrame:
        """The collectives of ``rank`` (default: the first recorded): :func:`fakeviz._analysis.collectives.collectives`."""
        from .._analysis.collectives import collectives

        return collectives(self.trace(self.ranks[0] if rank is None else rank))

    # ---------------------------------------------------------------------------------------- how long
    @functools.cached_property
    def _rank_times(self) -> dict[int, Any]:
        """Recorded rank -> the estimated time of its step (:func:`.steps.window_time`) on this GPU kind, with this
        machine's ``gpus_per_node`` (a group within a node talks over NVLink, across nodes over the network)."""
        gpu, note = steps.gpu_kind([self.gpu], written="gpu")
        if note or any(self.traces[r].error for r in self.ranks):
            return {}
        return {r: steps.window_time(self.traces[r], gpu, steps.step_start(self.traces[r]),
                                     gpus_per_node=self.gpus_per_node) for r in self.ranks}  # fmt: skip

    @functools.cached_property
    def speed(self) -> steps.Speed:
        """How long a step takes on this GPU kind (:class:`~fakeviz._frontends.steps.Speed`): the slowest recorded
        rank's step (each rank's collectives timed by the time model, NVLink within ``gpus_per_node``), the model
        FLOPs of every rank (a stand-in counts as its recorded rank; ranks neither recorded nor stood in for count
        as the mean of those that were), tokens over all data-parallel replicas for ``fv.plan(parallel=...)``, and
        for a step of your own the ``tokens=`` given to :func:`simulate` (None without: fakeviz cannot tell
        which of your step's inputs are tokens)."""
        gpu, note = steps.gpu_kind([self.gpu], written="gpu")
        count = {r: 1 for r in self.ranks}
        for s in self.stand_ins.values():
            count[s] = count.get(s, 0) + 1
        scale = self.world_size / max(1, len(self.covered))
        s = self.settings
        tokens = self.tokens
        tp, replicated = 1, ()
        if {"batch", "seq", "parallel"} <= set(s):
            par = s["parallel"]
            tokens = steps.tokens_per_step(s, par.get("dp_replicate", 1) * par.get("dp_shard", 1))
            tp, replicated = par.get("tp", 1), tuple(s.get("tp_replicated") or ())
        times = [self._rank_times[r] for r in self.ranks] if self._rank_times else None
        return steps.speed([(self.traces[r], count[r] * scale) for r in self.ranks], gpu=gpu, gpus=self.world_size,
                           tokens=tokens, note=note, replicated=replicated, tp=tp, times=times,
                           gpus_per_node=self.gpus_per_node)  # fmt: skip

    @property
    def step_s(self) -> float | None:
        """Estimated seconds per step: the slowest rank's (None: no GPU kind, ``speed.note`` says why)."""
        return self.speed.step_s

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second over all ranks (``fv.plan(parallel=...)``: ``batch x seq`` per data-parallel replica)."""
        return self.speed.tokens_per_s

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization over all ranks (Note: [model FLOPs] in :mod:`fakeviz._frontends.steps`)."""
        return self.speed.mfu

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilization over all ranks (every matrix FLOP run, recomputation included)."""
        return self.speed.hfu

    @property
    def text(self) -> str:
        n = len(self.ranks)
        k = len(self.classes)
        gpu_peaks = offload.gpu_rows(self.peaks)
        # the rank closest to (or furthest over) its capacity, in the verdict's words (Note: [the verdict])
        worst = gpu_peaks.loc[gpu_peaks.headroom.astype(float).idxmin()] if n else None
        state = "fits" if self.fits else ("incomplete" if not self.complete else "does not fit")
        head = f"{state}: {n} of {self.world_size} ranks recorded"
        if self.stand_ins:
            head += f" ({len(self.stand_ins)} more found identical to one of them)"
        head += f", {k} class{'es' if k != 1 else ''}"
        if worst is not None:
            head += f"; rank {int(worst['rank'])}: {worst['verdict']}"
        if self.error is not None:
            head += f"; rank {self.error.rank} failed"
        return f"{head}; {self.speed.text()}" if n else head

    def __repr__(self) -> str:
        mesh = "x".join(map(str, self.mesh_shape))
        names = f" {self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"Simulation(world_size={self.world_size}, mesh {mesh}{names}): {self.text}"

    # ------------------------------------------------------------------------------------------ views
    def bars(self) -> Any:
        """Each recorded rank's peak by category, side by side on one axis (:func:`fakeviz._views.compare.compare_bars`)."""
        from .._views.compare import compare_bars

        return compare_bars(self._runs())

    def explore(self, rank: int | None = None) -> Any:
        """The per-rank bars and a rank picker over each rank's explorer (:mod:`fakeviz._views.simulation`)."""
        from .._views.simulation import simulation_widget

        return simulation_widget(self._runs(), classes=self._class_index, first=rank, capacity=self.gpu.spec,
                                 table=self.classes)  # fmt: skip


# ---------------------------------------------------------------------------------------------- simulate
def simulate(
    step: Callable[[int, Any], Any],
    world_size: int,
    *,
    mesh_shape: Sequence[int] | None = None,
    mesh_dim_names: Sequence[str] | None = None,
    device: str = "cuda",
    gpu: Any = None,
    ranks: str | Sequence[int] = "all",
    gpus_per_node: int = 8,
    tokens: int | None = None,
) -> Simulation:
    """Run ``step(rank, mesh)`` once per rank under fake tensors in torch.distributed's fake process group.

    Args:
        step: the user's code for one rank: build the model, shard it (``fully_shard``) or parallelize it
            (``parallelize_module``, pipeline stages), make the optimizer, run a training step. ``mesh`` is
            the rank's ``DeviceMesh`` of ``mesh_shape``.
        world_size: the number of ranks.
        mesh_shape, mesh_dim_names: the device mesh (default: 1-D over all ranks); ``(2, 4)`` with
            ``("dp", "tp")`` is HSDP or FSDP x TP.
        device: ``"cuda"`` (fake GPUs, on any machine) or ``"cpu"``.
        gpu: each rank's GPU, a name or size (``"H100"``, ``"80GB"``); default H100.
        ranks: ``"all"``, or the ranks to record (``[0, 63]``: the others are not run).
        gpus_per_node: ranks per node; rank ``r`` runs on ``cuda:{r % gpus_per_node}``.
        tokens: the tokens one step processes over the whole job (every data-parallel replica's ``batch x seq``):
            gives ``tokens_per_s``. fakeviz does not guess it from your step's inputs (which are tokens, and how
            many replicas read different ones, is your code's to say); without it ``tokens_per_s`` is None.

    Returns:
        A :class:`Simulation`. Raises :class:`~fakeviz.SimulationError` (its ``simulation`` holds the ranks
        recorded so far and the failing rank's partial trace) when a rank's step fails.
    """
    return simulate_recipe(**locals())  # every argument as given: this signature is the one list of simulate's


_SIMULATE = inspect.signature(simulate)


def simulate_recipe(
    step: Callable[[int, Any], Any],
    world_size: int,
    *,
    rank_keys: Callable[[], dict[int, Any]] | None = None,
    remote: tuple[Callable[..., Any], dict[str, Any]] | None = None,
    executor: Any = None,
    **options: Any,
) -> Simulation:
    """:func:`simulate` for fakeviz's own recipes (:func:`fakeviz.plan` with ``parallel=``: :mod:`.parallel`,
    :mod:`.pipeline`), which know which ranks record alike. ``options``: :func:`simulate`'s (its defaults for those
    not given).

    Args:
        rank_keys: called after the first rank is recorded, rank -> a key equal for ranks known to record
            identically; with ``ranks="auto"`` one rank per key is recorded and the others stand in
            (:attr:`Simulation.stand_ins`).
        remote, executor: ``(function, description)``: with ``ranks="auto"``, the first rank of each class after
            rank 0 is recorded by ``function(description | {"sim": ...}, rank)`` on ``executor``
            (:func:`record_classes`; Note: [points on an executor] in :mod:`.executors`).
    """
    args = _SIMULATE.bind(step, world_size, **options)
    args.apply_defaults()
    mesh_shape, mesh_dim_names, device, gpu, ranks, gpus_per_node, tokens = (
        args.arguments[k] for k in ("mesh_shape", "mesh_dim_names", "device", "gpu", "ranks", "gpus_per_node", "tokens")
    )
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ArgumentError("tokens", tokens, "the tokens one step processes is a whole number of at least 1",
                            "Give the step's batch x seq over every data-parallel replica, e.g. tokens=8 * 4096.")  # fmt: skip
    dist = _distributed()
    # the job's ranks and one machine's GPUs: the limits plan's gpus= and parallel= have (Note: [GPU counts])
    check_count(world_size, lambda problem, advice: ArgumentError("world_size", world_size, problem, advice), job=True)
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int):
        raise ArgumentError("gpus_per_node", gpus_per_node, "not a whole number of GPUs", "Give e.g. gpus_per_node=8.")
    check_count(gpus_per_node, lambda problem, advice: ArgumentError("gpus_per_node", gpus_per_node, problem,
                                                                     "Give e.g. gpus_per_node=8."))  # fmt: skip
    shape = tuple(int(x) for x in (mesh_shape or (world_size,)))
    n = 1
    for x in shape:
        n *= x
    if n != world_size:
        raise ValueError(f"mesh_shape={shape} holds {n} ranks, not world_size={world_size}")
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    if names is not None and len(names) != len(shape):
        raise ValueError(f"mesh_dim_names={names}: one name per dimension of mesh_shape={shape}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device={device!r}: use 'cuda' (fake GPUs) or 'cpu'")
    auto = isinstance(ranks, str) and ranks == "auto"
    if auto and rank_keys is None:
        raise ValueError(
            "ranks='auto' needs to know which ranks are identical: only fakeviz's own recipes do "
            "(fakeviz.plan(..., parallel=...)). For your own step give ranks='all' or a list, e.g. [0, 63]."
        )
    if isinstance(ranks, str) and ranks not in ("all", "auto"):
        raise ValueError(f"ranks={ranks!r}: use 'all', or a list of ranks")
    if not isinstance(ranks, str) and (not isinstance(ranks, (list, tuple, set, frozenset, range))
                                       or any(isinstance(r, bool) or not hasattr(r, "__index__") for r in ranks)):  # fmt: skip
        raise ArgumentError("ranks", ranks, "not 'all', 'auto' or a list of ranks",
                            "Give ranks='all', or the ranks to record as a list, e.g. ranks=[0, 63].")  # fmt: skip
    todo = list(range(world_size)) if isinstance(ranks, str) else sorted({int(r) for r in ranks})
    bad = [r for r in todo if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"ranks {bad} are outside 0..{world_size - 1}")
    if (
        isinstance(gpu, (int, float))
        and not isinstance(gpu, bool)
        or (isinstance(gpu, str) and gpu.strip().replace(".", "", 1).isdigit())
    ):  # a count: the number of ranks is world_size
        raise ArgumentError("gpu", gpu, "a number is not a GPU kind",
                            "simulate(gpu=) names each rank's GPU ('H100', '80GB'); the number of ranks is world_size.")  # fmt: skip
    try:
        cap = parse_gpus(gpu if gpu is not None else "H100")
    except ArgumentError as err:
        raise ArgumentError("gpu", gpu, err.problem, err.advice.replace("gpus=", "gpu="),
                            suggestions=err.suggestions) from None  # fmt: skip
    if len(cap) != 1:
        raise ValueError(f"gpu={gpu!r}: one GPU kind per rank (e.g. 'H100'), not {len(cap)}")
    if dist.is_initialized():
        raise FakeVizError(
            "simulate: a torch.distributed process group is already initialized in this process.\n"
            "Call torch.distributed.destroy_process_group() first; simulate starts a fake group per rank."
        )
    per_node = max(1, min(gpus_per_node, world_size))
    sim = Simulation(world_size=world_size, mesh_shape=shape, mesh_dim_names=names, device=device, gpu=cap[0],
                     gpus_per_node=per_node, ranks=todo, tokens=tokens)  # fmt: skip
    seen: dict[Any, int] = {}
    for i, r in enumerate(todo):
        if auto and i == 1:
            keys = rank_keys()  # type: ignore[misc]
            seen = {keys[todo[0]]: todo[0]}
            if remote is not None:  # the other classes' first ranks are independent: on the executor
                record_classes(step, sim, todo[1:], keys, seen, executor, remote)
                break
        if seen and keys[r] in seen:
            sim.stand_ins[r] = seen[keys[r]]
            continue
        trace, exc = _run_rank(step, sim, r)
        sim.traces[r] = trace
        if auto and i > 0:
            seen[keys[r]] = r
        if exc is not None:
            sim.error = _error(exc, r, sim)
            raise sim.error from exc
    _settle(step, sim)
    return sim


FIELDS = ("world_size", "mesh_shape", "mesh_dim_names", "device", "gpu", "gpus_per_node")  # Simulation(...)'s


def record_classes(step: Callable[[int, Any], Any], sim: Simulation, rest: list[int], keys: dict[int, Any],
                   seen: dict[Any, int], executor: Any, remote: tuple[Callable[..., Any], dict[str, Any]]) -> None:  # fmt: skip
    """After rank 0: each rank of ``rest`` of a class already seen stands in; the first of each new class is recorded,
    all at once on ``executor`` (:class:`.executors.Runner`; here one after another by default)."""
    from . import executors

    firsts = []
    for r in rest:
        if keys[r] in seen:
            sim.stand_ins[r] = seen[keys[r]]
        else:
            seen[keys[r]] = r
            firsts.append(r)
    with executors.runner(remote[1].get("model"), executor) as run:
        results = run.run(firsts, local=lambda r: _run_rank(step, sim, r), remote=remote[0],
                          shared={**remote[1], "sim": {k: getattr(sim, k) for k in FIELDS}})  # fmt: skip
    for r, res in zip(firsts, results):
        trace, exc = res if isinstance(res, tuple) else (res, None)
        if isinstance(res, executors.Failed):
            trace, exc = res.trace, RuntimeError(res.error)
        if trace is not None:
            sim.traces[r] = trace
        if exc is not None:
            sim.error = _error(exc, r, sim)
            raise sim.error from exc


def run_rank(step: Callable[[int, Any], Any], sim_fields: dict[str, Any], rank: int) -> Any:
    """``rank``'s record of ``step`` in a simulation of ``sim_fields`` (:data:`FIELDS`) of its own (a worker's:
    :func:`record_classes`); a failing step raises with the partial record as the exception's ``trace``."""
    trace, exc = _run_rank(step, Simulation(**sim_fields, ranks=[rank]), rank)
    if exc is not None:
        exc.trace = trace  # type: ignore[attr-defined]
        raise exc
    return trace


def _settle(step: Callable[[int, Any], Any], sim: Simulation) -> None:
    """Record again each rank that received values other than those a rank recorded after it sent (Note: [values
    between simulated ranks]); list the values still assumed in its ``fidelity()``."""
    for _ in range(sim.world_size):
        stale = sim.mailbox.stale(set(sim.traces))
        for r in stale:
            trace, exc = _run_rank(step, sim, r)
            sim.traces[r] = trace
            if exc is not None:
                sim.error = _error(exc, r, sim)
                raise sim.error from exc
        if not stale:
            break
    for r, t in sim.traces.items():
        for why in sim.mailbox.assumptions(r, set(sim.traces)):
            t.meta.setdefault("assumptions", []).append([-1, "c10d.recv_", why, None, None])


def _distributed() -> Any:
    import torch.distributed as dist

    if not dist.is_available():
        raise FakeVizError("simulate: this torch build has no torch.distributed; install a build that has it")
    import torch.distributed.tensor  # noqa: F401 - before the recording: Note: [DTensor's shadow propagation]

    return dist


@contextlib.contextmanager
def _fake_group(rank: int, world_size: int) -> Iterator[None]:
    """torch's fake process group as ``rank`` of ``world_size``; destroyed, with DeviceMesh's stack, after."""
    import torch.distributed as dist
    from torch.distributed import device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    hook = sys.excepthook  # init_process_group wraps it to prefix "[rankN]:" to every traceback line
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        sys.excepthook = hook
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        with contextlib.suppress(Exception):
            device_mesh._mesh_resources.mesh_stack.clear()


def _run_rank(step: Callable[[int, Any], Any], sim: Simulation, rank: int) -> tuple[Any, BaseException | None]:
    from torch.distributed.device_mesh import init_device_mesh

    from .._api import record

    dev = sim.device_of(rank)
    trace = None
    exc: BaseException | None = None
    with _fake_group(rank, sim.world_size):
        rec = record(device=dev, gpu=sim.gpu.gpu, gpus=sim.gpus_per_node if sim.device == "cuda" else None)
        try:
            with rec as trace, sim.mailbox.rank(rank, trace):  # Note: [values between simulated ranks]
                if sim.device == "cuda":
                    torch.cuda.set_device(rank % sim.gpus_per_node)
                mesh = init_device_mesh(sim.device, sim.mesh_shape, mesh_dim_names=sim.mesh_dim_names)
                step(rank, mesh)
        except Exception as e:  # noqa: BLE001 - reported as a SimulationError with the partial record
            exc = e
            trace = getattr(e, "trace", None) or trace or rec.trace
    trace.meta["rank"] = rank
    trace.meta["capacity"] = sim.gpu.spec
    return trace, exc


def _error(exc: BaseException, rank: int, sim: Simulation) -> SimulationError:
    line = _user_line(exc)
    what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    msg = str(exc)
    if "monitored_barrier" in msg:
        todo = "The fake group serves barrier(); use dist.barrier() in the step, or skip it when simulating."
    elif getattr(exc, "op", None) is not None or "data-dependent" in msg.lower() or "item()" in msg:
        todo = ("The fake group moves no data between ranks: a value another rank sends (all_gather_object, a "
                "reduced loss read with .item()) does not exist here. Skip that read when simulating, e.g. "
                "behind `if not fakeviz.is_fake(tensor)`.")  # fmt: skip
    else:
        todo = (
            "Fix the step and simulate again; e.simulation holds the ranks recorded so far, e.__cause__ the full error."
        )
    where = f"{line}: " if line else ""
    text = f"rank {rank}: {where}{type(exc).__name__}: {what[:300]}\n{todo}"
    return SimulationError(text, rank=rank, user_line=line, simulation=sim)


def _user_line(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of the user's code where the step failed (:func:`user_frame`)."""
    from .._engine.export import user_frame

    f = user_frame(exc)
    return f"{f.filename}:{f.lineno}" if f is not None else None


def _signature(trace: Any) -> str:
    """What two ranks of one class share: per op, its name, output shapes, dtypes, bytes and phase."""
    ops = trace.ops
    cols = ops[["op", "phase", "shape", "dtype", "nbytes"]].astype(str)
    h = hashlib.sha1()
    h.update(pd.util.hash_pandas_object(cols, index=False).values.tobytes())
    h.update(str(trace.error is not None).encode())
    return h.hexdigest()
