"""Build the tutorial notebooks from their sources: ``notebooks/NN_name.py`` -> ``notebooks/NN_name.ipynb``.

Each tutorial is a jupytext percent-format script (``# %%`` code cells, ``# %% [markdown]`` cells whose lines are
comments, ``# %% tags=["raises-exception"]`` for a cell meant to fail, IPython magics commented out as jupytext
writes them): real code that ruff checks and an editor reads. Its opening comment block, before the first cell, says
what the tutorial teaches and how its tests check it; it is not a cell. This script adds what every tutorial shares:

* the guarded install cell first (:data:`INSTALL`: Binder and a checkout have fakeviz, Colab installs it);
* fixed cell ids (``cell-00``, ``cell-01``, ...), the ``python3`` kernel spec, no jupytext metadata, so the stored
  notebook depends on nothing but the script's cells;
* with ``--execute``, the outputs, run in a kernel (this machine's ``python3``) and tidied by :func:`tidy`: no
  widget state, no widget or plotly payloads (their static fallbacks stay: Note: [static fallback] in
  ``fakeviz/_views/explorer.py``), no output over 150 kB, so the stored file stays under 1 MB and reads on GitHub.

Usage (from anywhere; ``NN`` picks tutorials by number, none means all twelve)::

    python notebooks/build.py NN --execute        # write notebooks/NN_name.ipynb and run it: the stored outputs
    python notebooks/build.py NN --out DIR        # the cells only, into DIR (what the test compares)
    python notebooks/build.py NN --keep-outputs   # new cells, the stored outputs kept (see keep_outputs)

``tests/notebook/test_tutorials.py`` checks that every stored notebook's cells are what its script builds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat as nbf

HERE = Path(__file__).resolve().parent
REPOSITORY = "https://github.com/fakeviz/fakeviz"  # the Binder badge and Colab's install read this too

INSTALL = nbf.v4.new_code_cell(
    "# Binder and a checkout of fakeviz have everything; elsewhere (Colab) this installs the CPU build.\n"
    "import importlib.util, subprocess, sys\n"
    'if importlib.util.find_spec("fakeviz") is None:\n'
    '    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",\n'
    f'                           "fakeviz[hf] @ git+{REPOSITORY}"])'
)

MAX_OUTPUT = 150_000  # bytes of one stored output; bigger ones are replaced by a line saying what they were
MAX_NOTEBOOK = 1_000_000  # bytes of a stored notebook (GitHub shows it)
_DROP = (
    "application/vnd.jupyter.widget-view+json",
    "application/vnd.jupyter.widget-state+json",
    "application/vnd.plotly.v1+json",
)


def scripts() -> list[Path]:
    """Every tutorial's script, in order (``notebooks/NN_name.py``)."""
    return sorted(HERE.glob("[0-9][0-9]_*.py"))


def script(number: str) -> Path:
    """The tutorial script numbered ``number`` (``"01"`` or ``"1"``)."""
    found = [p for p in scripts() if p.name[:2] == f"{int(number):02d}"]
    if len(found) != 1:
        raise SystemExit(f"no tutorial numbered {number!r}: give one of {[p.name[:2] for p in scripts()]}")
    return found[0]


