"""Note: [patch registry]: everything fakeviz changes in torch and transformers is declared, goes through the
registry, and is back to torch's own value after a record, after an error inside one, and after records in
other threads (in a fresh process, compared with the values from before ``import fakeviz``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fakeviz._engine import patches

# Every module or class fakeviz changes something of; the child process snapshots all their attributes.
OWNERS = [
    "torch", "torch.Tensor", "torch.UntypedStorage", "torch.utils", "torch._utils", "torch.autograd",
    "torch.nn.functional", "torch.cuda", "torch.cuda.memory", "torch.cuda.random", "torch.cuda.graphs",
    "torch.cuda.streams", "torch.cuda.amp.common", "torch.accelerator", "torch.accelerator.memory",
    "torch._subclasses.fake_tensor", "torch._subclasses.fake_tensor.FakeTensorMode",
    "torch.distributed.tensor._sharding_prop.ShardingPropagator", "transformers.utils.import_utils",
]  # fmt: skip

CHILD = textwrap.dedent(
    r"""
    import copy, json, sys, threading
    import torch, torch.nn.functional as F, transformers.utils.import_utils
    import torch.distributed.tensor._sharding_prop, torch.optim.optimizer, torch.utils._foreach_utils
    import torch._subclasses.fake_impls as fake_impls
    from importlib import import_module

    OWNERS = json.loads(sys.argv[1])

    def resolve(path):
        for i in range(len(path.split(".")), 0, -1):
            try:
                obj = import_module(".".join(path.split(".")[:i]))
            except ImportError:
                continue
            for part in path.split(".")[i:]:
                obj = getattr(obj, part)
            return obj

    KEEP = []  # keeps every snapshotted value alive, so `is` compares objects, never recycled ids

    def snap():
        out = {}
        for path in OWNERS:
            obj = resolve(path)
            if obj is None:
                continue
            name = f"{obj.__module__}.{obj.__qualname__}" if isinstance(obj, type) else obj.__name__  # as patches.where
            for k, v in list(vars(obj).items()):
                if name.endswith("FakeTensorMode") and k.startswith("cache_") and isinstance(v, int):
                    continue  # torch's own dispatch-cache counters (cache_hits, ...), counted on the class
                KEEP.append(v)
                out[f"{name}.{k}"] = v
        for i, lst in enumerate((sys.modules["torch.optim.optimizer"]._foreach_supported_types,
                                 sys.modules["torch.utils._foreach_utils"]._foreach_supported_types)):
            out[f"foreach-list-{i}"] = tuple(lst)
        for op, rule in list(fake_impls.op_implementations_dict.items()):
            out[f"fake-rule:{op}"] = rule
        for mode_cls, rule in list(import_module("torch._higher_order_ops.out_dtype").out_dtype.python_key_table.items()):
            out[f"out-dtype-rule:{mode_cls}"] = rule  # torchao-out-dtype: a rule for fakeviz's mode class
        return out

    def diff(a, b):
        keys = set(a) | set(b)
        return sorted(k for k in keys if k not in a or k not in b or (a[k] is not b[k] and a[k] != b[k]))

    for name in json.loads(sys.argv[2]):  # every other module `import fakeviz` loads: their own import-time changes
        try:                                # (torch._dynamo rebinding torch.manual_seed, ...) are not fakeviz's
            import_module(name)
        except Exception:
            pass
    before = snap()
    import fakeviz as fv
    from fakeviz._engine import patches
    report = {"import": diff(before, snap()), "import_active": patches.active()}
    clean = snap()

    def work(fail=False):
        with fv.record(device="cuda:0", gpu="A100") as trace:
            m = torch.nn.Linear(16, 16)
            q = torch.randn(1, 2, 8, 8)
            F.scaled_dot_product_attention(q, q, q)
            copy.deepcopy(m)
            opt = torch.optim.AdamW(m.parameters())
            m(torch.randn(4, 16)).sum().backward()
            opt.step()
            torch.cuda.get_device_capability(), torch.cuda.memory_allocated()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                m(torch.randn(2, 16))
            report.setdefault("during", diff(clean, snap()))
            report.setdefault("during_active", patches.active())
            if fail:
                raise KeyError("boom")
        return trace

    work()
    report["after_record"] = diff(clean, snap())
    try:
        work(fail=True)
    except KeyError:
        pass
    report["after_error"] = diff(clean, snap())
    t = threading.Thread(target=work)
    t.start(); t.join()
    report["after_thread"] = diff(clean, snap())
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    report["after_two_threads"] = diff(clean, snap())
    report["active_at_end"] = patches.active()
    print("REPORT" + json.dumps(report))
    """
)


LOADED = "import sys, json, fakeviz; print(json.dumps(sorted(m for m in sys.modules if not m.startswith('fakeviz'))))"


@pytest.fixture(scope="module")
def report() -> dict:
    env = dict(os.environ, FAKEVIZ_PURE_PYTHON=os.environ.get("FAKEVIZ_PURE_PYTHON", ""))
    loaded = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=600, env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    modules = loaded.stdout.strip().splitlines()[-1]
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(OWNERS), modules], capture_output=True, text=True,
                          timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("REPORT"))
    return json.loads(line[len("REPORT") :])


def _declared(scope: str | None = None) -> set[str]:
    return {k for k, e in patches.ENTRIES.items() if scope is None or e.scope == scope}


def test_import_changes_only_what_is_declared_for_import(report: dict) -> None:
    # the fallback probe and the fake rules, each through the registry
    assert {e for e, _, _ in report["import_active"]} == _declared("import") - {"cuda-shim"}
    changed = set(report["import"])
    assert changed, "import fakeviz changes the fake-rule table and the fallback probe"
    named = {
        f"fake-rule:{name}" if e == "fake-rules" else f"out-dtype-rule:{name}" if e == "torchao-out-dtype"
        else f"{owner}.{name}" for e, owner, name in report["import_active"]
    }  # fmt: skip
    assert changed == named


def test_a_record_changes_only_through_the_registry(report: dict) -> None:
    during = set(report["during"])
    entries = {e for e, _, _ in report["during_active"]}
    assert entries <= _declared()
    # everything the record changed in the owners is a change the registry made (and says so)
    by_registry = {f"{owner}.{name}" for _, owner, name in report["during_active"]}
    by_registry |= {"foreach-list-0", "foreach-list-1"} if "foreach-types" in entries else set()
    assert during - by_registry == set()
    # the record used each scope's patches: session, gpu-session (fake cuda answering as the A100), record
    for key in ("autograd-entry", "torch-cuda-leaves", "sdpa", "deepcopy", "foreach-types", "dtensor-shadow-prop"):
        assert key in entries, key
    assert "torch.cuda.get_device_capability" not in during  # above the leaves: torch's own code, unchanged


@pytest.mark.parametrize("when", ["after_record", "after_error", "after_thread", "after_two_threads"])
def test_everything_is_torchs_own_again(report: dict, when: str) -> None:
    assert report[when] == []
    assert {e for e, _, _ in report["active_at_end"]} <= _declared("import")


def test_pop_in_any_order_leaves_the_newest_change_in_force() -> None:
    class Owner:
        attr = "torch's own"

    patches.declare("test-stack", "tests.Owner", "attr", scope="record", by="tests", why="this test")
    try:
        first = patches.push(Owner, "attr", "first", entry="test-stack")
        second = patches.push(Owner, "attr", "second", entry="test-stack")
        patches.pop(first)  # an older change ends first (another thread's record): the newer stays
        assert Owner.attr == "second"
        third = patches.push(Owner, "attr", "third", entry="test-stack")
        patches.pop(third)
        assert Owner.attr == "second"
        patches.pop(second)
        assert Owner.attr == "torch's own" and "attr" in Owner.__dict__
        with pytest.raises(KeyError, match="not declared"):
            patches.push(Owner, "attr", "x", entry="no-such-entry")
        with pytest.raises(ValueError, match="declared twice"):
            patches.declare("test-stack", "tests.Owner", "attr", scope="record", by="tests", why="again")
    finally:
        del patches.ENTRIES["test-stack"]
