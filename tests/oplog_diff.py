"""Where two op logs (or any two sequences) first differ, and the lines around it as a unified diff.

Shared by the fake-equals-real tests (``tests/engine/test_fake_equals_real.py``, ``test_real_models.py``).
"""

from __future__ import annotations

import difflib
from typing import Any

__all__ = ["first_diff", "window_diff"]


def first_diff(a: list[Any], b: list[Any]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def window_diff(a: list[str], b: list[str], i: int, before: int = 4, after: int = 8) -> str:
    """The real (``a``) and fake (``b``) op-log lines around op ``i`` as a unified diff."""
    lo = max(0, i - before)
    diff = "\n".join(
        difflib.unified_diff(
            a[lo : i + after], b[lo : i + after], f"real (ops {lo}..)", f"fake (ops {lo}..)", lineterm="", n=before
        )
    )
    if diff:
        return diff
    return f"(op log lines {lo}..{i + after - 1} are the same in both runs)\n" + "\n".join(
        f"  {lo + k}: {line}" for k, line in enumerate(a[lo : i + after])
    )
