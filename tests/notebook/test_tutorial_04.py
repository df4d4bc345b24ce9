"""Tutorial 04 (meta versus fake): what it shows is true.

The notebook runs once (``nbrun.execute``, in the Binder-like environment). Its own definitions (``TinyLM``,
``Hybrid``, ``pack``) are taken from its cells and run here: on real CPU tensors (the reference), on meta tensors
(the crashes and the silences it shows), and under fake tensors. The figures it prints are checked against those
runs and against byte counts by hand.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from nbrun import cell, errors, execute, text

import fakeviz as fv
from fakeviz._engine.torch_compat import TORCH_VERSION

NB = "04_meta_vs_fake.ipynb"


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


@pytest.fixture(scope="module")
def ns() -> dict[str, Any]:
    """The notebook's own classes and functions (from the stored cells: the same source the run executed)."""
    import nbformat
    from nbrun import NB_DIR

    stored = nbformat.read(NB_DIR / NB, as_version=4)
    namespace: dict[str, Any] = {}
    exec("import torch\nfrom torch import nn\nimport pandas as pd", namespace)
    for start in ("class TinyLM(", "class Hybrid(", "def pack("):
        exec(cell(stored, start).source, namespace)
    return namespace


def _lines(out: str, prefix: str) -> list[str]:
    return [line[len(prefix) :].strip() for line in out.splitlines() if line.startswith(prefix)]


# ---------------------------------------------------------------------------------- sections 1-3: meta idioms
@pytest.mark.slow
def test_meta_model_and_checkpoint_have_the_real_shapes_on_meta(nb, ns, tmp_path: Path) -> None:
    real = ns["TinyLM"]()
    expected = [(k, tuple(t.shape), str(t.dtype)) for k, t in real.state_dict().items()]
    for start in ('with torch.device("meta"):\n    meta_model = TinyLM()', "torch.manual_seed(0)\nreal = TinyLM()"):
        out = text(cell(nb, start))
        rows = re.findall(r"^\d+\s+(\S+)\s+(\(.*?\))\s+(torch\.\w+)\s+(\w+)$", out, re.M)
        assert [(k, ast.literal_eval(s), d) for k, s, d, _ in rows] == expected, out
        assert {dev for *_, dev in rows} == {"meta"}
    assert "tied: True" in text(cell(nb, 'with torch.device("meta"):\n    meta_model = TinyLM()'))
    assert "torch.Size([2, 8, 100]) torch.float32 meta" in text(cell(nb, "logits = meta_model("))
    # the storage sharing the notebook reports, reproduced here on a checkpoint of the same model
    path = tmp_path / "tiny_lm.pt"
    torch.save(real.state_dict(), path)

    def shared(d: dict[str, torch.Tensor]) -> bool:
        return d["emb.weight"].untyped_storage() is d["head.weight"].untyped_storage()

    real_sd = torch.load(path, weights_only=True)
    meta_sd = torch.load(path, map_location="meta", weights_only=True)
    assert real_sd["emb.weight"].data_ptr() == real_sd["head.weight"].data_ptr()  # one storage on disk
    out = text(cell(nb, "def shared(d):"))
    assert f"real load: emb.weight and head.weight share a storage: {shared(real_sd)}" in out
    assert f"meta load: emb.weight and head.weight share a storage: {shared(meta_sd)}" in out
    assert shared(real_sd) and shared(meta_sd) == (TORCH_VERSION >= (2, 15))  # torch 2.15 keeps the tie on meta
    assert "meta data pointers: {0}" in out and {t.data_ptr() for t in meta_sd.values()} == {0}
    assert "tied after assign: False" in text(cell(nb, "result = meta_model.load_state_dict("))


