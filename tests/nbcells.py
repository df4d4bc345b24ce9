"""Notebook fixtures of the tests (``tests/notebook/magic_tour.py``, ``tests/browser/explorer_tour.py``) written
to a path: fixed cell ids and the python3 kernelspec, no outputs."""

from typing import Any

import nbformat as nbf


def write_notebook(cells: list[Any], path: Any) -> None:
    for i, cell in enumerate(cells):
        cell.id = f"cell-{i:02d}"
    nb = nbf.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbf.write(nb, path)
