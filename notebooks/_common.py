"""What every tutorial generator shares: the install cell, fixed cell ids, and the stored outputs' tidying.

A generator ``notebooks/_make_NN.py`` lists its cells and ends with ``write(cells, "NN_name.ipynb")``:

* ``python notebooks/_make_NN.py OUT.ipynb`` writes the sources only (what the test compares with the
  committed notebook's sources, cell by cell);
* ``python notebooks/_make_NN.py --execute`` writes ``notebooks/NN_name.ipynb`` and runs it in a kernel
  (this machine's ``python3``), keeping the outputs tidied by :func:`tidy`: no widget state, no widget or
  plotly payloads (their static fallbacks stay: Note: [static fallback] in ``fakeviz/_views/explorer.py``),
  no output over 150 kB, so the stored file stays under 1 MB and reads on GitHub.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).resolve().parent
REPOSITORY = "https://github.com/fakeviz/fakeviz"  # the Binder badge and Colab's install read this too

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell

INSTALL = code(
    "# Binder and a checkout of fakeviz have everything; elsewhere (Colab) this installs the CPU build.\n"
    "import importlib.util, subprocess, sys\n"
    'if importlib.util.find_spec("fakeviz") is None:\n'
    '    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",\n'
    f'                           "fakeviz[hf] @ git+{REPOSITORY}"])'
)

MAX_OUTPUT = 150_000  # bytes of one stored output; bigger ones are replaced by a line saying what they were
_DROP = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json",
         "application/vnd.plotly.v1+json")  # fmt: skip


def raises(source: str):
    """A code cell that is meant to fail (nbclient goes on; the tests check its error)."""
    return nbf.v4.new_code_cell(source, metadata={"tags": ["raises-exception"]})


def notebook(cells: list) -> nbf.NotebookNode:
    cells = [INSTALL.copy(), *cells] if not cells or cells[0].source != INSTALL.source else cells
    for i, cell in enumerate(cells):
        cell.id = f"cell-{i:02d}"  # fixed ids: the script reproduces the committed sources exactly
    nb = nbf.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


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


def write(cells: list, name: str, argv: list[str] | None = None) -> Path:
    """The generator's entry point (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    nb = notebook(cells)
    if argv and argv[0] != "--execute":
        out = Path(argv[0])
        nbf.write(nb, out)
        return out
    out = HERE / name
    if argv[:1] == ["--execute"]:
        import os

        from nbclient import NotebookClient

        # stored outputs are made one point after another (the tests re-execute them so: Note: [no pools in the
        # suite] in tests/conftest.py); a pool's recordings and source lines depend on the machine's load
        os.environ.setdefault("FAKEVIZ_EXECUTOR", "serial")
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
        nb = tidy(nb)
    nbf.write(nb, out)
    size = out.stat().st_size
    if size > 1_000_000:
        raise SystemExit(f"{out.name} is {size / 1e6:.2f} MB: the stored notebook must stay under 1 MB")
    return out


def sources(nb: nbf.NotebookNode) -> list[tuple[str, str, str, list[str]]]:
    """What the generator decides (cell id, type, source, tags), for comparing with a stored notebook."""
    return [(c.id, c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in nb.cells]
