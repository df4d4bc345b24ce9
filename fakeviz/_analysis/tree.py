"""The layer tree: one row per module with its figures, and a folded view of repeated blocks.

Pure functions of a :class:`~fakeviz._core.record.Record`. Every figure of a module is
*inclusive*: it covers the module and everything below it, so a parent's figure
is never smaller than a child's and a treemap can size boxes by it.

Figures
-------
params, param_bytes, buffer_bytes
    parameters (elements) and bytes of parameters and buffers in the subtree.
    A tensor reachable under several names (tied weights) counts once in any
    subtree that holds it; ``tied`` marks modules holding such a tensor and
    ``tied_with`` names the other places it lives. Per device and dtype bytes
    are in ``param_bytes:<device>:<dtype>`` and ``buffer_bytes:<device>:<dtype>`` columns.
act_bytes, act_saved_bytes
    bytes of the storages created by forward ops in the subtree, and of those
    the part autograd saved for backward (category Activation).
precision
    the precision of the module's weights as users say it (``"bf16"``, ``"nf4+dq"``, ``"int8 weight-only"``,
    ``"gptq int4"``: Note: [weight precision] in :mod:`fakeviz._engine.precision`): its own weights' if it has
    any and no child with weights, the one its subtree shares, else ``"mixed"``; a layer that LoRA wraps
    (children ``base_layer`` and ``lora_A``) reads ``"nf4 + LoRA bf16"`` (``DoRA`` with a magnitude vector);
    ``""``: no weights. Records made before it was recorded read each module's parameter dtypes.
grad_bytes, opt_bytes
    bytes of the gradients of the subtree's parameters, and of the optimizer
    state kept for them (each storage once).
flops_fwd, flops_bwd, ops_fwd, ops_bwd, unknown_flop_ops
    FLOPs (``fakeviz._engine.flops``) and op counts of forward and backward ops
    attributed to the subtree; ops without a FLOP formula count as 0 in the sums
    and are counted in ``unknown_flop_ops``.

Folding
-------
Siblings whose names are integers (the children of a ModuleList/Sequential)
and whose *structure* is identical (class, parameter and buffer names, shapes
and dtypes, and recursively the same for their children) fold into one row,
``layers.0-79 x80``, whose figures are the sums over its members: no figure is
lost in the fold. Siblings whose structure differs from the most common one
among their numbered siblings are flagged ``odd`` (an MoE layer among dense
ones) and fold only with their own kind (``layers.3,17 x2``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from .._core.record import Record
from .._core.schema import PHASES, dtype_abbr
from .._engine.precision import dtype_label
from .categories import C_ACT, storage_categories

__all__ = ["FIGURES", "fold_modules", "folded_modules", "module_table", "modules", "own_precision", "weight_precisions"]

FIGURES = (
    "params",
    "param_bytes",
    "buffer_bytes",
    "act_bytes",
    "act_saved_bytes",
    "grad_bytes",
    "opt_bytes",
    "flops_fwd",
    "flops_bwd",
    "ops_fwd",
    "ops_bwd",
    "unknown_flop_ops",
)
_FWD, _BWD = PHASES.index("forward"), PHASES.index("backward")


def _structure(trace: Record) -> tuple[list[str], list[int], list[list[int]]]:
    """Module paths, parent ids (-1 root) and children ids, in table order."""
    paths = trace.strings("modules")
    ids = {p: i for i, p in enumerate(paths)}
    parent = []
    children: list[list[int]] = [[] for _ in paths]
    for i, p in enumerate(paths):
        j = -1
        if "." in p:
            j = ids.get(p.rsplit(".", 1)[0], -1)
        parent.append(j)
        if j >= 0:
            children[j].append(i)
    return paths, parent, children


def _ancestors(parent: list[int]) -> list[list[int]]:
    """For each module, itself and every ancestor."""
    out: list[list[int]] = []
    for i in range(len(parent)):
        chain = []
        j = i
        while j >= 0 and len(chain) <= len(parent):
            chain.append(j)
            j = parent[j]
        out.append(chain)
    return out


def own_precision(trace: Record) -> list[str | None]:
    """Each module's own weights' precision (None: none of its own), in the module table's order.

    From ``meta["weight_precision"]`` (module path -> label, written by the recorder; read as data: a label that is
    not a string is ignored); a record without it (made before it existed) reads each module's own parameters'
    dtypes, those named ``*weight`` first, as the recorder would for plain tensors.
    """
    paths = trace.strings("modules")
    labels = trace.meta.get("weight_precision")
    if isinstance(labels, dict):
        return [v[:80] if isinstance(v := labels.get(p), str) and v else None for p in paths]
    c, s = trace.columns(), trace.string_tables()
    names, dtypes = s["names"], s["dtypes"]
    by_mod: dict[int, dict[str, str]] = defaultdict(dict)
    for m, nid, dt, kind in zip(c["p_module"].tolist(), c["p_name"].tolist(), c["p_dtype"].tolist(),
                                c["p_kind"].tolist()):  # fmt: skip
        if kind == 0 and 0 <= m < len(paths):
            by_mod[m][names[nid].rsplit(".", 1)[-1]] = dtypes[dt] if 0 <= dt < len(dtypes) else "?"
    out: list[str | None] = [None] * len(paths)
    for m, params in by_mod.items():
        weights = {k: v for k, v in params.items() if k.endswith("weight")} or params
        out[m] = _one({dtype_label(v) for v in weights.values()})
    return out


_ADAPTERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


def _subtree_precision(paths: list[str], children: list[list[int]], own: list[str | None]) -> list[str]:
    """The ``precision`` column (module docstring), deepest modules first."""
    out = [""] * len(paths)
    for i in sorted(range(len(paths)), key=lambda i: -paths[i].count(".")):
        kids = {paths[ch].rsplit(".", 1)[-1]: ch for ch in children[i]}
        found = {x for x in (own[i], *(out[ch] for ch in children[i])) if x}
        adapters = {out[kids[k]] for k in _ADAPTERS if k in kids} - {""}
        if "base_layer" in kids and adapters and own[i] is None:  # peft's LoRA layer (Note: [weight precision])
            mag = kids.get("lora_magnitude_vector")
            kind = "DoRA" if mag is not None and out[mag] else "LoRA"
            out[i] = f"{out[kids['base_layer']] or '?'} + {kind} {_one(adapters)}"
        elif found:
            out[i] = _one(found)
    return out


def module_table(trace: Record) -> Any:
    """The layer tree as a pandas DataFrame, one row per module (see the module docstring)."""
    import pandas as pd

    paths, parent, children = _structure(trace)
    n = len(paths)
    anc = _ancestors(parent)
    c = trace.columns()
    s = trace.string_tables()
    classes = s["classes"]
    mod_class = c["mod_class"].tolist()
    cats = storage_categories(trace)
    st_nbytes = np.maximum(c["st_nbytes"], 0)

    # ---- parameters and buffers: each tensor once per subtree
    p_mod, p_tensor = c["p_module"].tolist(), c["p_tensor"].tolist()
    p_numel, p_nb, p_kind = c["p_numel"].tolist(), c["p_nbytes"].tolist(), c["p_kind"].tolist()
    p_dev, p_dt, p_name = c["p_device"].tolist(), c["p_dtype"].tolist(), c["p_name"].tolist()
    p_grad = c["p_grad"].tolist()
    names = s["names"]
    devices, dtypes = s["devices"], s["dtypes"]
    names_of_tensor: dict[int, list[str]] = defaultdict(list)
    for r in range(len(p_mod)):
        names_of_tensor[p_tensor[r]].append(names[p_name[r]])
    seen_t: list[set[int]] = [set() for _ in range(n)]
    params = np.zeros(n, np.int64)
    pbytes = np.zeros(n, np.int64)
    bbytes = np.zeros(n, np.int64)
    by_dd: dict[str, np.ndarray] = {}
    tied_with: list[set[str]] = [set() for _ in range(n)]
    grad_storages: list[set[int]] = [set() for _ in range(n)]
    owner_modules: dict[int, list[int]] = defaultdict(list)  # param tensor id -> modules holding it
    for r in range(len(p_mod)):
        m, t = p_mod[r], p_tensor[r]
        if m < 0 or m >= n:
            continue
        others = [x for x in names_of_tensor[t] if x != names[p_name[r]]]
        for a in anc[m]:
            if others:
                tied_with[a].update(x for x in others if not x.startswith(paths[a] + "."))
            if t in seen_t[a]:
                continue
            seen_t[a].add(t)
            owner_modules[t].append(a)
            nb = max(p_nb[r], 0)
            if p_kind[r] == 0:
                params[a] += max(p_numel[r], 0)
                pbytes[a] += nb
                key = f"param_bytes:{devices[p_dev[r]]}:{_short_dtype(dtypes[p_dt[r]])}"
                col = by_dd.setdefault(key, np.zeros(n, np.int64))
                col[a] += nb
                if p_grad[r] >= 0:
                    grad_storages[a].add(p_grad[r])
            else:
                bbytes[a] += nb
                key = f"buffer_bytes:{devices[p_dev[r]]}:{_short_dtype(dtypes[p_dt[r]])}"
                col = by_dd.setdefault(key, np.zeros(n, np.int64))
                col[a] += nb
    grad = np.array([int(st_nbytes[list(g)].sum()) if g else 0 for g in grad_storages], np.int64)

    # ---- optimizer state: storages owned by a parameter tensor
    opt_storages: list[set[int]] = [set() for _ in range(n)]
    owner = c["st_owner"]
    opt_sel = np.flatnonzero((owner >= 0) & (cats == 3))  # C_OPT
    for sid in opt_sel.tolist():
        for a in owner_modules.get(int(owner[sid]), ()):
            opt_storages[a].add(sid)
    opt = np.array([int(st_nbytes[list(g)].sum()) if g else 0 for g in opt_storages], np.int64)

    # ---- ops: counts and FLOPs by phase, attributed to module then summed up the tree
    mod = c["module"].astype(np.int64)
    phase = c["phase"]
    flops = c["flops"]
    own = {}
    for key, sel in (("fwd", phase == _FWD), ("bwd", phase == _BWD)):
        ok = sel & (mod >= 0)
        own[f"ops_{key}"] = np.bincount(mod[ok], minlength=n)[:n]
        own[f"flops_{key}"] = np.bincount(mod[ok], weights=np.maximum(flops[ok], 0), minlength=n)[:n]
    ok = (mod >= 0) & ((phase == _FWD) | (phase == _BWD)) & (flops < 0)
    own["unknown_flop_ops"] = np.bincount(mod[ok], minlength=n)[:n]

    # ---- activations: storages created by forward ops of the module
    alloc = c["st_alloc"]
    n_ops = len(phase)
    made = (alloc >= 0) & (alloc < n_ops)
    a_idx = np.flatnonzero(made)
    a_ops = alloc[a_idx]
    fwd = (phase[a_ops] == _FWD) & (mod[a_ops] >= 0)
    a_idx, a_mod = a_idx[fwd], mod[a_ops[fwd]]
    own["act_bytes"] = np.bincount(a_mod, weights=st_nbytes[a_idx], minlength=n)[:n]
    saved = cats[a_idx] == C_ACT
    own["act_saved_bytes"] = np.bincount(a_mod[saved], weights=st_nbytes[a_idx][saved], minlength=n)[:n]

    order = sorted(range(n), key=lambda i: -len(anc[i]))  # deepest first: add each to its parent
    incl = {}
    for key, arr in own.items():
        acc = np.asarray(arr, dtype=np.float64).copy()
        for i in order:
            if parent[i] >= 0:
                acc[parent[i]] += acc[i]
        incl[key] = acc.astype(np.int64)

    df = pd.DataFrame(
        {
            "module": np.arange(n, dtype=np.int64),
            "path": paths,
            "name": [p.rsplit(".", 1)[-1] for p in paths],
            "parent": [paths[j] if j >= 0 else None for j in parent],
            "class": [classes[k] if 0 <= k < len(classes) else "" for k in mod_class],
            "depth": [len(a) - 1 for a in anc],
            "n_children": [len(ch) for ch in children],
            "params": params,
            "param_bytes": pbytes,
            "buffer_bytes": bbytes,
            "tied": [bool(t) for t in tied_with],
            "tied_with": ["|".join(sorted(t)) for t in tied_with],
            "precision": _subtree_precision(paths, children, own_precision(trace)),
            "act_bytes": incl["act_bytes"],
            "act_saved_bytes": incl["act_saved_bytes"],
            "grad_bytes": grad,
            "opt_bytes": opt,
            "flops_fwd": incl["flops_fwd"],
            "flops_bwd": incl["flops_bwd"],
            "ops_fwd": incl["ops_fwd"],
            "ops_bwd": incl["ops_bwd"],
            "unknown_flop_ops": incl["unknown_flop_ops"],
            **dict(sorted(by_dd.items())),
        }
    )
    return df


def _short_dtype(dt: str) -> str:
    return dtype_abbr(dt, strip=True)


# ------------------------------------------------------------------ folding
def _signatures(trace: Record, children: list[list[int]], paths: list[str]) -> list[str]:
    """A structural signature per module (class, parameters, children), bottom-up."""
    c, s = trace.columns(), trace.string_tables()
    classes = s["classes"]
    mod_class = c["mod_class"].tolist()
    names, shapes, dtypes = s["names"], s["shapes"], s["dtypes"]
    own: dict[int, list[str]] = defaultdict(list)
    for m, nid, sh, dt, k in zip(
        c["p_module"].tolist(), c["p_name"].tolist(), c["p_shape"].tolist(), c["p_dtype"].tolist(),
        c["p_kind"].tolist(),
    ):  # fmt: skip
        own[m].append(f"{'pb'[k]}:{names[nid].rsplit('.', 1)[-1]}:{shapes[sh]}:{dtypes[dt]}")
    precision = own_precision(trace)  # layers quantized differently never fold together
    sig: list[str] = [""] * len(paths)
    intern: dict[str, str] = {}
    for i in sorted(range(len(paths)), key=lambda i: -paths[i].count(".")):
        kids = []
        for ch in children[i]:
            name = paths[ch].rsplit(".", 1)[-1]
            kids.append(("#" if name.isdigit() else name) + "=" + sig[ch])
        cls = classes[mod_class[i]] if 0 <= mod_class[i] < len(classes) else ""
        full = f"{cls}({','.join(sorted(own.get(i, [])))})[{';'.join(kids)}]"
        if precision[i] is not None:
            full += f"<{precision[i]}>"
        sig[i] = intern.setdefault(full, f"s{len(intern)}")
    return sig


def _one(labels: set[str]) -> str:
    """The label members share, else ``"mixed"``."""
    return next(iter(labels)) if len(labels) == 1 else "mixed"


def _ranges(nums: list[int]) -> str:
    out = []
    start = prev = nums[0]
    for x in nums[1:]:
        if x == prev + 1:
            prev = x
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        start = prev = x
    out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(out)


def fold_modules(trace: Record, table: Any = None) -> Any:
    """The layer tree with repeated numbered siblings folded (see the module docstring).

    One row per folded node: ``path`` (e.g. ``Llama.model.layers.0-79``), ``name``
    (``0-79 x80``), ``parent``, ``class``, ``depth``, ``count`` (modules folded into
    it; for a fold inside a fold, members of every copy), ``odd``, ``members``
    (the original paths, ``|``-joined) and every figure of :data:`FIGURES` summed
    over the members.
    """
    import pandas as pd

    if table is None:
        table = module_table(trace)
    paths, parent, children = _structure(trace)
    sig = _signatures(trace, children, paths)
    fig = {k: table[k].to_numpy() for k in FIGURES}
    cls = table["class"].tolist()
    tied = table["tied"].to_numpy()
    precision = table["precision"].tolist()
    rows: list[dict[str, Any]] = []

    def emit(members: list[int], label: str, name: str, parent_label: str | None, depth: int, odd: bool) -> None:
        row = {
            "path": label,
            "name": name,
            "parent": parent_label,
            "class": cls[members[0]],
            "depth": depth,
            "count": len(members),
            "odd": odd,
            "members": "|".join(paths[m] for m in members),
            "tied": bool(tied[members].any()),
            "precision": _one({precision[m] for m in members}),
        }
        for k, arr in fig.items():
            row[k] = int(arr[members].sum())
        rows.append(row)
        rep = members[0]
        # children, matched by local name across the members (same structure => same names)
        kids = [paths[ch].rsplit(".", 1)[-1] for ch in children[rep]]
        by_member = [{paths[ch].rsplit(".", 1)[-1]: ch for ch in children[m]} for m in members]
        numbered = [k for k in kids if k.isdigit()]
        common = Counter(sig[children[rep][kids.index(k)]] for k in numbered).most_common(1)
        major = common[0][0] if common else None
        done: set[str] = set()
        for k in kids:
            if k in done:
                continue
            if k.isdigit():
                s = sig[children[rep][kids.index(k)]]
                group = [x for x in numbered if sig[children[rep][kids.index(x)]] == s]
                done.update(group)
                sub = [bm[x] for x in group for bm in by_member]
                rng = _ranges([int(x) for x in group])
                name = rng + (f" x{len(group)}" if len(group) > 1 else "")
                emit(sub, f"{label}.{rng}", name, label, depth + 1, s != major)
            else:
                done.add(k)
                emit([bm[k] for bm in by_member], f"{label}.{k}", k, label, depth + 1, False)

    for i, p in enumerate(paths):
        if parent[i] < 0:
            emit([i], p, p, None, 0, False)
    return pd.DataFrame(rows)


def _kind(cls: str) -> str:
    """A module class as a kind of weight: ``Linear4bit`` -> ``"linear"``, ``LlamaRMSNorm`` -> ``"norm"``."""
    low = cls.lower()
    for key in ("embedding", "linear", "norm", "conv"):
        if key in low:
            return key
    return cls or "module"


def _weight_precisions(trace: Record) -> list[dict[str, Any]]:
    paths = trace.strings("modules")
    own = own_precision(trace)
    c, s = trace.columns(), trace.string_tables()
    classes = s["classes"]
    mod_class = c["mod_class"].tolist()
    numel: dict[int, int] = defaultdict(int)
    nbytes: dict[int, int] = defaultdict(int)
    seen: set[int] = set()
    for m, t, n, b, kind in zip(c["p_module"].tolist(), c["p_tensor"].tolist(), c["p_numel"].tolist(),
                                c["p_nbytes"].tolist(), c["p_kind"].tolist()):  # fmt: skip
        if kind == 0 and t not in seen:  # a tied weight once, in the first module holding it
            seen.add(t)
            numel[m] += max(n, 0)
            nbytes[m] += max(b, 0)
    groups: dict[str, dict[str, Any]] = {}
    for i, label in enumerate(own):
        if label is None:
            continue
        parts = paths[i].split(".")
        at = next((j for j, x in enumerate(parts) if x in _ADAPTERS or x == "lora_magnitude_vector"), None)
        key = f"LoRA {label}" if at is not None else label
        g = groups.setdefault(key, {"precision": key, "modules": 0, "params": 0, "param_bytes": 0, "_kinds": {},
                                    "_layers": set()})  # fmt: skip
        g["modules"] += 1
        g["params"] += numel.get(i, 0)
        g["param_bytes"] += nbytes.get(i, 0)
        if at is not None:
            g["_layers"].add(".".join(parts[:at]))
        else:
            cls = classes[mod_class[i]] if 0 <= i < len(mod_class) and 0 <= mod_class[i] < len(classes) else ""
            g["_kinds"].setdefault(_kind(cls), []).append(parts[-1] if len(parts) > 1 else "")  # a root: its class
    rows = []
    for g in groups.values():
        if g["_layers"]:
            kinds = f"{len(g['_layers'])} adapted layers"
        else:
            by = sorted(g["_kinds"].items(), key=lambda kv: -len(kv[1]))
            kinds = ", ".join(names[0] if len(names) == 1 and names[0] and not names[0].isdigit()
                              else f"{len(names)} {kind}" for kind, names in by)  # fmt: skip
        rows.append({k: v for k, v in g.items() if not k.startswith("_")} | {"kinds": kinds})
    return sorted(rows, key=lambda r: -r["param_bytes"])


def weight_precisions(trace: Record) -> list[dict[str, Any]]:
    """The precisions the weights are in, most parameter bytes first: one dict per precision (LoRA adapters
    apart, ``"LoRA bf16"``) with ``modules`` (how many hold weights in it), ``params`` and ``param_bytes`` (their
    own parameters, a tied one once) and ``kinds``: ``"224 linear"``, a module alone by its name
    (``"embed_tokens, 65 norm, lm_head"``), adapters by the layers they adapt (``"112 adapted layers"``)."""
    return trace.cached("weight_precisions", lambda: _weight_precisions(trace))


def modules(trace: Record) -> Any:
    """:func:`module_table`, kept in the record's memo."""
    return trace.cached("modules", lambda: module_table(trace))


def folded_modules(trace: Record) -> Any:
    """:func:`fold_modules` of :func:`modules`, kept in the record's memo."""
    return trace.cached("folded", lambda: fold_modules(trace, modules(trace)))
