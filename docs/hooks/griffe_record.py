"""A griffe extension for the API reference (mkdocs.yml: mkdocstrings' ``extensions``): ``fakeviz.record`` as Python
sees it.

``fv.record``'s signature and docstring are made at import from the engine's (Note: [one source for record's
signature] in ``fakeviz/_api.py``), so griffe's static reading sees ``record(**options)`` with no docstring. This
extension reads that one function by importing it (griffe's inspector) and gives the static object its parameters
and docstring; everything else stays static.
"""

from __future__ import annotations

from typing import Any

import griffe

#: the functions whose signature and docstring exist only at run time
DYNAMIC = ("fakeviz._api.record",)


class RuntimeSignatures(griffe.Extension):
    """Give each function of :data:`DYNAMIC` the parameters and docstring it has once imported."""

    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        if func.path not in DYNAMIC:
            return
        module, name = func.path.rsplit(".", 1)
        live = griffe.inspect(module)[name]
        func.parameters = live.parameters
        func.returns = live.returns
        if live.docstring is not None:
            func.docstring = griffe.Docstring(
                live.docstring.value, parent=func, parser=func.docstring.parser if func.docstring else None
            )
