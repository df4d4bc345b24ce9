"""Which configuration to take: the plans of a :func:`~fakeviz.sweep` or :func:`~fakeviz.compare` that fit,
fastest first (issue 32), by their estimated step time (:class:`.steps.Speed`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .._core.errors import ArgumentError
from .._views.compare import Comparison, compare_table
from .._views.text import speed_text
from .steps import Speed

__all__ = ["Ranked", "check_rank_by", "ranked_count", "ranking"]

_RANK_BY = {"step_s": False, "tokens_per_s": True, "mfu": True}  # figure -> higher is better


def check_rank_by(rank_by: Any) -> None:
    if rank_by is not None and rank_by != "auto" and rank_by not in _RANK_BY:
        raise ArgumentError("rank_by", rank_by, "not a figure to rank configurations by",
                            "Give 'auto' (step time where a GPU kind is known), 'step_s', 'tokens_per_s', 'mfu', "
                            "or None to keep the order.")  # fmt: skip


def ranking(speeds: list[Speed | None], fits: list[bool], rank_by: str | None) -> tuple[list[int], str | None]:
    """(the points in ranked order, the figure ranked by; None: the order kept): the points that fit with the
    figure, best first (ties in their order), then the others in their order."""
    check_rank_by(rank_by)
    n = len(speeds)
    if rank_by is None or not n:
        return list(range(n)), None
    missing = [sp for sp in speeds if sp is None or sp.step_s is None]
    if rank_by == "auto":
        if missing:
            return list(range(n)), None
        toks = {sp.tokens for sp in speeds}  # type: ignore[union-attr]
        rank_by = "step_s" if len(toks) == 1 or None in toks else "tokens_per_s"
    elif missing:
        why = next((sp.note for sp in missing if sp is not None and sp.note), "it is not a plan")
        raise ArgumentError("rank_by", rank_by, f"a configuration has no step time ({why})",
                            "Name the GPU kind (gpus='8xH100'), or give rank_by=None.")  # fmt: skip
    values = [getattr(sp, rank_by) for sp in speeds]
    sign = -1.0 if _RANK_BY[rank_by] else 1.0
    ranked = sorted((i for i in range(n) if fits[i] and values[i] is not None), key=lambda i: sign * values[i])
    chosen = set(ranked)
    return ranked + [i for i in range(n) if i not in chosen], rank_by


def ranked_count(items: list[Any], order: list[int], by: str) -> int:
    """How many of ``order`` (from :func:`ranking`) are ranked: they fit and have the figure."""
    return sum(1 for i in order if items[i].fits and getattr(items[i].speed, by) is not None)


class Ranked(Comparison):
    """A :class:`~fakeviz._views.compare.Comparison` of runs in ranked order, with the ranking as a table."""

    def __init__(self, items: list[Any], labels: list[str] | None = None, rank_by: str | None = None) -> None:
        super().__init__(items, labels=labels)
        self.rank_by = rank_by

    @property
    def ranking(self) -> pd.DataFrame:
        """One row per run, in the comparison's order: run, fits, step_s, tokens_per_s, mfu (NaN: no estimate),
        rank (1 the best of those that fit; NA: not ranked)."""
        names = []
        for i, item in enumerate(self.items):  # each run's label as the comparison's table writes it
            plan = hasattr(item, "settings") and hasattr(item, "capacities")
            runs = compare_table([item]).run if plan and not self.labels else []
            names.append(self.labels[i] if self.labels else str(runs.iat[0]) if len(runs) else f"run {i + 1}")
        rows = []
        k = 0
        for i, item in enumerate(self.items):
            sp = getattr(item, "speed", None) if hasattr(item, "fits") else None
            fits = bool(getattr(item, "fits", False))
            vals = {f: (getattr(sp, f) if sp is not None else None) for f in ("step_s", "tokens_per_s", "mfu")}
            ranked = self.rank_by is not None and fits and vals[self.rank_by] is not None
            k += ranked
            rows.append({"run": names[i], "fits": fits,
                         **{f: float(v) if v is not None else float("nan") for f, v in vals.items()},
                         "rank": k if ranked else pd.NA})  # fmt: skip
        df = pd.DataFrame(rows, columns=["run", "fits", "step_s", "tokens_per_s", "mfu", "rank"])
        df["rank"] = df["rank"].astype("Int64")
        return df

    def __repr__(self) -> str:
        lines = [super().__repr__()]
        if self.rank_by is not None:
            lines.append(f"ranked by {self.rank_by} (those that fit, best first):")
            for r, item in zip(self.ranking.itertuples(index=False), self.items):
                sp = item.speed
                head = f"  {r.rank}." if r.rank is not pd.NA else "   -"
                fit = "" if r.fits else "does not fit; "
                lines.append(f"{head} {r.run}: {fit}"
                             + speed_text(sp.step_s, sp.tokens_per_s, sp.mfu, gpus=sp.gpus, gpu=sp.gpu, note=sp.note))  # fmt: skip
        return "\n".join(lines)
