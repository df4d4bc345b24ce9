"""``fakeviz._engine.torch_compat`` (Note: [torch versions]): every version-dependent torch name fakeviz reads is
looked up there once; a name this torch lacks gives the guard's fallback or a clear statement, never an error.

These run on whatever torch is installed (the pinned 2.13 wheel, and the other versions of docs/torch_versions.md's table).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

import fakeviz as fv
from fakeviz._core.errors import FakeVizError
from fakeviz._engine import ctc, moe
from fakeviz._engine import torch_compat as tc
from fakeviz._engine.attention.choice import choose_backend
from fakeviz._engine.attention.common import SDPFlags
from fakeviz._engine.flops.formulas import sdpa_heads_broadcast
from fakeviz._frontends.parallel import rank_keys

_FSDP2 = "torch.distributed.fsdp.fully_shard"
_LOCAL_SHAPE = "torch.distributed.tensor._utils._compute_local_shape_and_global_offset"


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _pretend_missing(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make ``name`` look absent from this torch (its lookup is cached in the module: change the cache)."""
    monkeypatch.delitem(tc._FOUND, name, raising=False)
    monkeypatch.setitem(tc._ABSENT, name, "AttributeError: simulated")


def test_installed_torch_is_supported_and_parsed() -> None:
    assert tc.TORCH_VERSION == _version(torch.__version__)
    assert tc.TORCH_VERSION >= tc.MIN_TORCH, f"torch {torch.__version__} is below fakeviz's minimum {tc.MIN_TORCH}"
    assert tc._version("2.12.0+cu130") == (2, 12) and tc._version("2.10.0a0+git1234") == (2, 10)
    # one minimum: what pip enforces (pyproject.toml) is what the code states
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"torch>={tc.MIN_TORCH[0]}.{tc.MIN_TORCH[1]}",' in pyproject


@pytest.mark.parametrize("name", sorted(tc.GUARDS))
def test_every_guarded_name_resolves_or_is_stated_missing(name: str) -> None:
    guard = tc.GUARDS[name]
    found = tc.lookup(name)
    if tc.TORCH_VERSION >= _version(guard.since):
        assert found is not None, f"{name}: torch {torch.__version__} should have it (since {guard.since})"
        assert name not in tc.missing()
    else:
        assert found is None, f"{name}: found on torch {torch.__version__}, older than its 'since' {guard.since}"
        said = tc.missing()[name]
        assert name in said and torch.__version__ in said and f"torch >= {guard.since}" in said
        assert guard.without in said


def test_a_missing_op_is_none_and_stated_not_raised() -> None:
    assert tc.op_or_none("_fakeviz_no_such_op") is None
    assert tc.op_or_none("_fakeviz_no_such_op.default") is None
    assert tc.op_or_none("mm.default") is torch.ops.aten.mm.default
    assert tc.op_or_none("aten.mm") is torch.ops.aten.mm
    said = tc.missing()
    assert said["aten._fakeviz_no_such_op"] == f"aten._fakeviz_no_such_op is not in torch {torch.__version__}"
    assert tc.lookup("torch._C._fakeviz_no_such_function") is None
    assert tc.lookup("torch.distributed._fakeviz_no_such_module.thing") is None


def test_require_names_the_torch_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tc.require("torch._C._get_dispatch_mode") is torch._C._get_dispatch_mode
    with pytest.raises(tc.TorchVersionError, match=r"needs a newer torch \(torch\._C\._fakeviz_nothing\)"):
        tc.require("torch._C._fakeviz_nothing")
    _pretend_missing(monkeypatch, _FSDP2)
    with pytest.raises(FakeVizError) as err:
        tc.require(_FSDP2)
    msg = str(err.value)
    assert "needs torch >= 2.6" in msg and torch.__version__ in msg and "fakeviz supports torch >= 2." in msg


def test_plan_with_fsdp2_on_a_torch_without_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_missing(monkeypatch, _FSDP2)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4)  # fmt: skip
    with pytest.raises(tc.TorchVersionError, match=r"plan\(parallel=\.\.\.\) with dp_shard / dp_replicate needs torch"):
        fv.plan(cfg, gpus="2xH100", parallel={"dp_shard": 2}, batch=1, seq=8)


