"""A stand-in for an installed library, for ``tests/engine/test_library_errors.py``.

Its frames count as library frames when a recording excludes this file (``exclude=[libdemo.__file__]``),
as an installed package's do (Note: [errors inside library code] in ``fakeviz/_engine/recorder/modules.py``):
``Generator.generate`` is wrapped by a decorator, as ``GenerationMixin.generate`` is, and a private helper
two calls down reads a tensor's value back, as transformers' ``_prepare_special_tokens`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def _logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


class Generator:
    @_logged
    def generate(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids + 1
        return self._prepare(ids)

    def _prepare(self, ids: torch.Tensor) -> torch.Tensor:
        n = int(ids.max())  # LIBDEMO-VALUE: a size read back from the values of a tensor
        return ids.new_zeros(n)

    def square(self, x: torch.Tensor) -> torch.Tensor:
        return self._mm(x)

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        return x @ x  # LIBDEMO-MM: fails unless x is square

    def call_back(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return fn(x * 2)
