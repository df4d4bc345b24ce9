"""An op that fails inside library code names the user's line, the library function it called and the
innermost library line (Note: [errors inside library code] in ``fakeviz/_engine/recorder/modules.py``).

``libdemo`` (tests/libdemo.py) stands in for an installed package (its file is excluded, as an installed
package's frames are library frames); the transformers cases call real transformers code.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import libdemo
import pytest
import torch

import fakeviz as fv

THIS = os.path.abspath(__file__)
LIB = os.path.abspath(libdemo.__file__)


def _line(path: str, marker: str) -> int:
    """The line number of the one line of code in ``path`` holding ``marker`` (lines quoting it are skipped)."""
    lines = Path(path).read_text().splitlines()
    hits = [i for i, text in enumerate(lines, 1) if marker in text and not ('"' in text or "'" in text)]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def test_value_needed_inside_a_library_names_the_call(recorder: str) -> None:
    with pytest.raises(fv.DataDependentError) as info:
        with fv.record(exclude=[LIB]) as trace:
            ids = torch.empty(2, 3, dtype=torch.long)  # values unknown to a fake run
            libdemo.Generator().generate(ids)  # USER-GENERATE
    assert trace.meta["recorder_core"] == recorder
    err = info.value
    user = f"{THIS}:{_line(THIS, 'USER-GENERATE')} in test_value_needed_inside_a_library_names_the_call"
    lines = str(err).splitlines()
    # the user's line and what went wrong first, then the user's source, the innermost library line and its source
    assert lines[0].startswith(
        f"op aten._local_scalar_dense.default (in Generator.generate of libdemo.py, called at {user}) "
        "needs the value of a tensor"
    )
    assert lines[1] == "    libdemo.Generator().generate(ids)  # USER-GENERATE"
    assert lines[2] == (
        f"  innermost: {LIB}:{_line(LIB, 'LIBDEMO-VALUE')} in Generator._prepare (phase init, module <top level>)"
    )
    assert lines[3] == "    n = int(ids.max())  # LIBDEMO-VALUE: a size read back from the values of a tensor"
    assert len(lines) <= 25
    assert (err.call, err.called_at) == ("Generator.generate", user)
    assert trace.error["call"] == "Generator.generate" and trace.error["called_at"] == user


@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_op_error_inside_a_library_is_noted_with_the_call(recorder: str, fake: bool) -> None:
    with pytest.raises(RuntimeError) as info:
        with fv.record(exclude=[LIB], fake=fake):
            libdemo.Generator().square(torch.ones(2, 3))  # USER-SQUARE
    note = "\n".join(getattr(info.value, "__notes__", []))
    user = f"{THIS}:{_line(THIS, 'USER-SQUARE')} in test_op_error_inside_a_library_is_noted_with_the_call"
    assert note.splitlines() == [
        f"fakeviz: raised by op aten.mm.default (in Generator.square of libdemo.py, called at {user})",
        "    libdemo.Generator().square(torch.ones(2, 3))  # USER-SQUARE",
        f"  innermost: {LIB}:{_line(LIB, 'LIBDEMO-MM')} in Generator._mm (phase init, module <top level>)",
        "    return x @ x  # LIBDEMO-MM: fails unless x is square",
    ]


def test_user_code_called_back_by_a_library_is_the_innermost_line(recorder: str) -> None:
    # the user's own function runs innermost: its line says it all, as for any user code
    def bad(x: torch.Tensor) -> torch.Tensor:
        return x @ x  # USER-CALLBACK

    with pytest.raises(RuntimeError) as info:
        with fv.record(exclude=[LIB]):
            libdemo.Generator().call_back(bad, torch.ones(2, 3))
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert note == (
        "fakeviz: raised by op aten.mm.default (phase init, module <top level>, "
        f"at {THIS}:{_line(THIS, 'USER-CALLBACK')} in bad)"
    )


def test_transformers_function_needing_a_value() -> None:
    from transformers.modeling_flash_attention_utils import _get_unpad_data

    with pytest.raises(fv.DataDependentError) as info:
        with fv.record():
            _get_unpad_data(torch.empty(2, 5, dtype=torch.int32))  # USER-UNPAD
    err = info.value
    assert err.call == "_get_unpad_data"
    assert err.called_at == f"{THIS}:{_line(THIS, 'USER-UNPAD')} in test_transformers_function_needing_a_value"
    lines = str(err).splitlines()
    assert lines[0].startswith("op aten.")
    assert ") needs the value of a tensor" in lines[0]
    assert f"(in _get_unpad_data of transformers, called at {err.called_at})" in lines[0]
    assert lines[1] == "    _get_unpad_data(torch.empty(2, 5, dtype=torch.int32))  # USER-UNPAD"
    # the innermost line is the line of _get_unpad_data that needed a value (nonzero or .item())
    body, first = inspect.getsourcelines(_get_unpad_data)
    m = re.fullmatch(
        r"  innermost: transformers/modeling_flash_attention_utils\.py:(\d+) in _get_unpad_data "
        r"\(phase init, module <top level>\)",
        lines[2],
    )
    assert m is not None, lines[2]
    at = int(m.group(1))
    assert first < at < first + len(body)
    assert lines[3] == "    " + body[at - first].strip()
    assert len(lines) <= 25


def test_transformers_forward_error_names_the_forward() -> None:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    with pytest.raises(RuntimeError) as info:
        with fv.record():
            m = GPT2LMHeadModel(cfg)
            m(torch.zeros(1, 4))  # USER-FLOAT-IDS: float token ids, embedding wants integers
    note = getattr(info.value, "__notes__", [])[-1].splitlines()
    user = f"{THIS}:{_line(THIS, 'USER-FLOAT-IDS')} in test_transformers_forward_error_names_the_forward"
    call = f"in GPT2LMHeadModel.forward of transformers, called at {user}"
    assert note[0] == f"fakeviz: raised by op aten.embedding.default ({call})"
    src = os.path.join(os.path.dirname(transformers.__file__), "models", "gpt2", "modeling_gpt2.py")
    assert note[2] == (
        f"  innermost: transformers/models/gpt2/modeling_gpt2.py:{_line(src, 'inputs_embeds = self.wte(input_ids)')} "
        "in GPT2Model.forward (phase forward, module GPT2LMHeadModel.transformer.wte)"
    )
