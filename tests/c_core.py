"""Building the recorder's C core for the tests: the one helper every test that needs it goes through.

A plain module (not ``conftest``): test modules import ``needs_core`` from here, and ``tests/conftest.py``
builds its ``c_core`` fixture on it. (``from conftest import ...`` would pick whichever of the folders'
``conftest.py`` files was imported last.)
"""

from __future__ import annotations

import shutil

import pytest

__all__ = ["build_core", "have_c_compiler", "needs_core"]


def have_c_compiler() -> bool:
    """A C compiler the recorder's core can be built with (``cc``, as ``fakeviz._engine.native`` calls it)."""
    return any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def build_core() -> str:
    """Build (or load from the cache) the recorder's C core; returns ``fakeviz._engine.native.status()``.

    Every test that needs the C core goes through here, so a build failure shows once, with the
    compiler's own message, instead of as a silent fallback to the Python recorder.
    """
    from fakeviz._engine import native

    native.core()
    return native.status()


needs_core = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler: the Python implementation records")
