"""A sweep's progress: a bar in a notebook, a line on stderr elsewhere (:func:`fakeviz.sweep`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(total: int) -> Callable[[int, Any], None]:
    """A progress bar: ipywidgets in a notebook, a line on stderr elsewhere."""
    start = time.perf_counter()
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
        import ipywidgets
        from IPython.display import display

        w = ipywidgets.IntProgress(value=0, min=0, max=total, description="sweep")
        label = ipywidgets.Label("")
        display(ipywidgets.HBox([w, label]))

        def update(i: int, p: Any) -> None:
            w.value = i
            label.value = f"{i}/{total}, {time.perf_counter() - start:.0f} s: {p.fit_text[:80]}"

        return update

    def line(i: int, p: Any) -> None:
        print(f"\rsweep {i}/{total} ({time.perf_counter() - start:.0f} s)", end="\n" if i == total else "",
              file=sys.stderr, flush=True)  # fmt: skip

    return line
