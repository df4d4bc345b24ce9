"""Cells as IPython names them (``Cell In[3], line 2``), and the progress line of a long ``%%fake`` cell.

The recorder writes user lines as ``file:line in function``, where the file of a notebook cell is what
the shell compiled it as (``<ipython-input-3-…>`` in IPython, ``/tmp/ipykernel_…/….py`` in ipykernel).
IPython keeps which cell each such file is (``shell.compile._filename_map``); :class:`CellNames` turns
those lines into the names IPython's own tracebacks use.

A cell magic's body is compiled by a second ``run_cell``, which numbers it with ``shell.execution_count``:
the prompt's number on IPython 8, one more on IPython 9 (it counts a cell before running it), so the body
would be named after the next cell. :func:`cell_number` reads the number the running cell has and
:class:`CompiledAs` compiles the body under it, on both.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..._core.fmt import html_text
from ..._core.record import Record

__all__ = ["CellNames", "CompiledAs", "Progress", "cell_number"]

# meta lists of rows holding user lines (as text) somewhere in the row
_META_ROWS = ("assumptions",)


class CellNames:
    """``file:12 in <module>`` -> ``Cell In[3], line 12`` (``… line 12 in f`` inside a function) for every
    file the shell compiled a cell as; other text is left as it is."""

    def __init__(self, shell: Any) -> None:
        comp = getattr(shell, "compile", None)
        self.files: dict[str, int] = dict(getattr(comp, "_filename_map", None) or {})
        names = sorted(self.files, key=len, reverse=True)
        alt = "|".join(re.escape(n) for n in names)
        self._line = re.compile(rf"(?P<f>{alt}):(?P<l>\d+)(?: in (?P<fn>[\w.<>]+))?") if names else None
        self._file = re.compile(rf"File \"(?P<f>{alt})\", line (?P<l>\d+)") if names else None
        self._bare = re.compile(rf"(?P<f>{alt})") if names else None

    def label(self, filename: str) -> str | None:
        """``Cell In[3]`` for a cell's file, else None."""
        n = self.files.get(filename)
        return f"Cell In[{n}]" if n is not None else None

    def _sub_line(self, m: re.Match[str]) -> str:
        fn = m.group("fn")
        tail = f" in {fn}" if fn and fn != "<module>" else ""
        return f"Cell In[{self.files[m.group('f')]}], line {m.group('l')}{tail}"

    def __call__(self, text: str) -> str:
        if self._line is None or not isinstance(text, str):
            return text
        text = self._file.sub(lambda m: f"Cell In[{self.files[m.group('f')]}], line {m.group('l')}", text)
        text = self._line.sub(self._sub_line, text)
        return self._bare.sub(lambda m: f"Cell In[{self.files[m.group('f')]}]", text)

    def rename(self, rec: Record) -> None:
        """Name cells in a finished record's user lines, its error and its listed assumptions."""
        if self._line is None:
            return
        lines = rec.strings("lines")  # the record's own table (a finished record is not rebuilt)
        lines[:] = [self(x) for x in lines]
        if rec.error:
            rec.error = {k: self(v) if isinstance(v, str) else v for k, v in rec.error.items()}
        for key in _META_ROWS:
            rows = rec.meta.get(key)
            if isinstance(rows, list):
                rec.meta[key] = [[self(x) if isinstance(x, str) else x for x in row] for row in rows]
        rec.clear_memo()


def cell_number(shell: Any) -> int:
    """The number IPython gave the cell running now (its prompt ``[N]``), on IPython 8 and 9.

    The shell hands the running cell's result to its display hook; its ``execution_count`` is the number
    the cell was compiled with. Outside a cell (a magic called from a script) it is the shell's count.
    """
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(running, "execution_count", None)
    return int(number if number is not None else shell.execution_count)


class CompiledAs:
    """While a cell magic runs its body (``shell.run_cell``), the body is compiled as the cell ``number``:
    its file is that cell's in IPython's ``compile._filename_map``, so IPython's tracebacks and
    :class:`CellNames` name it ``Cell In[number]``. The shell's count is left alone (the display hook
    numbers ``Out[N]`` by it); the compiler's ``cache`` is wrapped on the instance and restored on exit."""

    def __init__(self, shell: Any, number: int) -> None:
        self.compiler = getattr(shell, "compile", None)
        self.number = number
        self.saved: Any = None

    def __enter__(self) -> None:
        comp = self.compiler
        if comp is None or not callable(getattr(comp, "cache", None)):
            return
        self.saved = comp.__dict__.get("cache")
        cache, number = comp.cache, self.number

        def cache_as_cell(transformed_code: str, _number: int = 0, raw_code: str | None = None) -> Any:
            return cache(transformed_code, number, raw_code=raw_code)

        comp.cache = cache_as_cell

    def __exit__(self, *exc: Any) -> None:
        comp = self.compiler
        if comp is None:
            return
        if self.saved is None:
            comp.__dict__.pop("cache", None)
        else:
            comp.cache = self.saved


class Progress:
    """A throttled one-line progress display while a cell records, cleared when it ends (Jupyter only)."""

    def __init__(self, interval: float) -> None:
        from IPython.display import display

        self.interval = interval
        self.last = 0.0
        self.updates = 0
        self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def __call__(self, n_ops: int, phase: str, module: str | None) -> None:
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last = now
        self.updates += 1
        text = f"fakeviz: {n_ops:,} ops recorded, {phase} in {module or 'top level'}…"
        where = html_text(module or "top level")
        self.handle.update(
            {
                "text/plain": text,
                "text/html": f"<span class='fv-progress'>fakeviz: {n_ops:,} ops recorded, {phase} in "
                f"<code>{where}</code>…</span>",
            },
            raw=True,
        )

    def close(self) -> None:
        self.handle.update({"text/plain": ""}, raw=True)
