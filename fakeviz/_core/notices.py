"""Import-time notices of optional libraries, kept out of a user's cells and reports unless they ask.

Note: [import notices]
Building a transformers model imports transformers' quantizers, which import torchao and bitsandbytes when they
are installed. On a CPU build torchao logs "Failed to load ..._C_mxfp8...so" for each CUDA extension it cannot
load, and torch's pytree logs a deprecation notice for each of torchao's enums: red stderr in the first cell of
every notebook, about nothing the user did. :func:`quiet_import_notices` drops those loggers' records below
ERROR for its scope, on the thread that entered it only (another thread's records pass), and takes its filter
off on the way out: nothing outlives the scope. ``verbose=True`` (or the environment variable
``FAKEVIZ_VERBOSE`` set to anything but ``""``/``0``) keeps every notice. Errors always pass.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

__all__ = ["IMPORT_NOTICES", "quiet_import_notices", "verbose_requested"]

# the loggers that speak when transformers imports the optional libraries (Note: [import notices])
IMPORT_NOTICES = ("torchao", "bitsandbytes", "torch.utils._pytree")


def verbose_requested(verbose: bool = False) -> bool:
    """``verbose``, or the environment asks for it (``FAKEVIZ_VERBOSE`` set, not ``""`` or ``"0"``)."""
    return bool(verbose) or os.environ.get("FAKEVIZ_VERBOSE", "") not in ("", "0")


class _ThisThreadsNotices(logging.Filter):
    """Drops records below ERROR logged by the threads in scope."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[int, int] = {}  # thread ident -> open scopes

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or record.thread not in self.threads


_FILTER = _ThisThreadsNotices()
_LOCK = threading.Lock()
_VERBOSE = threading.local()  # .depth: open verbose scopes on this thread (a %%fake --verbose cell's model builds)


@contextlib.contextmanager
def quiet_import_notices(verbose: bool = False) -> Iterator[None]:
    """Within the block, this thread's import notices of :data:`IMPORT_NOTICES` are dropped (Note: [import
    notices]); with ``verbose`` (or ``FAKEVIZ_VERBOSE``) nothing changes, nor in the scopes it holds (a
    verbose ``%%fake`` cell's ``fv.models.build``). Scopes nest."""
    if verbose_requested(verbose):
        _VERBOSE.depth = getattr(_VERBOSE, "depth", 0) + 1
        try:
            yield
        finally:
            _VERBOSE.depth -= 1
        return
    if getattr(_VERBOSE, "depth", 0):
        yield
        return
    me = threading.get_ident()
    with _LOCK:
        if not _FILTER.threads:
            for name in IMPORT_NOTICES:
                logging.getLogger(name).addFilter(_FILTER)
        _FILTER.threads[me] = _FILTER.threads.get(me, 0) + 1
    try:
        yield
    finally:
        with _LOCK:
            left = _FILTER.threads.pop(me) - 1
            if left:
                _FILTER.threads[me] = left
            if not _FILTER.threads:
                for name in IMPORT_NOTICES:
                    logging.getLogger(name).removeFilter(_FILTER)