@pytest.mark.slow
def test_to_empty_storages_are_those_of_a_real_to_empty(nb, ns) -> None:
    """One storage per parameter entry (the tie broken, as PyTorch's own to_empty does on the cpu), bytes as the
    real ones; after re-tying, the head's own copy is the one freed."""
    with torch.device("meta"):
        model = ns["TinyLM"]()
    model.to_empty(device="cpu")
    assert model.head.weight is not model.emb.weight
    real = sorted(p.untyped_storage().nbytes() for p in model.parameters())  # 4 entries, 4 storages
    out = text(cell(nb, 'with torch.device("meta"):\n    model = TinyLM()\nwith fv.record('))
    rows = re.findall(r"^\d+\s+\d+\s+cuda:0\s+(\d+)\s+(\w+)\s+(\S+)\s+(\d+)\s+(-?\d+)$", out, re.M)
    assert sorted(int(r[0]) for r in rows) == real == [64, 64, 6400, 6400]
    named = {r[2]: int(r[4]) for r in rows}
    assert named.pop("NaN") >= 0  # the orphaned head copy: freed
    assert set(named) == {"TinyLM.emb.weight|TinyLM.head.weight", "TinyLM.ln.weight", "TinyLM.ln.bias"}
    assert set(named.values()) == {-1}  # the parameters stay alive
    assert "logits: (2, 8, 100) cuda:0 | fake: True" in out
    assert "equal to the saved model: True" in text(
        cell(nb, 'with torch.device("meta"):\n    model = TinyLM()\nmodel.')
    )


# ---------------------------------------------------------------------------------------- section 4: devices
@pytest.mark.slow
def test_device_bug_is_silent_on_meta_and_raised_under_fake(nb, ns) -> None:
    hybrid_cls = ns["Hybrid"]
    out = hybrid_cls(first="meta", second="meta")(torch.randn(8, 64, device="meta"))  # no error on meta
    assert f"{out.shape} {out.device}" in text(cell(nb, "meta_hybrid = Hybrid("))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as info:
        with fv.fake_mode():
            hybrid_cls(first="cuda:0", second="cpu")(torch.randn(8, 64, device="cuda:0"))
    failed = cell(nb, "with fv.fake_mode():\n    hybrid = Hybrid(")
    assert "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu" in errors(
        failed
    )
    assert type(info.value).__name__ in errors(failed)


@pytest.mark.slow
def test_hybrid_memory_per_device_by_hand(nb) -> None:
    """cuda:0: fc1's weight and bias, the input, fc1's output and its relu; cpu: fc2's weight and bias, the copy
    of the hidden state and the output (float32)."""
    out = text(cell(nb, 'with fv.record(device="cuda:0") as trace:\n    hybrid = Hybrid('))
    f = 4
    cuda = (64 * 256 + 256) * f + 8 * 64 * f + 2 * 8 * 256 * f
    cpu = (256 * 10 + 10) * f + 8 * 256 * f + 8 * 10 * f
    assert f"cuda:0: peak {cuda:,} bytes" in out and f"cpu: peak {cpu:,} bytes" in out
    assert "output: (8, 10) cpu" in out
    assert re.search(rf"aten\._to_copy\.default\s+cpu\s+8, 256\s+{8 * 256 * f}$", out, re.M)


# ------------------------------------------------------------------------------------ section 5: storages
@pytest.mark.slow
def test_tied_weight_is_one_storage_and_the_write_is_on_the_view(nb, ns) -> None:
    real = ns["TinyLM"]()
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in real.parameters()}
    out = text(cell(nb, 'with fv.record(device="cuda:0") as trace:\n    fake_model = TinyLM()'))
    named = re.findall(r"^\d+\s+\d+\s+cuda:0\s+(\d+)\s+(TinyLM\.\S+)", out, re.M)
    assert sorted(int(n) for n, _ in named) == sorted(storages.values()) == [64, 64, 6400]
    assert ("6400", "TinyLM.emb.weight|TinyLM.head.weight") in named
    orphan = re.search(r"^\d+\s+\d+\s+cuda:0\s+6400\s+NaN\s+\d+\s+(-?\d+)$", out, re.M)
    assert orphan and int(orphan.group(1)) >= 0  # nn.Linear's own weight, replaced by the tie: freed
    rows = re.findall(r"^\d+\s+\d+\s+\d+\s+(aten\.\w+\.\w+)\s+(.+?)\s{2,}(.+?)\s+(-?\d+)\s+(\d+)$",
                      text(cell(nb, "trace.aliases(flat)")), re.M)  # fmt: skip
    assert [(op, shape, int(w)) for op, shape, _stride, _base, w in rows] == [
        ("aten.mm.default", "16, 100", 0),
        ("aten._unsafe_view.default", "2, 8, 100", 0),
        ("aten.view.default", "16, 100", 1),
        ("aten.view.default", "16, 100", 0),
    ]


