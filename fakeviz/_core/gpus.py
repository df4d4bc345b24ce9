"""A catalog of GPUs by name, and capacities parsed once into one type, for "fits / does not fit" verdicts.

Capacities are the total device memory the driver reports (``nvidia-smi`` MiB,
``torch.cuda.get_device_properties(i).total_memory``), which is a little below
the marketing number (an "80GB" H100 reports 81559 MiB).

Every capacity a user gives (``gpu="H100"``, ``capacity="80GB"``, ``--gpu A100-40GB``, a number of
bytes) goes through :meth:`Capacity.parse`; a record keeps what was asked in ``meta["capacity"]``
and :func:`capacity_of` reads it back (also from ``.fvz`` files written before this type existed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import ArgumentError
from .fmt import format_bytes

__all__ = [
    "ALIASES", "CAPABILITY", "DEVICE_NAMES", "GPUS", "MAX_GPUS", "MAX_RANKS", "MULTIPROCESSORS", "PUBLISHED_GB",
    "ROCM_ARCH", "SM_LIMITS", "Capacity", "capacity_of", "check_count", "gpu_capability", "gpu_name",
    "parse_capacity", "parse_gpus", "read_gpus", "split_gpus",
]  # fmt: skip

_MIB = 2**20
GPUS: dict[str, int] = {
    "H100": 81559 * _MIB,  # H100 SXM5 80GB (the PCIe card reports the same)
    "H100 80GB": 81559 * _MIB,
    "H100 PCIe": 81559 * _MIB,
    "H100 NVL": 95830 * _MIB,
    "H200": 143771 * _MIB,
    "B200": 183359 * _MIB,
    "A100 80GB": 81251 * _MIB,
    "A100 40GB": 40536 * _MIB,
    "A100": 81251 * _MIB,
    "L40S": 46068 * _MIB,
    "L4": 23034 * _MIB,
    "A10G": 23028 * _MIB,
    "T4": 15360 * _MIB,
    "V100 32GB": 32510 * _MIB,
    "V100 16GB": 16160 * _MIB,
    "RTX 4090": 24564 * _MIB,
    "RTX 3090": 24576 * _MIB,
    "RTX 5090": 32607 * _MIB,
    "RTX A6000": 49140 * _MIB,  # ECC off, the workstation card's default (46068 MiB with ECC on, as the L40S)
    "A10": 23028 * _MIB,
    "MI300X": 196592 * _MIB,
    "MI250X": 65520 * _MIB,
}

# CUDA compute capability, for the attention backend rules (fakeviz._engine.attention); AMD GPUs have none
CAPABILITY: dict[str, tuple[int, int]] = {
    "H100": (9, 0), "H100 80GB": (9, 0), "H100 NVL": (9, 0), "H200": (9, 0), "B200": (10, 0),
    "A100 80GB": (8, 0), "A100 40GB": (8, 0), "A100": (8, 0), "L40S": (8, 9), "L4": (8, 9), "A10G": (8, 6),
    "T4": (7, 5), "V100 32GB": (7, 0), "V100 16GB": (7, 0), "RTX 4090": (8, 9), "RTX 3090": (8, 6),
    "H100 PCIe": (9, 0), "RTX 5090": (12, 0), "RTX A6000": (8, 6), "A10": (8, 6),
}  # fmt: skip

# What a fake cuda session's torch.cuda.get_device_properties answers (fakeviz._engine.cuda_api):
# the name the driver reports (torch.cuda.get_device_name, nvidia-smi / rocm-smi) ...
DEVICE_NAMES: dict[str, str] = {
    "H100": "NVIDIA H100 80GB HBM3", "H100 80GB": "NVIDIA H100 80GB HBM3", "H100 NVL": "NVIDIA H100 NVL",
    "H200": "NVIDIA H200", "B200": "NVIDIA B200", "A100 80GB": "NVIDIA A100-SXM4-80GB",
    "A100 40GB": "NVIDIA A100-SXM4-40GB", "A100": "NVIDIA A100-SXM4-80GB", "L40S": "NVIDIA L40S", "L4": "NVIDIA L4",
    "A10G": "NVIDIA A10G", "T4": "Tesla T4", "V100 32GB": "Tesla V100-SXM2-32GB", "V100 16GB": "Tesla V100-SXM2-16GB",
    "RTX 4090": "NVIDIA GeForce RTX 4090", "RTX 3090": "NVIDIA GeForce RTX 3090", "MI300X": "AMD Instinct MI300X",
    "MI250X": "AMD Instinct MI250X/MI250", "H100 PCIe": "NVIDIA H100 PCIe", "RTX 5090": "NVIDIA GeForce RTX 5090",
    "RTX A6000": "NVIDIA RTX A6000", "A10": "NVIDIA A10",
}  # fmt: skip
# ... streaming multiprocessors (NVIDIA) or compute units (AMD; an MI250X is two devices of 110 CUs each) ...
MULTIPROCESSORS: dict[str, int] = {
    "H100": 132, "H100 80GB": 132, "H100 NVL": 132, "H200": 132, "B200": 148, "A100 80GB": 108, "A100 40GB": 108,
    "A100": 108, "L40S": 142, "L4": 58, "A10G": 80, "T4": 40, "V100 32GB": 80, "V100 16GB": 80, "RTX 4090": 128,
    "RTX 3090": 82, "MI300X": 304, "MI250X": 110, "H100 PCIe": 114, "RTX 5090": 170, "RTX A6000": 84, "A10": 72,
}  # fmt: skip
# ... the gfx architecture and the (major, minor) ROCm builds of torch report for AMD GPUs ...
ROCM_ARCH: dict[str, tuple[str, tuple[int, int]]] = {"MI300X": ("gfx942", (9, 4)), "MI250X": ("gfx90a", (9, 0))}
# ... and the per-SM limits of each CUDA compute capability (CUDA C++ Programming Guide, "Technical Specifications
# per Compute Capability"): (max threads per SM, shared memory per SM, shared memory per block opt-in), in bytes.
SM_LIMITS: dict[tuple[int, int], tuple[int, int, int]] = {
    (7, 0): (2048, 98304, 98304), (7, 5): (1024, 65536, 65536), (8, 0): (2048, 167936, 166912),
    (8, 6): (1536, 102400, 101376), (8, 9): (1536, 102400, 101376), (9, 0): (2048, 233472, 232448),
    (10, 0): (2048, 233472, 232448), (12, 0): (1536, 102400, 101376),
}  # fmt: skip
# ... and the memory each vendor's datasheet states, in GB as printed. The figure is the physical memory in binary
# gigabytes (a "24GB" RTX 4090 has 24 GiB of GDDR6X); the driver reports a little less (what :data:`GPUS` holds:
# the H100's 80 GiB less 361 MiB), and ECC, on by default on data-centre GDDR cards (T4, L4, L40S, A10, A10G),
# takes a sixteenth of it: a T4's 16 GB shows as 15360 MiB. Sources: each vendor's datasheet (NVIDIA H100, H200,
# HGX B200 (1440 GB for 8), A100, L40S, L4, A10, T4, V100, RTX A6000; the GeForce product pages; AWS for the A10G;
# AMD MI300X, MI250X (128 GB per package of two GCDs: one GCD, one torch device, is 64)).
PUBLISHED_GB: dict[str, int] = {
    "H100": 80, "H100 80GB": 80, "H100 PCIe": 80, "H100 NVL": 94, "H200": 141, "B200": 180, "A100 80GB": 80,
    "A100 40GB": 40, "A100": 80, "L40S": 48, "L4": 24, "A10G": 24, "A10": 24, "T4": 16, "V100 32GB": 32,
    "V100 16GB": 16, "RTX 4090": 24, "RTX 3090": 24, "RTX 5090": 32, "RTX A6000": 48, "MI300X": 192, "MI250X": 64,
}  # fmt: skip
# Names users type for a catalog GPU besides its own (spaces, dashes, underscores and case never matter, and the
# name the driver reports, DEVICE_NAMES, is accepted with or without its "NVIDIA " / "NVIDIA GeForce " prefix).
ALIASES: dict[str, str] = {
    "4090": "RTX 4090", "3090": "RTX 3090", "5090": "RTX 5090", "A6000": "RTX A6000", "H100 SXM": "H100",
    "H100 SXM5": "H100", "A100 SXM": "A100", "A100 PCIe": "A100 80GB", "Tesla T4": "T4", "Tesla V100": "V100 32GB",
}  # fmt: skip
assert set(DEVICE_NAMES) == set(MULTIPROCESSORS) == set(GPUS) == set(PUBLISHED_GB), "one entry per catalog GPU"
assert {CAPABILITY[g] for g in CAPABILITY} <= set(SM_LIMITS), "SM limits for every capability in the catalog"

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # fmt: skip


def _key(name: str) -> str:
    """``"rtx-4090"``, ``"RTX4090"``, ``" rtx_4090 "`` -> ``"RTX4090"``: case, spaces, dashes, underscores dropped."""
    return re.sub(r"[\s_\-]+", "", name.strip().upper())


def _names() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in GPUS:
        out.setdefault(_key(name), name)
    for alias, name in ALIASES.items():
        out.setdefault(_key(alias), name)
    for name, device in DEVICE_NAMES.items():  # "NVIDIA H100 80GB HBM3" names "H100", the first with that name
        for text in (device, device.removeprefix("NVIDIA "), device.removeprefix("NVIDIA GeForce ")):
            out.setdefault(_key(text), name)
    return out


_BY_KEY = _names()
assert all(name in GPUS for name in _BY_KEY.values())


def gpu_name(text: str) -> str | None:
    """The catalog name a user's text names (``"4090"``, ``"rtx4090"``, ``"NVIDIA GeForce RTX 4090"`` ->
    ``"RTX 4090"``), or None: not a catalog GPU."""
    return _BY_KEY.get(_key(str(text)))


@dataclass(frozen=True)
class Capacity:
    """One device's memory: ``bytes``, the catalog ``gpu`` name when one was given, and the ``spec`` as written."""

    bytes: int
    gpu: str | None = None
    spec: str | int | float | None = None

    @classmethod
    def parse(cls, value: str | int | float | Capacity) -> Capacity:
        """From a GPU name ("H100", "a100-40gb"), a size ("80GB", "80 GiB", "24e9") or bytes (8e10)."""
        if isinstance(value, Capacity):
            return value
        if isinstance(value, bool):
            raise ValueError(f"unknown GPU or capacity {value!r}")
        if isinstance(value, (int, float)):
            if value <= 0:
                raise ValueError(f"capacity must be positive, got {value}")
            return cls(_bounded(value, value), None, value)
        text = str(value).strip()
        name = gpu_name(text)
        if name is not None:
            return cls(GPUS[name], name, value)
        m = re.fullmatch(r"(-?[0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)", text)
        if m and m.group(2).upper() in _UNITS:
            n = float(m.group(1)) * _UNITS[m.group(2).upper()]
            if n <= 0:
                raise ValueError(f"capacity must be positive, got {value!r}")
            return cls(_bounded(n, value), None, value)
        raise ValueError(
            f"unknown GPU or capacity {value!r}; use a size like '80GB' / '80GiB' or one of: {', '.join(GPUS)}"
        )

    @property
    def label(self) -> str:
        """``"H100 (79.6 GiB)"`` for a GPU name, else the size: ``"80.0 GiB"``."""
        return f"{self.gpu} ({format_bytes(self.bytes)})" if self.gpu else format_bytes(self.bytes)

    @property
    def capability(self) -> tuple[int, int] | None:
        """The CUDA compute capability of the named GPU (None: no name, or not an NVIDIA GPU)."""
        return CAPABILITY.get(self.gpu) if self.gpu else None


