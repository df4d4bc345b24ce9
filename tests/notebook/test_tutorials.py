"""Every tutorial notebook (issue 20): built from its script, executed as Binder would run it, small when stored.

A tutorial is written as ``notebooks/NN_name.py`` (a jupytext percent script that ruff checks) and stored as
``notebooks/NN_name.ipynb`` with its outputs, built by ``notebooks/build.py`` (issue 34): the stored cells must be
what the script builds. Each notebook runs once per session in the fresh ``.venv-binder`` (``nbrun``: built from
``binder/requirements.txt`` and ``binder/postBuild``); the checks here hold for all of them, and
``test_tutorial_NN.py`` check what each teaches.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbrun import NB_DIR, ROOT, RSS_LIMIT, code_cells, execute


def _load_build():
    # by its path: ``build`` on sys.path would shadow the PyPA package of that name in the same test process
    spec = importlib.util.spec_from_file_location("fakeviz_notebooks_build", NB_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()
INSTALL, REPOSITORY, sources = build.INSTALL, build.REPOSITORY, build.sources

NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("[0-9][0-9]_*.ipynb"))
TOPICS = ["quickstart", "70b", "training", "meta", "alias", "export", "inference", "gpus", "long", "finetune",
          "pipeline", "serving"]  # fmt: skip


def test_numbered_tutorials_each_with_its_script() -> None:
    assert [n[:2] for n in NOTEBOOKS] == [f"{i:02d}" for i in range(1, len(TOPICS) + 1)], NOTEBOOKS
    for name, topic in zip(NOTEBOOKS, TOPICS):
        assert topic in name.lower(), (name, topic)
    assert [p.with_suffix(".ipynb").name for p in build.scripts()] == NOTEBOOKS, "one NN_name.py per notebook"
    assert not list(NB_DIR.glob("_make_*.py")), "the string-literal generators are gone (issue 34)"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_cells_are_what_the_script_builds(name: str) -> None:
    """Cell by cell (id, type, source, tags), the stored notebook is what ``build.py`` makes of ``NN_name.py``: the
    two cannot drift (the stored one also keeps its outputs)."""
    made = build.notebook(NB_DIR / name.replace(".ipynb", ".py"))
    stored = nbformat.read(NB_DIR / name, as_version=4)
    hint = f"{name} differs from {name[:-6]}.py: python notebooks/build.py {name[:2]} --execute"
    assert sources(made) == sources(stored), hint
    assert made.metadata["kernelspec"] == stored.metadata["kernelspec"]


def test_build_command_writes_the_cells(tmp_path: Path) -> None:
    """The command line's ``--out`` (cells only) writes what ``notebook()`` builds, install cell and tags included."""
    subprocess.run([sys.executable, str(NB_DIR / "build.py"), "1", "--out", str(tmp_path)], check=True)
    made = nbformat.read(tmp_path / NOTEBOOKS[0], as_version=4)
    nbformat.validate(made)
    assert sources(made) == sources(nbformat.read(NB_DIR / NOTEBOOKS[0], as_version=4))
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code_cells(made))
    tagged = [c for c in made.cells if "raises-exception" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].source.startswith("%%fake"), [c.source[:40] for c in tagged]


def test_keep_outputs_refuses_a_changed_cell_with_outputs(tmp_path: Path) -> None:
    """``--keep-outputs`` pairs the new cells with the stored outputs only where no output can be stale."""
    stored = nbformat.read(NB_DIR / NOTEBOOKS[0], as_version=4)
    made = build.notebook(NB_DIR / NOTEBOOKS[0].replace(".ipynb", ".py"))
    kept = build.keep_outputs(made, stored)
    assert [c.get("outputs") for c in kept.cells] == [c.get("outputs") for c in stored.cells]
    with_output = next(i for i, c in enumerate(made.cells) if c.get("outputs"))
    made.cells[with_output].source += "\nprint('changed')"
    with pytest.raises(SystemExit, match="changed and has outputs"):
        build.keep_outputs(made, stored)
    made.cells.pop()
    with pytest.raises(SystemExit, match="added, removed"):
        build.keep_outputs(made, stored)


