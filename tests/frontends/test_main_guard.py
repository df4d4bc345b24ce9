"""Scripts are safe with the default executor: a user's script without an ``if __name__ == "__main__":`` guard runs
its body once, and ``executor="processes"`` from such a script is refused before any worker starts (a spawn
worker would run the script again from the top): Note: [the main guard] in fakeviz/_frontends/executors.py.

Each script runs as a user runs it (``python script.py``, ``python -m ...``, ``python -c``) in a fresh process
with the user's environment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakeviz._frontends import executors

HEAD = """\
import fakeviz as fv
from fakeviz._frontends import executors

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256}
cfg = fv.models.config("meta-llama/Llama-3.1-8B", **TINY)
"""
SWEEP = 'df = fv.sweep(cfg, gpus="H100", batch=[1, 2, 3], seq=16, train=True, progress=False{extra})\n'
REPORT = 'print("MARKER", len(df), df.attrs["executor"], flush=True)\n'
BODY = 'print("BODY", flush=True)\n'


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_script_without_a_guard_runs_once_with_the_default(tmp_path: Path) -> None:
    script = _script(tmp_path / "plain.py", HEAD + BODY + SWEEP.format(extra="") + REPORT)
    out = _run([str(script)], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("BODY") == 1 and out.stdout.count("MARKER") == 1, out.stdout
    assert "MARKER 3 in this process, one point after another" in out.stdout


def test_a_script_without_a_guard_asking_for_processes_is_told_to_add_one(tmp_path: Path) -> None:
    script = _script(tmp_path / "plain.py", HEAD + BODY + SWEEP.format(extra=', executor="processes"') + REPORT)
    out = _run([str(script)], tmp_path)
    assert out.returncode == 1 and out.stdout.count("BODY") == 1 and "MARKER" not in out.stdout, out.stdout
    last = out.stderr.strip().splitlines()[-2:]
    assert last[0] == (
        "fakeviz._core.errors.ArgumentError: executor='processes': called from plain.py line 8, outside an "
        '`if __name__ == "__main__":` block: each worker process would run the script again from the top'
    ), out.stderr[-3000:]
    assert last[1].startswith('Put the call (and what it needs) under `if __name__ == "__main__":`')


def test_a_guarded_script_runs_its_points_on_the_pool(tmp_path: Path) -> None:
    # POOL_AFTER_S at 0: the tiny points count as slow, so the pool starts (Note: [the default executor])
    guarded = "executors.POOL_AFTER_S = 0.0\n\nif __name__ == '__main__':\n" + textwrap.indent(
        BODY + SWEEP.format(extra=', executor="processes"') + REPORT, "    "
    )
    script = _script(tmp_path / "guarded.py", HEAD + guarded)
    out = _run([str(script)], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("BODY") == 1 and out.stdout.count("MARKER") == 1, out.stdout
    assert "MARKER 3 " in out.stdout and " points in a pool of " in out.stdout, out.stdout
    assert " 0 of 3 points in a pool" not in out.stdout, out.stdout


def test_python_m_checks_a_module_and_leaves_a_packages_main_and_python_c_alone(tmp_path: Path) -> None:
    one_point = (
        HEAD + 'df = fv.sweep(cfg, gpus="H100", batch=1, seq=16, progress=False, executor="processes")\n' + REPORT
    )
    _script(tmp_path / "pkg" / "__init__.py", "")
    _script(tmp_path / "pkg" / "script.py", one_point)
    _script(tmp_path / "pkg" / "__main__.py", one_point)
    out = _run(["-m", "pkg.script"], tmp_path)  # multiprocessing runs pkg.script again in each worker
    assert out.returncode == 1 and "called from script.py line 7, outside an `if __name__" in out.stderr
    out = _run(["-m", "pkg"], tmp_path)  # a package's __main__.py: multiprocessing does not run it again
    assert out.returncode == 0 and "MARKER 1 " in out.stdout, out.stderr[-3000:]
    out = _run(["-c", one_point], tmp_path)  # no file to run again
    assert out.returncode == 0 and "MARKER 1 " in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize(
    ("source", "line", "guarded"),
    [
        ("x = 1\nif __name__ == '__main__':\n    f()\n    g()\nh()\n", 4, True),
        ("x = 1\nif __name__ == '__main__':\n    f()\n    g()\nh()\n", 5, False),
        ("if '__main__' == __name__:\n    f(\n      1)\n", 3, True),
        ("if __name__ != '__main__':\n    pass\nelse:\n    f()\n", 4, True),
        ("if __name__ != '__main__':\n    f()\n", 2, False),
        ("try:\n    if __name__ == '__main__':\n        f()\nexcept KeyError:\n    pass\n", 3, True),
        ("if __name__ == 'other':\n    f()\n", 2, False),
        ("if __name__ == '__main__' and x:\n    f()\n", 2, True),  # a worker's __name__ is __mp_main__: never runs
        ("if __name__ == '__main__' or x:\n    f()\n", 2, False),
    ],
)
def test_the_guard_is_read_from_the_source(tmp_path: Path, source: str, line: int, guarded: bool) -> None:
    path = _script(tmp_path / "s.py", source)
    assert executors._guarded(str(path), line) is guarded
