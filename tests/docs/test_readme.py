"""The README's code blocks run, as written (issue 41): ``tests/docs/test_examples.py`` runs them as it runs the docs
pages' (one reader per page, the blocks in order, the user's defaults). A file of their own: pytest-xdist's
``--dist loadfile`` keeps a file on one worker, and the README's blocks (a 70B step, a 70B plan on 64 GPUs, a fit
search, a 405B report) take minutes, which the docs pages' blocks now share with another worker."""

from __future__ import annotations

import pytest
from test_examples import README, blocks, close_readers, run_block


@pytest.fixture(scope="module", autouse=True)
def _close_readers():
    yield
    close_readers([README])


@pytest.mark.parametrize(("page", "index"), blocks([README]))
def test_block_runs(page: str, index: int) -> None:
    run_block(page, index)
