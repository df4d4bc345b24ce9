"""Every code block of README.md and docs/ runs, as written, as a reader would run it (issue 41).

Sybil parses the pages: fenced ``python``, ``ipython`` (magics, run by an IPython shell) and ``bash`` blocks, and
its ``<!-- skip: next "why" -->`` marker for the few blocks that are not meant to run here (the README's setup
commands and pip installs, which CI runs anyway; the hub and your own checkpoints). A page's Python blocks run in
order in one fresh interpreter of their own (tests/docs/reader.py: no conftest, no fixture, the user's defaults),
the later blocks seeing the names the earlier ones made, as in a reader's session; its bash blocks run in
``bash -e`` with this environment's ``bin/`` first on PATH (where ``fakeviz`` is installed). Both run in a
temporary folder, so what the blocks write (``run.fvz``, ``out.html``) never lands in the repository.

One test per block, named after its page and line: selecting a later block alone (``-k``) runs the page's earlier
blocks first. A page whose blocks build the large published models is marked ``slow`` (still run in CI). The
README's blocks are tests of ``tests/docs/test_readme.py``: a file of their own, so that pytest-xdist (``--dist
loadfile``) runs them on one worker while another runs the docs pages' (the README's take minutes: 70B and 405B).
``test_every_code_block_is_run`` keeps the list whole: a block in a language the reader cannot run, or an
indented block (Markdown's other kind of code block, invisible to Sybil), fails it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from sybil import Document, Example
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
READER = Path(__file__).with_name("reader.py")
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [README, *DOCS]
LANGUAGES = ("python", "ipython", "bash")
# the pages whose blocks build published models in full (70B, 405B): minutes, not seconds
SLOW = {"README.md"}
# a block that runs longer than this is stopped and fails (the README's heaviest takes minutes)
TIMEOUT_S = 1200


def _name(path: str | Path) -> str:
    return Path(path).relative_to(ROOT).as_posix()


class Reader:
    """One page's reader: a fresh Python process and a temporary working folder, for the page's blocks in order."""

    def __init__(self, page: str) -> None:
        self.page = page
        self.folder = tempfile.TemporaryDirectory(prefix="fakeviz-docs-")
        self.cwd = Path(self.folder.name)
        self.log = self.cwd / "reader.log"
        self.process: subprocess.Popen | None = None
        self.done = 0  # how many of the page's blocks ran (failed or not)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        self.env = env

    def _start(self) -> None:
        cmd_read, self.cmd = os.pipe()
        self.reply, reply_write = os.pipe()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", READER.read_text(), str(cmd_read), str(reply_write)],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(cmd_read, reply_write),
            )
        os.close(cmd_read)
        os.close(reply_write)

    def _output(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-4000:]

    def python(self, lang: str, source: str, line: int) -> str | None:
        if self.process is None:
            self._start()
        request = {"lang": lang, "source": source, "path": str(ROOT / self.page), "line": line}
        os.write(self.cmd, (json.dumps(request) + "\n").encode())
        reply = b""
        deadline = time.monotonic() + TIMEOUT_S
        while not reply.endswith(b"\n"):
            ready, _, _ = select.select([self.reply], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self._stop(kill=True)  # the page's later blocks start a fresh interpreter (and fail on its names)
                return f"the block ran over {TIMEOUT_S} s and was stopped\n{self._output()}"
            chunk = os.read(self.reply, 65536)
            if not chunk:
                code = self._stop(kill=False)
                return f"the reader's Python exited with code {code}\n{self._output()}"
            reply += chunk
        return json.loads(reply)["error"]

    def bash(self, source: str) -> str | None:
        try:
            run = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", source],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return f"the block ran over {TIMEOUT_S} s and was stopped"
        if run.returncode:
            return f"exit status {run.returncode}\n{(run.stdout + run.stderr)[-4000:]}"
        return None

    def _stop(self, kill: bool) -> int | None:
        """End the reader's Python (at once with ``kill``, else once its loop sees the requests end); its exit code."""
        if self.process is None:
            return None
        os.close(self.cmd)  # end of the requests: the reader's loop ends
        if kill:
            self.process.kill()
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        os.close(self.reply)
        self.process = None
        return code

    def close(self) -> None:
        self._stop(kill=False)
        self.folder.cleanup()


