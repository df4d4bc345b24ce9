"""The documentation site's build hook (mkdocs.yml ``hooks:``): what the pages take from the code and the repository.

- **Tutorials.** Every ``notebooks/NN_*.ipynb`` becomes the page ``notebooks/NN_*/``, rendered by
  mkdocs-jupyter from its stored outputs (never executed here: ``tests/notebook`` executes them), and gets a nav
  entry under "Tutorials" titled with its first heading. A new notebook needs no edit here.
- **Screenshots.** The explorer's screenshot(s) in ``benchmarks/results/*.png`` are served as ``assets/NAME.png``.
- **Command line.** ``<!-- fakeviz:cli -->`` in a page becomes the reference of ``fakeviz``'s subcommands, read
  from the argparse parser ``fakeviz/_frontends/cli.py`` builds (every option, its default and help), and
  ``<!-- fakeviz:magic -->`` the ``%%fake`` magic's options from its IPython ``magic_arguments`` parser: the pages
  cannot drift from the code. A parser that can no longer be found fails the build, saying where to look.
- **Home.** ``<!-- fakeviz:readme -->`` (``docs/index.md``) is README.md, its links rewritten for the site: the
  landing page is written once; ``<!-- fakeviz:readme-section TITLE -->`` is one of its ``## TITLE`` sections
  (the install page). ``<!-- fakeviz:tutorials -->`` lists the tutorials.

Note: [notebooks outside docs_dir]: mkdocs reads pages from ``docs/`` only; the notebooks stay where the tests,
Binder and ``notebooks/build.py`` expect them, and :func:`on_files` adds them as generated files backed by the
real path. It runs before mkdocs-jupyter's ``on_files`` (``event_priority``), which only converts files already in
the collection: hooks otherwise run after every plugin.
"""

from __future__ import annotations

import argparse
import html
import inspect
import json
import re
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SCREENSHOTS = ROOT / "benchmarks" / "results"
_NOTEBOOK = re.compile(r"^\d\d_\w+\.ipynb$")


def notebooks() -> list[Path]:
    """The tutorials: ``notebooks/NN_name.ipynb``, in their order."""
    return sorted(p for p in NOTEBOOKS.glob("*.ipynb") if _NOTEBOOK.match(p.name))