def test_rank_keys_without_the_local_shape_helper_record_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.tensor import Shard

    layouts = [((7, 4), ("dp_shard",), (4,), (Shard(0),))]
    keys = rank_keys(layouts, (4,), ("dp_shard",))
    assert keys == {0: ((2, 4),), 1: ((2, 4),), 2: ((2, 4),), 3: ((1, 4),)}  # two layouts: ranks 1, 2 stand in
    _pretend_missing(monkeypatch, _LOCAL_SHAPE)
    assert rank_keys(layouts, (4,), ("dp_shard",)) == {0: 0, 1: 1, 2: 2, 3: 3}  # no helper: every rank recorded


def test_sdpa_switches_and_order_without_torch_c(monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.empty(1, 8, 128, 64, device="meta", dtype=torch.bfloat16)
    order = tc.sdp_priority_order()
    if tc.lookup("torch._C._get_sdp_priority_order") is not None:
        assert order == tuple(torch._C._get_sdp_priority_order())
    h100 = choose_backend(q, q, q, is_causal=True)
    a100 = choose_backend(q, q, q, is_causal=True, capability=(8, 0))
    assert list(h100[1]) == ["cudnn", "flash", "efficient"] and list(a100[1]) == ["flash", "efficient"]
    monkeypatch.setattr(tc, "_FA3", None)
    monkeypatch.setattr(tc, "_OVERRIDEABLE", None)
    monkeypatch.setattr(tc, "_PRIORITY", None)
    assert tc.sdp_priority_order() is None
    flags = SDPFlags.current()
    assert flags.fa3 is False and flags.overrideable is False and SDPFlags.only("flash").fa3 is False
    # the build's default order is what a torch without _get_sdp_priority_order runs: the same choices
    assert choose_backend(q, q, q, is_causal=True) == h100
    assert choose_backend(q, q, q, is_causal=True, capability=(8, 0)) == a100


def test_fake_rules_are_installed_exactly_for_the_ops_this_torch_has() -> None:
    from torch._subclasses import fake_impls

    table = fake_impls.op_implementations_dict
    names = [f"aten.{p}.{o}" for p in ("_use_cudnn_ctc_loss", "_cudnn_ctc_loss", "_use_miopen_ctc_loss",
                                       "_ctc_loss_backward") for o in ("default", "Tensor")]  # fmt: skip
    for rule_ops, candidates in ((ctc.FAKE_RULE_OPS, names), (moe.FAKE_RULE_OPS, ["aten._grouped_mm.default"])):
        for name in candidates:
            op = tc.op_or_none(name)
            assert (name in rule_ops) == (op is not None), name
            if op is not None:
                assert getattr(table.get(op), "_fakeviz_rule", False), f"{name}: no fakeviz rule installed"
    miopen = tc.op_or_none("_use_miopen_ctc_loss")
    assert (miopen is None) == (tc.TORCH_VERSION < (2, 11))


def test_gqa_attention_flops_count_at_the_query_heads() -> None:
    """Grouped-query SDPA: torch < 2.12's formulas assert equal heads (the op got 0 FLOPs on 2.10 and 2.11)."""
    b, h, s, d = 1, 8, 64, 32
    expected = 4 * b * h * s * s * d  # q @ k^T and scores @ v, at the query's heads
    totals = []
    for kv_heads, gqa in ((2, True), (h, False)):
        with fv.record(device="cpu") as t:
            q, k = torch.randn(b, h, s, d), torch.randn(b, kv_heads, s, d)
            torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=gqa)
        totals.append(sum(t.flops().values()))
    assert totals == [expected, expected]

    def equal_heads_only(args: tuple, kwargs: dict | None, out: object) -> int:  # as torch 2.10's sdpa_flop_count
        qs, ks = args[0].shape, tuple(args[1].shape) if isinstance(args[1], torch.Tensor) else args[1]
        assert qs[1] == ks[1], "sdpa_flop_count: query/key/value shapes are incompatible"
        return 4 * qs[0] * qs[1] * qs[2] * ks[2] * qs[3]

    q, k = torch.empty(b, h, s, d, device="meta"), torch.empty(b, 2, s, d, device="meta")
    with pytest.raises(AssertionError):
        equal_heads_only((q, k, k), None, None)
    assert sdpa_heads_broadcast(equal_heads_only, 0)((q, k, k), None, None) == expected
    assert sdpa_heads_broadcast(equal_heads_only, 1)((q, q, k, k), None, None) == expected