def _bounded(n: float, value: Any) -> int:
    if not n <= MAX_JOB_BYTES:  # NaN too
        raise ValueError(f"capacity {value!r} is more than the {MAX_JOB_BYTES / 1e15:.1f} PB of the largest job "
                         f"fakeviz plans ({MAX_RANKS:,} GPUs of {max(PUBLISHED_GB.values())} GB)")
    return int(n)


def parse_capacity(value: str | int | float | Capacity) -> int:
    """Bytes from a GPU name ("H100", "a100-40gb") or a size ("80GB", "80 GiB", "24e9", 8e10)."""
    return Capacity.parse(value).bytes


def capacity_of(meta: dict[str, Any], override: Any = None) -> Capacity | None:
    """The capacity ``override`` names, else the one a record was made with (``meta["capacity"]``), else None."""
    spec = override if override is not None else meta.get("capacity")
    if spec is None or spec == "":
        return None
    return Capacity.parse(spec)


def gpu_capability(name: str) -> tuple[int, int] | None:
    """The compute capability of a GPU named in the catalog (None: not an NVIDIA GPU or not a name)."""
    gpu = gpu_name(str(name))
    return CAPABILITY.get(gpu) if gpu else None


# Note: [GPU counts]
# Two limits, each defined here once and read by every entry point. A *machine* has at most MAX_GPUS GPUs: the fake
# cuda devices are cuda:0 .. cuda:63, and a record, a device map and the command line's run use one device per GPU.
# A *job* (``plan(parallel=...)``, ``simulate(step, world_size)``, ``gpus=`` given with ``parallel=``) has at most
# MAX_RANKS ranks: rank r runs on cuda:{r % gpus_per_node}, so a job of many machines needs no more devices than
# one machine has. ``gpus="128xH100", parallel={"dp_shard": 128}`` and ``gpus="H100", parallel={"dp_shard": 128}``
# are the same job and both work; ``gpus="128xH100"`` without ``parallel=`` is a device map over 128 devices and
# is refused with the way to write it as a job.