# ------------------------------------------------------------------------------- section 6: data-dependent
@pytest.mark.slow
def test_meta_crash_really_happens(nb, ns) -> None:
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors") as info:
        ns["pack"](torch.tensor([3, 5, 2], device="meta"))
    failed = cell(nb, 'pack(torch.tensor([3, 5, 2], device="meta"))')
    assert f"RuntimeError: {info.value}" in text(failed)
    assert "width = int(lengths.max())" in errors(failed)


def _shown(out: str) -> dict[str, Any]:
    shape = re.search(r"^tokens: (\(.*?\)) (torch\.\w+) (\S+)$", out, re.M)
    return {
        "width": int(_lines(out, "width:")[0].split()[0]),
        "mask": ast.literal_eval(out.split("mask:")[1].splitlines()[0].replace("cuda:0", "").strip()),
        "shape": ast.literal_eval(shape.group(1)),
        "dtype": shape.group(2),
        "device": shape.group(3),
        "first": ast.literal_eval(_lines(out, "first token:")[0]) if "first token:" in out else None,
    }


@pytest.mark.slow
def test_fake_run_equals_a_real_cpu_run(nb, ns) -> None:
    """The values a fake run knows (the lengths, the mask, the CPU draw replayed from the seeded generator) and
    every shape and dtype equal a real CPU run of the notebook's ``pack``."""
    pack = ns["pack"]
    torch.manual_seed(0)
    width, mask, tokens = pack(torch.tensor([3, 5, 2]))
    real = {"width": width, "mask": mask.tolist(), "shape": tuple(tokens.shape), "dtype": str(tokens.dtype),
            "device": "cpu", "first": [round(v, 4) for v in tokens[0].tolist()]}  # fmt: skip
    assert real["shape"] == (sum([3, 5, 2]), 4)
    reference = _shown(text(cell(nb, "torch.manual_seed(0)\nshow(")))
    fake = _shown(text(cell(nb, "torch.manual_seed(0)\nwith fv.record() as dd:")))
    assert reference == real and fake == real
    assert "fake: True | assumptions: 0" in text(cell(nb, "torch.manual_seed(0)\nwith fv.record() as dd:"))
    on_cuda = _shown(text(cell(nb, 'with fv.record(device="cuda:0"):\n    width, mask, tokens')))
    assert on_cuda == {**real, "device": "cuda:0", "first": None}
    # every value, not only the first token the notebook prints: the fake run in this process
    torch.manual_seed(0)
    with fv.record():
        f_width, f_mask, f_tokens = pack(torch.tensor([3, 5, 2]))
        assert fv.is_fake(f_tokens)
        assert f_width == width and f_mask.tolist() == mask.tolist() and f_tokens.tolist() == tokens.tolist()


@pytest.mark.slow
def test_unknown_value_is_a_clear_error(nb, ns) -> None:
    with pytest.raises(fv.DataDependentError) as info:
        with fv.record(device="cuda:0"):
            ns["pack"](torch.randint(1, 9, (3,), device="cuda:0"))
    assert info.value.op == "aten._local_scalar_dense.default"
    out = text(cell(nb, 'with fv.record(device="cuda:0"):\n    pack(torch.randint('))
    assert "DataDependentError" in out and "width = int(lengths.max())" in out and "What to do" in out
