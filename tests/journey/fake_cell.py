"""One ``%%fake`` cell in a real kernel, as a notebook user runs it (step ``kernel`` of scripts/test_journey.sh).

Run with the journey environment's own interpreter: ``python tests/journey/fake_cell.py WORKDIR``. nbclient starts
the ``python3`` kernel of that interpreter (ipykernel's built-in kernel spec runs ``sys.executable``) and executes
two cells, ``%load_ext fakeviz`` and a ``%%fake --device cuda:0`` cell that builds and trains a tiny model. Exits
non-zero, printing the cell and what it showed, when a cell shows an error or writes to stderr, when the recorded
cell shows nothing, or when the kernel is not this interpreter. Not collected by pytest (no ``test_`` prefix): it
runs outside this repository's environment, against the installed wheel.
"""

from __future__ import annotations

import os
import sys

import nbclient
import nbformat
from jupyter_client.kernelspec import KernelSpecManager

CELLS = [
    "%load_ext fakeviz\nimport torch",
    "%%fake --device cuda:0\n"
    "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))\n"
    "x = torch.randn(8, 64)\n"
    "model(x).sum().backward()",
]


def _shown(out: dict) -> str:
    if out.get("output_type") == "stream":
        return f"[{out['name']}] {out['text']}"
    if out.get("output_type") == "error":
        return "[error] " + "\n".join(out.get("traceback", []))
    data = out.get("data", {})
    return f"[{out.get('output_type')}] " + str(data.get("text/plain", sorted(data)))


def main(workdir: str) -> int:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in CELLS])
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": workdir}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # the failing cell's outputs are printed below
        print(f"kernel: a cell raised: {str(e).splitlines()[-1] if str(e) else e!r}")
    kernel = KernelSpecManager().get_kernel_spec("python3").argv[0]  # the spec nbclient started
    problems = []
    # a kernel.json whose argv[0] is "python" or "python3" runs sys.executable (jupyter_client's format_kernel_cmd)
    if kernel not in ("python", "python3") and os.path.realpath(kernel) != os.path.realpath(sys.executable):
        problems.append(f"the kernel ran {kernel}, not this environment's {sys.executable}")
    for i, cell in enumerate(nb.cells):
        bad = [o for o in cell.outputs if o.get("output_type") == "error"
               or (o.get("output_type") == "stream" and o.get("name") == "stderr")]  # fmt: skip
        if bad or (i == 1 and not cell.outputs):
            what = "no output (the recorded cell shows its summary)" if not bad else "an error or stderr"
            shown = "\n".join(_shown(o) for o in cell.outputs)
            problems.append(f"cell {i + 1} showed {what}:\n--- cell\n{cell.source}\n--- outputs\n{shown}")
    for p in problems:
        print("kernel: FAILED:", p)
    if not problems:
        print(f"kernel: {len(nb.cells)} cells ran in {kernel} without an error or stderr; the %%fake cell showed "
              f"{', '.join(_shown(o)[:80].splitlines()[0] for o in nb.cells[1].outputs)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.getcwd()))