#: The most GPUs of one fake machine (fake cuda devices are cuda:0 .. cuda:63).
MAX_GPUS = 64
#: The most ranks of a parallel job (Note: [GPU counts]).
MAX_RANKS = 65536
#: The memory of the largest job fakeviz plans: MAX_RANKS of the catalog's largest GPU (Note: [size limits] in
#: fakeviz._core.limits); no capacity a user gives is larger.
MAX_JOB_BYTES = MAX_RANKS * max(PUBLISHED_GB.values()) * 10**9

_GIVE = "Give a GPU count with its kind ('8xH100', '2x80GB'), a GPU or size ('H100', '80GB'), or a list (['80GB', '40GiB'])."


def read_gpus(spec: Any, *, written: str | None = None, job: bool = False) -> tuple[int, list[Capacity] | None]:
    """The one reading of ``gpus=`` (and ``--gpus``): how many GPUs, and each one's :class:`Capacity` when named.

    An integer (or a string of digits) is a GPU **count**, never bytes: ``8`` and ``"8"`` -> ``(8, None)``;
    ``"8xH100"`` -> ``(8, [H100] * 8)``; ``"H100"`` / ``"80GB"`` / a :class:`Capacity` -> one GPU; a list of
    names, sizes and such specs -> their GPUs in device order. ``written`` is how the caller wrote the argument,
    for the error (default ``gpus=<value>``). ``job``: the GPUs of a parallel job, up to :data:`MAX_RANKS`; else of
    one machine, up to :data:`MAX_GPUS` (Note: [GPU counts]).

    Raises:
        ArgumentError: (a ``ValueError``) not a count or a GPU, a count outside 1..64 (1..65,536 for a job), a
            fraction, an unknown GPU or size, an empty list, or a count without a kind inside a list.
    """

    def refuse(problem: str, advice: str = _GIVE) -> ArgumentError:
        return ArgumentError("gpus", spec, problem, advice, written=written)

    if isinstance(spec, Capacity):
        return 1, [spec]
    if isinstance(spec, bool) or spec is None:
        raise refuse("not a GPU count or a GPU")
    if isinstance(spec, int):
        return check_count(spec, refuse, job=job), None
    if isinstance(spec, float):
        raise refuse(
            "a number of GPUs is a whole number (and gpus= never takes bytes)",
            "Give a count (gpus=8, or '8xH100' with the kind), or a size with its unit ('80GB').",
        )
    if isinstance(spec, (list, tuple)):
        out: list[Capacity] = []
        for item in spec:
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                raise refuse(
                    f"{item!r} in the list: each item is a GPU or a size ('H100', '80GB'), or a count with its kind",
                    "Write ['2xH100', 'A100 40GB'] or ['80GB', '40GiB'].",
                )
            n, caps = read_gpus(item, written=written or f"gpus={spec!r}", job=job)
            if caps is None:
                raise refuse(f"{item!r} in the list is a count without a kind", f"Write '{n}xH100'.")
            out.extend(caps)
        if not out:
            raise refuse("an empty list names no GPU")
        check_count(len(out), refuse, job=job)
        return len(out), out
    if not isinstance(spec, str):
        raise refuse(f"a {type(spec).__name__} is not a GPU count or a GPU")
    text = spec.strip()
    if text.isdigit() and gpu_name(text) is None:  # "8" is a count; "4090" is the RTX 4090
        return check_count(int(text), refuse, job=job), None
    m = re.fullmatch(r"(-?[0-9]+)\s*[xX*]\s*(\S.*)", text)
    n, what = (int(m.group(1)), m.group(2).strip()) if m else (1, text)
    check_count(n, refuse, job=job, kind=what)
    if gpu_name(what) is None and re.fullmatch(r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?", what):  # never bytes
        raise refuse(f"{what!r} is neither a whole count nor a size with its unit", _GIVE)
    if what.startswith("-"):
        raise refuse(f"{what!r} is below zero", _GIVE)
    try:
        cap = Capacity.parse(what)
    except ValueError as exc:
        raise refuse(str(exc).split("; ")[0], _GIVE + f" The catalog's GPUs: {', '.join(GPUS)}.") from None
    return n, [cap] * n


def check_count(n: int, refuse: Any, *, job: bool = False, kind: str = "H100") -> int:
    """``n`` GPUs within the limit (Note: [GPU counts]): of one machine (1..:data:`MAX_GPUS`), or with ``job`` of a
    parallel job (1..:data:`MAX_RANKS`); ``refuse(problem, advice)`` makes the error."""
    if job and not 1 <= n <= MAX_RANKS:
        raise refuse(f"{n} GPUs; a parallel job has between 1 and {MAX_RANKS:,} ranks", "Give e.g. 512.")
    if not job and not 1 <= n <= MAX_GPUS:
        name = gpu_name(str(n))  # gpus=4090 as a number: a count; the GPU is the string
        advice = f"For one {name}, write '{n}' as a string (or '1x{n}')." if name else "Give e.g. '8xH100'."
        if MAX_GPUS < n <= MAX_RANKS and not name:  # a job of several machines: the GPUs as a parallel plan's ranks
            advice = (
                f"For a job of {n} GPUs, give the parallel layout with them: gpus='{n}x{kind}', "
                f"parallel={{'dp_shard': {n}}} (or gpus='{kind}', the degrees multiplying to {n})."
            )
        raise refuse(f"{n} GPUs; a fake machine has between 1 and {MAX_GPUS} GPUs", advice)
    return n


def split_gpus(text: str, *, written: str | None = None) -> tuple[int, str]:
    """``"8xH100"`` -> ``(8, "H100")``; ``"H100"`` -> ``(1, "H100")``; ``"2x80GB"`` -> ``(2, "80GB")``: the
    command line's ``--gpus``, read by :func:`read_gpus` (one GPU kind; a count alone is refused: of what?).

    Raises:
        ArgumentError: as :func:`read_gpus`, and a count without a kind (``"8"``).
    """
    n, caps = read_gpus(str(text), written=written)
    if caps is None:
        raise ArgumentError("gpus", text, f"{n} GPUs of which kind?", f"Write {n}xH100 (or {n}x80GB).",
                            written=written)  # fmt: skip
    spec = caps[0].spec
    return n, str(spec).strip()


def parse_gpus(spec: Any, *, written: str | None = None, job: bool = False) -> list[Capacity]:
    """One :class:`Capacity` per GPU of a machine: ``"4xH100"``, ``"H100"``, ``"2x80GB"``, or a list of names,
    sizes and such specs (``["80GB", "40GiB"]``, ``["2xH100", "A100 40GB"]``), in device order (:func:`read_gpus`).

    A count alone (``gpus=8``) says how many GPUs but not their memory, which a plan needs: refused with the
    spec to write instead (``"8xH100"``).

    Raises:
        ArgumentError: (a ``ValueError``) as :func:`read_gpus`, and a count without a kind.
    """
    n, caps = read_gpus(spec, written=written, job=job)
    if caps is None:
        raise ArgumentError(
            "gpus", spec, f"{n} GPUs of which kind? A plan needs each GPU's memory",
            f"Write gpus='{n}xH100' (or '{n}x80GB', or a list of GPUs and sizes).", written=written,
        )  # fmt: skip
    return caps