def test_ruff_knows_the_names_the_magics_define() -> None:
    """``notebooks/ruff.toml`` tells ruff of names a notebook has but a script cannot show: IPython's ``display`` and
    the traces ``%%fake -o NAME`` keeps, exactly those; and ruff passes every tutorial script."""
    declared = re.search(r"^builtins = \[(.*)\]$", (NB_DIR / "ruff.toml").read_text(), re.M)
    assert declared, "notebooks/ruff.toml declares builtins = [...] on one line"
    kept = set()
    for script in build.scripts():
        for magic in re.findall(r"^# %%fake\b(.*)$", script.read_text(), re.M):
            kept.update(re.findall(r"(?:-o|--output)[ =](\w+)", magic))
    assert set(re.findall(r'"(\w+)"', declared.group(1))) == kept | {"display"}, sorted(kept)
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "notebooks"]  # ruff is in fakeviz[test]
    proc = subprocess.run(ruff, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_notebook_is_small_and_readable(name: str) -> None:
    path = NB_DIR / name
    assert path.stat().st_size < 1_000_000, f"{name}: {path.stat().st_size} bytes"
    raw = json.loads(path.read_text())
    assert "widgets" not in raw["metadata"], "widget state is stored"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = code_cells(nb)
    assert code[0].source == INSTALL.source and REPOSITORY in code[0].source
    title = nb.cells[1]
    assert title.cell_type == "markdown" and title.source.startswith(f"# {name[:2]} ·"), title.source[:80]
    assert re.search(r"you will learn|you'll learn", title.source, re.I), "the opening says what the reader learns"
    last = [c for c in nb.cells if c.cell_type == "markdown"][-1]
    assert re.search(r"^#+ Exercises", last.source, re.M), "the notebook ends with exercises"
    # stored with its outputs (GitHub shows them), none of them a widget or plotly payload
    assert all(c.execution_count is not None for c in code[1:]), "build it with --execute"
    for c in code:
        for out in c.get("outputs", []):
            data = out.get("data", {})
            assert not {k for k in data if "widget" in k or "plotly" in k}, (c.source[:60], list(data))
    prose = sum(len(c.source) for c in nb.cells if c.cell_type == "markdown")
    assert prose > 2500, f"{name}: {prose} characters of prose"


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_runs_in_binders_environment_under_its_memory(name: str) -> None:
    """No cell fails unless it is tagged ``raises-exception`` (and those do fail); the kernel stays under 1.5 GB."""
    nb = execute(name)
    for c in code_cells(nb):
        failed = [o for o in c.get("outputs", []) if o.output_type == "error"]
        if "raises-exception" in c.metadata.get("tags", []):
            assert failed, f"{name}: this cell is meant to fail and did not:\n{c.source}"
        else:
            assert not failed, f"{name}: {c.source[:200]}\n{failed[0]['ename']}: {failed[0]['evalue']}"
        stderr = "".join(o.get("text", "") for o in c.get("outputs", []) if o.get("name") == "stderr")
        assert "Traceback" not in stderr, stderr[-2000:]
    rss = nb.metadata["_peak_rss"]
    assert rss is not None and rss < RSS_LIMIT, f"{name}: kernel peak RSS {rss / 1e9:.2f} GB"


def test_binder_config_and_badge() -> None:
    reqs = (ROOT / "binder" / "requirements.txt").read_text()
    assert "torch==2.13.0" in reqs and "download.pytorch.org/whl/cpu" in reqs
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "pip install" in post and "explorer.js" in post
    readme = (ROOT / "README.md").read_text()
    slug = REPOSITORY.removeprefix("https://github.com/")
    badge = f"https://mybinder.org/v2/gh/{slug}/HEAD?urlpath=lab/tree/notebooks/{NOTEBOOKS[0]}"
    assert badge in readme, badge
