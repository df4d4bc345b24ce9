"""The documentation site's promises that ``mkdocs build --strict`` (``scripts/docs.sh``, in CI) does not check.

The strict build fails on a broken link, a page left out of the nav and a ``::: name`` the code no longer has. It
cannot know what is *missing*: a public name with no entry in the API reference, a README that lost its two
commands, a CI that stopped building the site. These tests read files only (no mkdocs needed).
"""

from __future__ import annotations

import re
from pathlib import Path

import fakeviz as fv
import fakeviz.models

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _reference() -> set[str]:
    """The objects the API reference pages document (``::: dotted.name`` lines)."""
    names: set[str] = set()
    for page in (DOCS / "reference").glob("*.md"):
        names |= set(re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), flags=re.M))
    return names


def test_every_public_name_is_in_the_api_reference() -> None:
    documented = _reference()
    missing = [n for n in fv.__all__ if f"fakeviz.{n}" not in documented]
    assert not missing, f"add '::: fakeviz.NAME' for these to a page of docs/reference/: {missing}"
    # the modules documented whole (their __all__, mkdocstrings' filters: public)
    assert {"fakeviz.models", "fakeviz.views"} <= documented
    assert fakeviz.models.__all__  # what filters: public renders


def test_readme_keeps_the_two_commands_and_ci_runs_them() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The two commands") :]
    commands = re.findall(r"^(bash scripts/\S+)$", section, flags=re.M)  # the fenced ```bash blocks
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"], commands
    for cmd in commands:
        assert (ROOT / cmd.split()[1]).is_file(), cmd
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^bash scripts/test\.sh\b", ci, flags=re.M), "CI calls the README's test command"
    assert re.search(r"^bash scripts/docs\.sh\b", ci, flags=re.M), "CI builds the site in strict mode"


def test_readme_links_and_the_site_agree() -> None:
    """The README's links to pages point at files that exist (the site renders the README as its home page)."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)\)", readme)
    assert len(links) >= 10, links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing
    assert "<!-- fakeviz:readme -->" in (DOCS / "index.md").read_text()


def test_strict_build_is_configured() -> None:
    conf = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^strict: true$", conf, flags=re.M)
    assert "execute: false" in conf  # the tutorials are rendered from their stored outputs, never run here
    assert "mkdocs build --strict" in (ROOT / "scripts" / "docs.sh").read_text()
