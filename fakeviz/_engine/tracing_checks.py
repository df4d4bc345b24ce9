"""transformers' "are we tracing?" checks under a fake recording.

Note: [tracing checks under fake tensors]
transformers (5.x) asks ``is_tracing(tensor)`` before it reads a tensor's values to pick a branch, and
``is_tracing`` answers True for a FakeTensor (``transformers.utils.import_utils.is_fake_tensor``), as it
does under torch.compile, torch.export, jit and fx. Its other checks (``is_torchdynamo_compiling``,
``torch.compiler.is_compiling``, ``torch.jit.is_tracing``, ``is_torch_fx_proxy``) do not look at
FakeTensor: under a fake recording they answer what they answer in an eager run. So a fake run takes
the tracing branch only where ``is_tracing(fake)`` is asked:

* ``masking_utils._ignore_causal_mask_sdpa`` / ``_ignore_bidirectional_mask_sdpa`` (BART, and every
  model whose masks come from ``masking_utils``): a real run reads the padding mask and, when nothing is
  padded, gives SDPA no mask (``is_causal``); the tracing branch builds the [batch, 1, q, kv] mask.
* ``masking_utils.find_packed_sequence_indices``: a real run reads the position ids and, when no
  sequences are packed, builds no packed-sequence mask.
* ``modeling_utils.warn_if_padding_and_no_attention_mask`` (DeBERTa-v2 and most encoders): a real run
  reads ``input_ids[:, [-1, 0]]`` to warn about padding (index, eq, any, item); the tracing branch skips it.

While a fake recording runs, ``tracing_checks`` wraps ``is_fake_tensor`` so that a fake tensor of that
recording counts as "tracing" only when the fake run cannot take the eager branch:

* inside a real trace (``torch.compiler.is_compiling()`` / ``is_exporting()``, a ``TracingContext``:
  ``fakeviz.check_export`` runs torch.export under the recorder) the answer stays True, as torch.export
  needs;
* a fake tensor whose values the fake run knows (``FakeTensor.constant``, Note: [values under fake
  tensors]: a mask made by ``torch.ones``, ids from ``torch.tensor``) answers False: the eager branch
  runs, its value reads are answered from the known values, and the op log equals a real run's;
* otherwise the answer stays True (the branch that does not read values: for masks the one that builds
  them, an upper bound on memory) and the recording states it in ``fidelity()["assumptions"]``: where,
  and what a real run does there instead.

transformers imported after the recording started is wrapped when ``transformers.utils.import_utils``
loads (a ``sys.meta_path`` finder while the recording runs).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from . import patches as _patches

__all__ = ["tracing_checks", "BRANCH_OP"]

BRANCH_OP = "transformers.is_tracing"  # the op column of the assumption rows this module writes

# what a real run does instead, by the transformers function that asked
_EFFECT = {
    "_ignore_causal_mask_sdpa": (
        "a real run reads the padding mask here and, when no token is padded, gives SDPA no mask (is_causal): "
        "the fake run builds the [batch, 1, q, kv] mask (more ops and bytes; on CUDA a mask rules out the flash "
        "kernel)"
    ),
    "find_packed_sequence_indices": (
        "a real run reads the position ids here and, when no sequences are packed, builds no packed-sequence "
        "mask: the fake run builds it and masks by sequence (more ops)"
    ),
    "warn_if_padding_and_no_attention_mask": (
        "a real run reads input_ids[:, [-1, 0]] here to warn about padding (index, eq, any, item): the fake run "
        "skips those few ops; memory and the rest of the run are unchanged"
    ),
}
_EFFECT["_ignore_bidirectional_mask_sdpa"] = _EFFECT["_can_skip_bidirectional_mask_xpu"] = _EFFECT[
    "_ignore_causal_mask_sdpa"
]
_DEFAULT = "a real run reads the tensor's values here and may take another branch"


def _really_tracing() -> bool:
    """torch.compile, torch.export (also ``fakeviz.check_export``) or a tracing context is running."""
    return bool(torch.compiler.is_compiling() or torch._guards.TracingContext.try_get() is not None)


def _value_known(t: Any) -> bool:
    """Whether the fake run knows the values of fake tensor ``t`` (FakeTensorMode answers reads of them)."""
    return getattr(t, "constant", None) is not None


def _site(utils_file: str) -> tuple[str, str]:
    """(function, ``file:line in function``) of the transformers code that asked, past ``is_tracing``."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename in (utils_file, _patches.__file__):  # the registry's dispatcher
        f = f.f_back
    if f is None:
        return "?", "<unknown line>"
    code = f.f_code
    name = getattr(code, "co_qualname", code.co_name)
    path = code.co_filename
    for d in (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep):
        if d in path:
            path = path.rsplit(d, 1)[1]
            break
    return code.co_name, f"{path}:{f.f_lineno} in {name}"


@contextlib.contextmanager
def tracing_checks(mode: Any, state: Any) -> Iterator[None]:
    """Within a fake recording in ``mode``, answer transformers' ``is_fake_tensor`` as the Note says.

    ``state`` is the recorder's state: each tracing branch taken is listed with ``state.note_assumption``
    (a row of ``trace.meta["assumptions"]``, op ``BRANCH_OP``, shown by ``fidelity()["assumptions"]``).
    transformers imported during the recording (``fakeviz.models.build`` inside the block, a lazy import in
    the user's code) is wrapped when its ``import_utils`` loads.
    """
    restore: list[Any] = []

    def wrap(utils: Any) -> None:
        orig = getattr(utils, "is_fake_tensor", None)
        if orig is None:
            return
        utils_file = utils.__file__

        def is_fake_tensor(x: Any) -> bool:  # Note: [tracing checks under fake tensors]
            if not orig(x):
                return False
            if getattr(x, "fake_mode", None) is not mode or not state.active or _really_tracing():
                return True
            if _value_known(x):
                return False
            fn, where = _site(utils_file)
            state.note_assumption(
                BRANCH_OP,
                f"transformers took its tracing branch at {where} (values unknown): {_EFFECT.get(fn, _DEFAULT)}",
            )
            return True

        restore.append(_patches.push(utils, "is_fake_tensor", is_fake_tensor, entry="tracing-checks"))

    utils = sys.modules.get(_UTILS)
    finder = None
    if utils is not None:
        wrap(utils)
    else:
        finder = _patches.OnImport(_UTILS, wrap)
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for token in reversed(restore):
            _patches.pop(token)


_UTILS = "transformers.utils.import_utils"
