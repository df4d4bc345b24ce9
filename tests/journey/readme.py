"""The README's examples as scripts/test_journey.sh runs them, read from README.md at run time so they cannot drift.

``python tests/journey/readme.py python OUT.py``: every ```python block, in order, concatenated into one plain
script (no ``__main__`` guard, as a user saves them), after one line that prints that the script started (a pool
worker that re-imports the user's script would print it again). ``python tests/journey/readme.py commands``: the
``fakeviz ...`` command lines of the README's shell blocks (```bash, ```sh, ```console or indented by four
spaces), one a line. A block is taken whatever marker precedes it: a user copies them all. Not collected by pytest.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
STARTED = "journey: the README script starts in process"


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def python_script() -> str:
    found = blocks("python")
    if not found:
        sys.exit(f"journey: no ```python block in {README}")
    start = f"import os\nprint(f'{STARTED} {{os.getpid()}}', flush=True)\n\n"
    return start + "\n".join(found)


def commands() -> list[str]:
    text = README.read_text()
    shell = [line for lang in ("bash", "sh", "shell", "console") for body in blocks(lang) for line in body.splitlines()]
    indented = [m[4:] for m in re.findall(r"^    \S.*$", FENCE.sub("", text), re.M)]
    lines = [re.sub(r"^\$ ", "", line.strip()) for line in shell + indented]
    return [line for line in lines if line.startswith("fakeviz ")]


def main(argv: list[str]) -> int:
    if argv[:1] == ["python"] and len(argv) == 2:
        script = python_script()
        Path(argv[1]).write_text(script)
        print(f"journey: {len(blocks('python'))} python blocks of README.md, {script.count(chr(10))} lines")
    elif argv == ["commands"]:
        found = commands()
        if not found:
            sys.exit(f"journey: no 'fakeviz ...' command in a shell block of {README}")
        print("\n".join(found))
    else:
        sys.exit("usage: readme.py python OUT.py | readme.py commands")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