def notebook(path: Path) -> nbf.NotebookNode:
    """The notebook a tutorial script builds: its cells after the install cell, fixed ids, no outputs."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line.startswith("# %%")), None)
    if first is None:
        raise SystemExit(f"{path.name} has no cell: a tutorial is a jupytext percent script (`# %%` cells)")
    if any(line.strip() and not line.startswith("#") for line in lines[:first]):
        raise SystemExit(f"{path.name}: before its first `# %%` cell a tutorial has only its comment block")
    # the opening comment block describes the script; jupytext would make it a cell of its own
    cells = jupytext.reads("".join(lines[first:]), fmt="py:percent").cells
    cells = [INSTALL.copy(), *cells]
    for i, cell in enumerate(cells):
        cell.id = f"cell-{i:02d}"  # fixed ids: the script reproduces the stored cells exactly
        cell.metadata = {"tags": cell.metadata["tags"]} if cell.metadata.get("tags") else {}
    nb = nbf.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def sources(nb: nbf.NotebookNode) -> list[tuple[str, str, str, list[str]]]:
    """What the script decides (cell id, type, source, tags), for comparing with a stored notebook."""
    return [(c.id, c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in nb.cells]


def tidy(nb: nbf.NotebookNode) -> nbf.NotebookNode:
    """Stored outputs: static fallbacks only, nothing big, no timings or widget state."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data is not None:
                for key in _DROP:
                    data.pop(key, None)
                if not data:
                    continue
                if "text/plain" not in data and "text/html" in data:
                    data["text/plain"] = "(an HTML output)"
                if len(str(data.get("text/html", ""))) > MAX_OUTPUT:
                    data.pop("text/html")
                    data["text/plain"] = "(an interactive figure: run the notebook to see it)"
            if "text" in out and len(out["text"]) > MAX_OUTPUT:
                out["text"] = out["text"][:2000] + "\n… (output cut for the stored notebook)\n"
            if out.get("output_type") in ("display_data", "execute_result"):
                out["metadata"] = {}  # nbformat requires the field; what kernels put there is display hints only
            kept.append(out)
        cell.outputs = kept
    return nb


def execute(nb: nbf.NotebookNode) -> nbf.NotebookNode:
    """``nb`` run in a ``python3`` kernel with ``notebooks/`` as its working folder, then tidied."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    return tidy(nb)


def keep_outputs(nb: nbf.NotebookNode, stored: nbf.NotebookNode) -> nbf.NotebookNode:
    """``nb``'s cells with ``stored``'s outputs, for an edit that cannot change what a cell prints (a comment, the
    order of imports, a markdown cell's text).

    Refused where the cells no longer pair up (one added, removed or changed type) or where a cell whose code
    changed had outputs: those need ``--execute``. A changed cell without outputs can still change later cells'
    outputs (an import that prints a warning): execute the notebook when in doubt.
    """
    new, old = nb.cells, stored.cells
    if [c.cell_type for c in new] != [c.cell_type for c in old]:
        raise SystemExit("--keep-outputs: the cells were added, removed or changed type: build with --execute")
    for a, b in zip(new, old):
        if a.cell_type != "code":
            continue
        if a.source != b.source and b.get("outputs"):
            raise SystemExit(f"--keep-outputs: this cell changed and has outputs, build with --execute:\n{a.source}")
        a.outputs, a.execution_count = b.get("outputs", []), b.get("execution_count")
    nb.metadata = stored.metadata  # what the kernel that made the outputs said of itself (language_info)
    return nb


def write(nb: nbf.NotebookNode, out: Path) -> Path:
    """Write ``nb`` to ``out``; a stored notebook (in ``notebooks/``) must stay under 1 MB."""
    nbf.write(nb, out)
    size = out.stat().st_size
    if out.parent == HERE and size > MAX_NOTEBOOK:
        raise SystemExit(f"{out.name} is {size / 1e6:.2f} MB: the stored notebook must stay under 1 MB")
    return out


def main(argv: list[str] | None = None) -> list[Path]:
    """The command line (see the module docstring); returns the notebooks written."""
    parser = argparse.ArgumentParser(prog="python notebooks/build.py", description=__doc__.split("\n")[0])
    parser.add_argument("numbers", nargs="*", help="tutorial numbers (01 ... 12); none means all")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--execute", action="store_true", help="run the notebook and store its tidied outputs")
    how.add_argument("--keep-outputs", action="store_true", help="store the new cells with the stored outputs")
    how.add_argument("--out", type=Path, help="write the cells only, without outputs, into this folder")
    args = parser.parse_args(argv)
    paths = [script(n) for n in args.numbers] if args.numbers else scripts()
    written = []
    for path in paths:
        nb = notebook(path)
        target = (args.out or HERE) / path.with_suffix(".ipynb").name
        if args.execute:
            nb = execute(nb)
        elif args.keep_outputs:
            nb = keep_outputs(nb, nbf.read(target, as_version=4))
        elif args.out is None:
            parser.error("give --execute, --keep-outputs or --out DIR (a stored notebook keeps its outputs)")
        written.append(write(nb, target))
        print(f"wrote {target}", file=sys.stderr)
    return written


if __name__ == "__main__":
    main()
