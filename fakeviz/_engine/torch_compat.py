"""What fakeviz reads of torch that some torch version lacks: each name looked up once, here, behind a guard.

Note: [torch versions]
fakeviz supports torch >= ``MIN_TORCH`` (``pyproject.toml``; docs/torch_versions.md says what
was run on which). 2.10, 2.11 and 2.12 import and record (the demo runs on fake cpu), but their records differ
from a real run's in ways the engine does not yet handle (docs/torch_versions.md's table), so they are below the minimum.
Torch adds aten ops, ``torch._C`` functions and private helpers in most releases, so no module of fakeviz reads
such a name itself, at import or later: it asks this module, which looks the name up once and, where this torch
lacks it, says what that means (``GUARDS``) instead of raising:

* ``op_or_none("_use_miopen_ctc_loss.Tensor")``: the aten op (packet, or ``"name.overload"``), or ``None``.
  An op this torch lacks is never dispatched, so its fake rule is simply not installed (``ctc.py``,
  ``moe.py``);
* ``fa3_sdp_enabled()``, ``overrideable_sdp_enabled()``, ``sdp_priority_order()``: the SDPA flags and order
  the kernel choice reads (``attention/``), answered as a torch without that switch behaves;
* ``require(name)``: a feature that cannot work without the name raises :class:`TorchVersionError` (a
  ``FakeVizError``) naming the torch it needs (``plan(parallel=...)``'s ``fully_shard``); ``lookup(name)``
  the same name or ``None`` where a feature has a fallback (identical-rank detection: every rank recorded).

One difference is of behaviour, not of a name: torch < 2.12's SDPA FLOP formulas assert that the key has the
query's heads, so grouped-query attention got no FLOPs; ``flops.formulas.sdpa_heads_broadcast`` counts it as
2.12's formulas do, on every torch.

``missing()`` lists what this torch lacks, each with its statement; ``tests/engine/test_torch_compat.py``
checks every guarded name. ``since`` is the oldest torch known to have the name: 2.11 ones were found by
running 2.10 and 2.11, 2.8 and 2.6 are the releases that added ``_grouped_mm`` and the public FSDP2 (2.5.1 has
neither), 2.5 the overrideable SDPA flag (2.5.1 has it); ``_get_sdp_priority_order`` and
``_compute_local_shape_and_global_offset`` are absent in 2.5.1 and present in every version run (2.10-2.14).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._core.errors import FakeVizError, FakeVizWarning

__all__ = [
    "GUARDS",
    "MIN_TORCH",
    "TORCH_VERSION",
    "Guard",
    "TorchInternalsWarning",
    "TorchVersionError",
    "fa3_sdp_enabled",
    "lookup",
    "missing",
    "op_or_none",
    "overrideable_sdp_enabled",
    "pipeline_shapes_over_fake_group",
    "require",
    "sac_keeps_out_of_hooks",
    "sdp_priority_order",
    "statement",
]

#: The oldest torch fakeviz supports (``pyproject.toml``'s ``torch>=``; docs/torch_versions.md says why).
MIN_TORCH: tuple[int, int] = (2, 13)


def _version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.12.0+cu130"`` -> ``(2, 12)``)."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


#: ``(major, minor)`` of the installed torch.
TORCH_VERSION: tuple[int, int] = _version(torch.__version__)


class TorchVersionError(FakeVizError):
    """A fakeviz feature needs something the installed torch does not have (a newer torch)."""


class TorchInternalsWarning(FakeVizWarning):
    """The installed torch changed a FakeTensorMode internal fakeviz overrides or calls, and fakeviz takes torch's
    own path there: slower, and less exact where the warning says so (Note: [private torch signatures]; Note: [the
    C core's torch contract]). Said once per process."""


@dataclass(frozen=True)
class Guard:
    """One version-dependent torch name: what fakeviz uses it for and what happens without it."""

    name: str  #: ``"aten.<op>"`` or a dotted ``torch.`` path
    since: str  #: the oldest torch known to have it
    used_for: str  #: what fakeviz does with it
    without: str  #: what happens on a torch that lacks it


GUARDS: dict[str, Guard] = {
    g.name: g
    for g in (
        Guard("aten._use_miopen_ctc_loss", "2.11", "CTC loss: the fake rule of the 'may MIOpen run?' op that "
              "ctc_loss on a CUDA tensor asks", "no rule installed: this torch's ctc_loss never asks it"),
        Guard("aten._grouped_mm", "2.8", "mixture of experts: the fake rule of _grouped_mm (F.grouped_mm)",
              "no rule installed: this torch has no grouped matmul, so MoE experts run their other ops"),
        Guard("torch._C._get_fa3_sdp_enabled", "2.11", "SDPA kernel choice: the FlashAttention-3 switch",
              "read as off: this torch has no FlashAttention-3 switch"),
        Guard("torch._C._get_overrideable_sdp_enabled", "2.5", "SDPA kernel choice: the overrideable backend's "
              "switch", "read as off: this torch has no overrideable SDPA backend"),
        Guard("torch._C._get_sdp_priority_order", "2.10", "SDPA kernel choice: the order sdpa_kernel(..., "
              "set_priority=True) sets", "the build's default order (flash, efficient, math, cudnn) is assumed"),
        Guard("torch.distributed.fsdp.fully_shard", "2.6", "plan(parallel=...) with dp_shard / dp_replicate "
              "(FSDP2)", "unavailable: such a plan raises TorchVersionError"),
        Guard("torch.distributed.tensor._utils._compute_local_shape_and_global_offset", "2.10",
              "plan(parallel=...): finding the ranks whose records are identical",
              "every rank is recorded (as with ranks='all')"),
    )
}  # fmt: skip

_FOUND: dict[str, Any] = {}
_ABSENT: dict[str, str] = {}  # name -> why the lookup failed


def _resolve(name: str) -> Any:
    """The object ``name`` (``"aten.x[.overload]"`` or ``"torch.a.b"``) names; raises if this torch lacks it."""
    if name.startswith("aten."):
        obj: Any = torch.ops.aten
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
        return obj
    parts = name.split(".")
    if parts[0] != "torch":
        raise ValueError(f"{name!r}: not a torch name")
    obj = torch
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:  # a submodule not imported yet
            obj = importlib.import_module(".".join(parts[: i + 1]))
    return obj


def lookup(name: str) -> Any | None:
    """The torch object ``name`` names (looked up on the first call only), or ``None`` where this torch lacks it.

    ``name`` is ``"aten.<op>"`` / ``"aten.<op>.<overload>"`` or a dotted path from ``torch``
    (``"torch._C._get_fa3_sdp_enabled"``, ``"torch.distributed.fsdp.fully_shard"``).
    """
    if name in _FOUND:
        return _FOUND[name]
    if name in _ABSENT:
        return None
    try:
        obj = _resolve(name)
    except (AttributeError, ImportError, RuntimeError) as e:
        _ABSENT[name] = f"{type(e).__name__}: {e}"
        return None
    _FOUND[name] = obj
    return obj


def op_or_none(name: str) -> Any | None:
    """``torch.ops.aten.<name>`` (``"_grouped_mm"`` the packet, ``"_grouped_mm.default"`` the overload), or ``None``."""
    return lookup(name if name.startswith("aten.") else f"aten.{name}")


def _guard_of(name: str) -> Guard | None:
    """The guard of ``name``, or of the op packet whose overload ``name`` is."""
    if name in GUARDS:
        return GUARDS[name]
    if name.startswith("aten.") and name.count(".") == 2:
        return GUARDS.get(name.rsplit(".", 1)[0])
    return None


def statement(name: str) -> str:
    """What this torch's lack of ``name`` means, in one sentence (for :func:`missing` and errors)."""
    here = f"torch {torch.__version__}"
    guard = _guard_of(name)
    if guard is None:
        return f"{name} is not in {here}"
    return f"{name} is not in {here} (torch >= {guard.since} has it). {guard.used_for}: {guard.without}."


def require(name: str, feature: str | None = None) -> Any:
    """The torch object ``name`` names, or :class:`TorchVersionError` saying which torch ``feature`` needs."""
    obj = lookup(name)
    if obj is not None:
        return obj
    guard = _guard_of(name)
    what = feature or (guard.used_for if guard else name)
    needs = f"torch >= {guard.since}" if guard else "a newer torch"
    raise TorchVersionError(
        f"{what} needs {needs} ({name}); this is torch {torch.__version__}. "
        f"fakeviz supports torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}."
    )


def missing() -> dict[str, str]:
    """Every guarded name (and any other name looked up here) this torch lacks -> what that means."""
    for name in GUARDS:
        lookup(name)
    return {name: statement(name) for name in sorted(_ABSENT)}


# ------------------------------------------------------------------ SDPA flags and order (attention/)
_FA3: Callable[[], bool] | None = lookup("torch._C._get_fa3_sdp_enabled")
_OVERRIDEABLE: Callable[[], bool] | None = lookup("torch._C._get_overrideable_sdp_enabled")
_PRIORITY: Callable[[], Any] | None = lookup("torch._C._get_sdp_priority_order")


def fa3_sdp_enabled() -> bool:
    """``torch._C._get_fa3_sdp_enabled()``; False on a torch without the FlashAttention-3 switch."""
    return bool(_FA3()) if _FA3 is not None else False


def overrideable_sdp_enabled() -> bool:
    """``torch._C._get_overrideable_sdp_enabled()``; False on a torch without the overrideable backend."""
    return bool(_OVERRIDEABLE()) if _OVERRIDEABLE is not None else False


def sdp_priority_order() -> tuple[int, ...] | None:
    """``torch._C._get_sdp_priority_order()`` (``at::SDPBackend`` values); None on a torch that has no settable
    order (the caller assumes the build's default)."""
    return tuple(int(b) for b in _PRIORITY()) if _PRIORITY is not None else None


def pipeline_shapes_over_fake_group() -> bool:
    """Whether ``PipelineStage`` agrees its shapes over a fake process group as over a real one (the warm-up vote,
    then dynamic shape inference when a stage was given none): torch 2.13 does; torch >= 2.14 decides locally
    under a ``"fake"`` backend (``_PipelineSchedule._warmup_p2p``: no vote sent, STATIC, a stage without complete
    shapes refused), so a pipeline plan gives each stage its shapes there (Note: [pipeline plans])."""
    return TORCH_VERSION < (2, 14)


def sac_keeps_out_of_hooks() -> dict[str, bool]:
    """``torch.utils.checkpoint.checkpoint``'s keyword that keeps what selective checkpointing saves out of the
    saved-tensor hooks around it, as torch has always done by default (Note: [selective checkpointing in a record]):
    ``{"respect_saved_tensors_hooks": False}`` on a torch with that switch (2.14: without it, such a checkpoint warns
    that the default will change whenever hooks are active, as a recording's always are), ``{}`` on one without."""
    import inspect

    from torch.utils.checkpoint import checkpoint

    params = inspect.signature(checkpoint).parameters
    return {"respect_saved_tensors_hooks": False} if "respect_saved_tensors_hooks" in params else {}