def _evaluate(example: Example) -> None:
    """Sybil's evaluator for the three languages: the page's reader runs the block."""
    reader: Reader = example.namespace["reader"]
    lang = example.region.lexemes["arguments"]
    source = example.parsed.text if hasattr(example.parsed, "text") else str(example.parsed)
    if lang == "bash":
        error = reader.bash(source)
    else:
        error = reader.python(lang, source, example.line + 1)  # the fence's line, then the code's
    if error:
        raise AssertionError(f"{reader.page}, the {lang} block at line {example.line}:\n{error}")


PARSERS = [*(CodeBlockParser(language=lang, evaluator=_evaluate) for lang in LANGUAGES), SkipParser()]


def blocks(pages: list[Path]) -> list:
    """One pytest parameter per block of ``pages`` that runs (page, index among the page's examples)."""
    params = []
    for page in pages:
        examples = Document.parse(str(page), *PARSERS).examples()
        for index, example in enumerate(examples):
            if example.region.evaluator is not _evaluate:
                continue  # a skip marker: it runs in the page's order, not as a test of its own
            marks = [pytest.mark.slow] if _name(page) in SLOW else []
            params.append(pytest.param(_name(page), index, id=f"{_name(page)}:{example.line}", marks=marks))
    return params


_READERS: dict[str, tuple[Reader, list[Example]]] = {}


def close_readers(pages: list[Path]) -> None:
    """End the readers of ``pages`` (their Python processes, their folders)."""
    for page in map(_name, pages):
        if page in _READERS:
            _READERS.pop(page)[0].close()


def run_block(page: str, index: int) -> None:
    """Block ``index`` of ``page``, after the page's earlier blocks (run first when ``-k`` picked this one alone)."""
    if page not in _READERS:
        document = Document.parse(str(ROOT / page), *PARSERS)
        reader = Reader(page)
        document.namespace["reader"] = reader
        _READERS[page] = (reader, list(document.examples()))
    reader, examples = _READERS[page]
    while reader.done < index:  # the earlier blocks first, as the reader ran them
        example = examples[reader.done]
        reader.done += 1
        try:
            example.evaluate()
        except Exception:  # noqa: BLE001 (that block's own test reports it; this one runs on, as a reader would)
            pass
    if reader.done == index:
        reader.done += 1
        examples[index].evaluate()


@pytest.fixture(scope="module", autouse=True)
def _close_readers():
    yield
    close_readers(DOCS)


@pytest.mark.parametrize(("page", "index"), blocks(DOCS))
def test_block_runs(page: str, index: int) -> None:
    run_block(page, index)


def test_every_code_block_is_run() -> None:
    """Each page's code blocks are exactly the ones above (none in another language, none indented)."""
    markdown = MarkdownIt("commonmark")
    problems = []
    for page in PAGES:
        for token in markdown.parse(page.read_text()):
            line = token.map[0] + 1 if token.map else 0
            if token.type == "code_block":
                problems.append(f"{_name(page)}:{line}: an indented block: fence it as ```bash or ```python")
            elif token.type == "fence" and token.info.split()[:1] != [] and token.info.split()[0] not in LANGUAGES:
                problems.append(f"{_name(page)}:{line}: ```{token.info}: the reader runs {', '.join(LANGUAGES)}")
            elif token.type == "fence" and not token.info.strip():
                problems.append(f"{_name(page)}:{line}: a fence without a language: name one of {LANGUAGES}")
    assert not problems, "\n".join(problems)
