"""Mixture-of-experts routing under fake tensors: what a router whose scores are unknown is assumed to pick.

Note: [routing under fake tensors]
A mixture-of-experts router picks each token's experts with ``topk`` of its scores, which a full-size fake run does not know. The ``topk`` of unknown
values inside a router (the innermost module's class name has "Router", "Gate", "MoE"/"Moe" or "Expert")
gets assumed indices (:func:`routing_indices`): ``"balanced"`` (the default) gives token ``t`` the experts
``(t * k + j) mod E``, so every expert gets ``rows * k / E`` tokens (one more for some when it does not
divide), ``"skewed"`` gives every token the experts ``0 .. k-1``, so ``k`` experts get every token and the
rest none: the most tokens one expert can get, the worst case for that expert's buffers and, with experts
on several GPUs, for the busiest GPU; the step's peak on one device need not be higher, since the
tokens x k rows saved for backward are as many), and ``None`` assumes nothing (every read of the
routing then falls to the rules of Note: [values under fake tensors]). What follows from the indices (``one_hot``, the per-expert
``nonzero``/``where`` of transformers' eager experts, ``histc`` and ``offs`` of the grouped path) is then
computed from them like any known value, up to ``ROUTING_LIMIT`` elements (a one-hot of 128 experts is
large). Each router call is a row of ``fidelity()["assumptions"]``. On transformers' default grouped path
the record does not depend on the routing (Note: [grouped_mm under fake tensors]); on the eager path the
sizes of each expert's matmuls do.

Part 4. of Note: [values under fake tensors] (in :mod:`fakeviz._engine.values`), which calls :func:`assume`
for every ``topk``.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch

__all__ = ["ROUTINGS", "ROUTING_LIMIT", "assume", "hint", "router_name", "routing_indices"]

#: A tensor whose values follow from assumed routing keeps them up to this many elements.
ROUTING_LIMIT = 1 << 24
#: The routing assumptions ``record(routing=...)`` takes.
ROUTINGS = ("balanced", "skewed", None)


def routing_indices(rows: int, k: int, experts: int, routing: str) -> torch.Tensor:
    """The expert indices ``[rows, k]`` (int64, cpu) a router is assumed to pick (4. in the Note)."""
    if routing not in ("balanced", "skewed"):
        raise ValueError(f"routing={routing!r}: use one of {', '.join(map(repr, ROUTINGS))}")
    with no_dispatch():
        if routing == "balanced":
            r = torch.arange(rows, dtype=torch.long)[:, None] * k + torch.arange(k, dtype=torch.long)[None, :]
            return (r % experts).contiguous()
        return torch.arange(k, dtype=torch.long).expand(rows, k).contiguous()


_ROUTER = re.compile(r"router|gate|moe|expert", re.IGNORECASE)


def router_name(recorder: Any) -> str | None:
    """The class of the innermost module in forward if it looks like a mixture-of-experts router, else None."""
    name = recorder.module_class_name() if hasattr(recorder, "module_class_name") else None
    return name if name is not None and _ROUTER.search(name) else None


def routing_text(routing: str, router: str, rows: int, k: int, experts: int) -> str:
    if routing == "balanced":
        share = rows * k / experts
        even = "each" if share == int(share) else "about"
        return (f"MoE routing unknown ({router}): assumed balanced, token t takes experts (t*{k} + j) mod "
                f"{experts}: {even} {share:.6g} of {rows} tokens per expert (record(routing='skewed') for the "
                "worst case)")  # fmt: skip
    return (
        f"MoE routing unknown ({router}): assumed skewed, every token takes experts 0..{k - 1}: {k} of "
        f"{experts} experts get all {rows} tokens, the rest none (the most one expert can get)"
    )


def assume(values: Any, func: Any, args: Any, kwargs: Any, out: Any) -> Any:
    """After ``topk`` ran (``out``): in a router, with unknown scores, give its indices the assumed routing."""
    t = args[0]
    if values.routing is None or values.recorder is None or not isinstance(t, FakeTensor) or t.constant is not None:
        return out
    bound = dict(zip(("self", "k", "dim", "largest", "sorted"), args))
    bound.update(kwargs or {})
    k, dim = bound.get("k"), bound.get("dim", -1)
    if not isinstance(k, int) or t.dim() == 0 or dim not in (-1, t.dim() - 1) or t._has_symbolic_sizes_strides:
        return out
    idx = out[1]
    experts = t.shape[-1]
    if not 0 < k < experts or idx.numel() > ROUTING_LIMIT or idx.constant is not None:
        return out
    router = router_name(values.recorder)
    if router is None:
        return out
    rows = idx.numel() // k
    values.give(idx, routing_indices(rows, k, experts, values.routing).reshape(tuple(idx.shape)))
    if idx.constant is None:
        return out
    idx._fv_routed = True
    values.any_routed = True
    values.assume(func, routing_text(values.routing, router, rows, k, experts))
    return out


def hint(values: Any, exc: BaseException) -> None:
    """Tell a read of an unknown value in a router or experts module, with ``routing=None``, how to assume one."""
    if values.routing is None and values.recorder is not None and router_name(values.recorder) is not None:
        exc.fakeviz_hint = (  # type: ignore[attr-defined]
            "This reads the routing of a mixture of experts, unknown here: record(routing='balanced') or "
            "record(routing='skewed') assumes one."
        )