def notebook_title(path: Path) -> str:
    """A tutorial's nav title: its number and its first markdown heading (else its file name)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for c in nb.get("cells", []):
        if c.get("cell_type") != "markdown":
            continue
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for line in src.splitlines():
            if line.startswith("#"):
                return f"{path.name[:2]} {line.lstrip('#').strip()}"
    return path.stem.replace("_", " ")


def on_config(config: Any) -> Any:
    """Append one nav entry per tutorial under "Tutorials" (after its index page)."""
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Tutorials" in entry:
            entry["Tutorials"] = [e for e in entry["Tutorials"] if not str(e).endswith(".ipynb'}")]
            entry["Tutorials"] += [{notebook_title(p): f"notebooks/{p.name}"} for p in notebooks()]
            return config
    raise SystemExit("docs/hooks/fakeviz_docs.py: mkdocs.yml's nav has no 'Tutorials' section to list the notebooks in")


@event_priority(100)  # before mkdocs-jupyter's on_files (Note: [notebooks outside docs_dir])
def on_files(files: Files, config: Any) -> Files:
    """Add the notebooks as ``tutorials/*.ipynb`` and the screenshots as ``assets/*.png``."""
    for p in notebooks():
        # a File whose source is the real notebooks/NN.ipynb, not File.generated: mkdocs-jupyter's NotebookFile
        # wrapper loses a generated file's source path (it recomputes abs_src_path from src_dir)
        files.append(File(f"notebooks/{p.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))  # fmt: skip
    for p in sorted(SCREENSHOTS.glob("explorer*.png")):
        files.append(File.generated(config, f"assets/{p.name}", abs_src_path=str(p)))
    return files


def _cell(text: str) -> str:
    """``text`` for one cell of a markdown table: markup escaped, pipes and newlines written out."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "&#124;")


def _flags(a: argparse.Action) -> str:
    names = a.option_strings or [a.metavar or a.dest]
    value = ""
    if a.option_strings and a.nargs != 0:
        if a.choices:
            value = " {" + ",".join(str(c) for c in a.choices) + "}"
        else:
            value = " " + (a.metavar or a.dest.upper())
        if a.nargs == "?":
            value = f" [{value.strip()}]"
    return ", ".join(f"`{n}{value}`" for n in names)


def _default(a: argparse.Action) -> str:
    if not a.option_strings or a.default in (None, False, [], argparse.SUPPRESS) or a.nargs == 0:
        return ""
    return f"`{a.default}`"


def parser_markdown(p: argparse.ArgumentParser, title: str, anchor: str | None = None) -> str:
    """One parser's reference (a level-3 heading, with ``anchor`` as its id): its description, usage, and a table
    of its arguments."""
    out = [f"### `{title}`" + (f" {{#{anchor}}}" if anchor else ""), ""]
    if p.description:  # our own text (a docstring for the magics): reST's ``code`` written as Markdown's
        out += [inspect.cleandoc(p.description).replace("``", "`"), ""]
    # IPython's magic parsers format their usage as a reST block: "::", then the prog with one more "%"
    usage = p.format_usage().strip().removeprefix("::").strip()
    if not usage.startswith("usage:"):
        usage = "usage: " + title + usage[len(usage.split(None, 1)[0]) :]
    out += ["```text", usage, "```", ""]
    rows = [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        out += ["| argument | default | what it does |", "|---|---|---|"]
        out += [f"| {_flags(a)} | {_default(a)} | {_cell(a.help or '')} |" for a in rows]
        out.append("")
    return "\n".join(out)


def cli_markdown() -> str:
    """The reference of every ``fakeviz`` subcommand, from the parser ``fakeviz._frontends.cli`` builds."""
    from fakeviz._frontends import cli

    make = getattr(cli, "_parser", None) or getattr(cli, "parser", None)
    if make is None:
        raise SystemExit(
            "docs/hooks/fakeviz_docs.py: fakeviz/_frontends/cli.py no longer has _parser() (or parser()), "
            "which the CLI reference is generated from: point cli_markdown() at the function that builds it"
        )
    top = make()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in subs._choices_actions}
    out = ["| command | what it does |", "|---|---|"]
    out += [f"| [`fakeviz {name}`](#fakeviz-{name}) | {_cell(helps.get(name, ''))} |" for name in subs.choices]
    out.append("")
    for name, sp in subs.choices.items():
        out.append(parser_markdown(sp, f"fakeviz {name}", anchor=f"fakeviz-{name}"))
    return "\n".join(out)


def magic_markdown() -> str:
    """The ``%%fake``, ``%fake_trace`` and ``%fake_reset`` options, from their ``magic_arguments`` parsers."""
    from fakeviz._frontends.magic import FakeMagics

    out = []
    for name, prefix in (("fake", "%%"), ("fake_trace", "%"), ("fake_reset", "%")):
        fn = getattr(FakeMagics, name, None)
        parser = getattr(fn, "parser", None)
        if parser is None:
            raise SystemExit(f"docs/hooks/fakeviz_docs.py: FakeMagics.{name} has no magic_arguments parser any more")
        out.append(parser_markdown(parser, f"{prefix}{name}"))
    return "\n".join(out)


def tutorials_markdown() -> str:
    """One line per tutorial, linking its page."""
    return "\n".join(f"- [{notebook_title(p)}](../notebooks/{p.name})" for p in notebooks())


def readme_markdown() -> str:
    """README.md (the landing page) with its links rewritten for the site: ``docs/x.md`` -> ``x.md``, the
    screenshot from ``assets/``, files outside ``docs/`` to the repository."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = text.replace("](docs/", "](").replace("](benchmarks/results/", "](assets/")
    return re.sub(
        r"\]\((?!https?:|#|assets/)([^)]+\.(?:md|py|toml|sh))\)",
        r"](https://github.com/fakeviz/fakeviz/blob/HEAD/\1)",
        text,
    )


_MARKERS = {
    "<!-- fakeviz:cli -->": cli_markdown,
    "<!-- fakeviz:magic -->": magic_markdown,
    "<!-- fakeviz:tutorials -->": tutorials_markdown,
    "<!-- fakeviz:readme -->": readme_markdown,
}


_SECTION = re.compile(r"<!-- fakeviz:readme-section (.+?) -->")


def readme_section(title: str) -> str:
    """The README's section ``## title`` (to the next ``## ``), its links rewritten as :func:`readme_markdown`'s."""
    text = readme_markdown()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    if m is None:
        raise SystemExit(f"docs/hooks/fakeviz_docs.py: README.md has no section '## {title}' any more")
    return m.group(0).replace("](#", "](index.md#")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replace the generated sections' markers with what the code says today."""
    for marker, make in _MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return _SECTION.sub(lambda m: readme_section(m.group(1)), markdown)


# Sphinx roles in our docstrings (:func:`fakeviz.record`, :attr:`ops`, :class:`~fakeviz.Trace`), as Markdown
# renders them: the role's name, then the code span
_ROLE = re.compile(r":(?:func|meth|attr|class|mod|data|exc|obj|const|py:\w+):(<code>)~?([^<]*?)(</code>)")


def _role(m: re.Match[str]) -> str:
    name = m.group(2)
    if m.group(0).split("<code>", 1)[1].startswith("~"):
        name = name.rsplit(".", 1)[-1]
    return f"{m.group(1)}{name}{m.group(3)}"


def on_page_content(html_text: str, page: Any, config: Any, files: Files) -> str:
    """Write the docstrings' Sphinx roles as plain code: ``:func:`x``` reads ``x``, ``:class:`~a.B``` reads ``B``."""
    return _ROLE.sub(_role, html_text)
