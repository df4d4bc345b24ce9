"""No test, tutorial, benchmark or doc calls a renamed public name: each old name still works and warns
``FakeVizDeprecationWarning`` for users (CONTRIBUTING's "A renamed public name"), so only the sources can show it is
still used. The suite keeps the user's warning filters (no suite-wide ``error::`` filter), so this reads the sources
rather than turning the warning into an error for every test."""

from __future__ import annotations

import re
from pathlib import Path

from fakeviz import views

REPO = Path(__file__).resolve().parents[2]
WHERE = ["tests", "notebooks", "docs", "benchmarks", "README.md", "CONTRIBUTING.md"]
SUFFIXES = {".py", ".md", ".ipynb"}
_OLD = "|".join(map(re.escape, views.RENAMED))
# a rename's own record (CONTRIBUTING: "`fakeviz.views.layer_tree` -> `layer_tree_figure`") names the old one, not a use
USES = re.compile(rf"\bviews\.({_OLD})\b(?!_)(?!`?\s*->)|from fakeviz\.views import [^\n]*\b({_OLD})\b(?!_)")


def _sources() -> list[Path]:
    out = []
    for name in WHERE:
        p = REPO / name
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES)
        out += [f for f in files if "node_modules" not in f.parts and f.resolve() != Path(__file__).resolve()]
    return out


def test_no_source_uses_an_old_name_of_views() -> None:
    found = [
        f"{f.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for f in _sources()
        for text in [f.read_text(errors="replace")]
        for m in USES.finditer(text)
    ]
    assert found == [], "renamed names still used (use the new name, views.RENAMED):\n" + "\n".join(found)


def test_the_scan_sees_an_old_name() -> None:
    assert USES.search("fig = fv.views.memory_timeline(trace)")
    assert USES.search("from fakeviz.views import layer_tree_figure, ops_table\n")
    assert not USES.search("fig = fv.views.memory_timeline_figure(trace)")
    assert not USES.search("Renamed (old -> new): `fakeviz.views.layer_tree` -> `layer_tree_figure`")
