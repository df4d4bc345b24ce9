"""The Chromium the browser tests drive (Debian's, through Playwright; never a downloaded one)."""

from __future__ import annotations

import pytest
from browser_util import launch  # tests/ is on sys.path under pytest


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (``browser_util.launch``: Debian's binary, no network)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()
