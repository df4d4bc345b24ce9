"""What the recorder's C core reaches into Python by, declared once: every name it reads, writes or calls.

Note: [the C core's contract]
The C core (Note: [recorder core in C] in ``native.py``) reaches into Python objects by name: attributes and
methods of the recording state, keys of a thread's dict and of a tensor's ``__dict__``, attributes of torch's
objects, the keyword arguments ``Core(...)`` takes and the ones it passes, and how many frames it looks up for
``Parameter.__new__``. Every one of them is declared here, and only here:

* :func:`names_header` generates the C side, ``fv_names.h`` (next to ``fv_schema.h`` in each build): one
  interned-string variable per name (``s_`` plus the name without its leading and trailing underscores:
  ``"_record_full"`` -> ``s_record_full``) and the function that interns them, the X-macro lists of
  ``Core``'s keyword arguments (its struct fields are named after them, so C spells no argument name), the
  frame depth, and :func:`contract_signature`'s hash as ``FV_CONTRACT``;
* :func:`source_problems` checks the C sources against the declaration before every build (a string
  literal the declaration lacks, a declared name or argument the sources never use): the build fails and
  says which (``native._compile``);
* the loaded core reports the ``FV_CONTRACT`` it was built with; one that differs from this declaration
  (a stale build) is not used: the Python recorder records, with one warning (``native._load``);
* ``tests/engine/test_native_contract.py`` checks that every declared state name exists on a real recording
  state and that ``_State._make_core`` passes exactly :data:`CORE_ARGUMENTS`.

The hot-path fields were renamed through this declaration in one pass (issue 34), the record unchanged byte
for byte: the state's ``b`` is ``builder``, ``fast`` ``op_cache`` (Note: [recorded op cache]), ``sn_cache``
``module_by_seq_nr``, ``tbase``/``ttop`` ``tid_base``/``tid_limit`` (Note: [tensor tags]); the builder's rows
``opd``/``outd``/``std``/``pd``/``td`` are ``op_rows``/``out_rows``/``storage_rows``/``param_rows``/``tensor_rows``.

To make C read a new name: add it to the group it belongs to below, use ``s_<name>`` in C. To rename a
field C reads: rename it here and in Python; C follows (its ``s_`` variable keeps its name only if the
name does; rename that too, one pass).
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["CALL_KEYWORDS", "CORE_ARGUMENTS", "CORE_METHODS", "C_LITERALS", "HEADER", "LOCAL_KEYS", "NAMES",
           "PARAM_NEW_FRAMES_UP", "STATE_NAMES", "c_name", "contract_signature", "names_header",
           "source_problems"]  # fmt: skip

HEADER = "fv_names.h"

#: Note: [Parameter detach] (``recorder/ops.py``): how many frames up from the recorder the Python recorder
#: looks for ``Parameter.__new__``'s code object (a dispatch mode above the recording puts its own frames
#: between). ``_called_from_parameter_new`` starts at its caller's caller's caller (``sys._getframe(3)``);
#: the C core starts one frame lower, at the innermost Python frame, so it looks one frame more
#: (``PARAM_NEW_FRAMES`` in ``fv_names.h`` is this plus one).
PARAM_NEW_FRAMES_UP = 24

#: Attributes and methods of the recording state (``recorder.state._State``) that C reads, sets or calls.
STATE_NAMES: tuple[str, ...] = (
    "_bw_module", "_is_internal", "_line_id", "_op_failed", "_output", "_py_record", "_range_failed",
    "_record_full", "_report_progress", "_saved_alias", "active", "bw_line", "in_optimizer", "internal_error",
    "next_tensor", "on_free", "own_thread", "progress", "record", "run_op", "seen_forward", "storage_id",
    "tensor_id",
)  # fmt: skip

#: Keys C reads and sets in a thread's dict of the state's ``threading.local`` (``state.local.__dict__``).
LOCAL_KEYS: tuple[str, ...] = ("depth", "entry")

#: Every other name C interns, by the object it is used on (the check that torch keeps its own is
#: ``native.TORCH_CONTRACT``; these are attributes of public objects or of the ones it names).
OTHER_NAMES: dict[str, tuple[str, ...]] = {
    # fakeviz's own: a tensor's id tag in its __dict__ (Note: [tensor tags]), the fake mode's prototype
    # FakeTensors by device (Note: [light FakeTensor wrap]), a storage weakref's slots (storages._StorageRef)
    "tensor __dict__ key": ("_fakeviz_tid",),
    "fake mode __dict__ key": ("_fv_protos",),
    "_StorageRef slot": ("key", "sid"),
    # torch
    "Tensor": (
        "device",
        "dtype",
        "grad_fn",
        "nbytes",
        "requires_grad",
        "shape",
        "storage_offset",
        "stride",
        "untyped_storage",
    ),  # fmt: skip
    "UntypedStorage": ("_cdata",),  # nbytes too (above)
    "autograd Node": ("_sequence_nr",),
    "OpOverload": ("_namespace",),
    "op namespace (a value compared with, not an attribute)": ("prim",),
    "FakeTensor": ("constant", "fake_mode", "real_tensor"),
    "FakeTensorMode": ("_allow_unsafe_data_ptr_access", "in_kernel_invocation", "shape_env"),
    "FakeTensorConfig": ("debug",),
    # Python
    "object": ("__dict__", "__enter__", "__exit__"),
}

#: Every name C interns: the state's, the thread dict's keys, the rest.
NAMES: tuple[str, ...] = (*STATE_NAMES, *LOCAL_KEYS, *(n for group in OTHER_NAMES.values() for n in group))

#: The keyword arguments ``Core(...)`` takes (``_State._make_core`` passes each, nothing else), by kind:
#: ``object`` is kept as a struct field of the same name, ``int`` read as a C ``long long`` field of the same
#: name, ``layout`` compared with the build's ``FV_LAYOUT`` (Note: [recorder core in C]).
CORE_ARGUMENTS: dict[str, str] = {
    # the state and the containers it shares with the core (mutated in place, never rebound)
    **dict.fromkeys(
        (
            "state",
            "live",
            "op_cache",
            "fw_stack",
            "fw_lines",
            "unpacked",
            "internal_code",
            "line_ids",
            "module_by_seq_nr",
            "meta_ids",
            "local",
            "op_rows",
            "out_rows",
            "in_tensor",
            "storage_rows",
        ),
        "object",
    ),  # fmt: skip
    # Python types, ops and functions it compares with or calls
    **dict.fromkeys(
        (
            "tensor_type",
            "fake_type",
            "storage_ref",
            "range_error",
            "detach",
            "lift_fresh",
            "unsafe_view",
            "param_new_code",
            "graph_task_id",
            "current_node",
            "get_sequence_nr",
            "fake_dispatch",
            "output_from_cache_entry",
            "make_cache_entry",
            "wrap_fake",
            "meta_in_tls",
            "set_meta_in_tls",
            "disable_torch_dispatch",
            "preserve_dispatch_keys",
            "detach_op",
            "make_subclass",
            "fake_config",
            "warn_mutable_data_ptr",
            "throw_mutable_data_ptr",
            "disable_tf",
            "torch_function_mode_enabled",
        ),
        "object",
    ),  # fmt: skip
    # the trace's layout and numbers
    **dict.fromkeys(("tid_base", "tid_limit", "progress_every", "role_saved", "owner"), "int"),
    "layout": "layout",
}

#: Keyword arguments C passes to a Python callable: ``Tensor._make_subclass``'s, in the fast fake detach.
CALL_KEYWORDS: tuple[str, ...] = ("dispatch_device", "device_for_backend_keys")

#: Methods the core defines, which Python calls by these names (``_State.__init__``, the recording modes).
CORE_METHODS: tuple[str, ...] = ("dispatch", "fast_dispatch", "make_cache_entry", "on_free",
                                 "output_from_cache_entry", "pack_saved", "record", "run_op")  # fmt: skip

#: Every other name-like string literal the C sources may hold: the module's and type's names, the module
#: attribute holding its ``FV_CONTRACT``, and the method C looks up on an ``array('q')`` (its rows) to extend it.
C_LITERALS: tuple[str, ...] = ("_fvcore", "Core", "CONTRACT", "frombytes")

_KINDS = ("object", "int", "layout")


def c_name(name: str) -> str:
    """The C variable holding a name's interned string: ``s_`` plus the name without its leading and
    trailing underscores (``"__dict__"`` -> ``s_dict``, ``"_fakeviz_tid"`` -> ``s_fakeviz_tid``)."""
    return "s_" + name.strip("_")


def contract_signature() -> str:
    """The declaration in one line (names, arguments, keywords, methods, the frame depth): what its hash,
    ``FV_CONTRACT``, is taken of."""
    parts = [
        "NAMES=" + ",".join(NAMES),
        "ARGS=" + ",".join(f"{k}:{v}" for k, v in CORE_ARGUMENTS.items()),
        "KW=" + ",".join(CALL_KEYWORDS),
        "METHODS=" + ",".join(CORE_METHODS),
        f"FRAMES={PARAM_NEW_FRAMES_UP}",
    ]
    return ";".join(parts)


def contract_hash() -> str:
    """A short hash of :func:`contract_signature`: the ``FV_CONTRACT`` a core is built with."""
    return hashlib.sha256(contract_signature().encode()).hexdigest()[:16]


def _declaration_problems() -> list[str]:
    problems = []
    seen: dict[str, str] = {}
    for name in NAMES:
        var = c_name(name)
        if not var.isidentifier():
            problems.append(f"{name!r} gives no C name ({var})")
        elif var in seen:
            problems.append(f"{name!r} and {seen[var]!r} share the C name {var}")
        seen[var] = name
    for arg, kind in CORE_ARGUMENTS.items():
        if kind not in _KINDS or not arg.isidentifier():
            problems.append(f"Core argument {arg!r}: kind {kind!r} (one of {', '.join(_KINDS)})")
    if list(CORE_ARGUMENTS.values()).count("layout") != 1:
        problems.append("Core takes exactly one layout argument")
    return problems


def names_header() -> str:
    """The text of ``fv_names.h``: the interned names and ``fv_intern_names()``, ``Core``'s arguments as
    X-macro lists (``FV_CORE_OBJECTS(X)``, ``FV_CORE_INTS(X)``, ``FV_CORE_LAYOUT``, ``FV_CORE_NARGS``),
    the keywords C passes (``FV_KW_<NAME>``), ``PARAM_NEW_FRAMES`` and ``FV_CONTRACT``."""
    problems = _declaration_problems()
    if problems:
        raise ValueError("the C core's contract (fakeviz/_engine/native_contract.py): " + "; ".join(problems))
    lines = [
        f"/* {HEADER}: generated by fakeviz._engine.native_contract.names_header() from the declaration there",
        " * (Note: [the C core's contract]); do not edit (nor check in: it is written next to each build). */",
        "#ifndef FV_NAMES_H",
        "#define FV_NAMES_H",
        "",
        "/* the names C reaches Python objects by, interned once by fv_intern_names() */",
    ]
    lines += [f'static PyObject *{c_name(n)}; /* "{n}" */' for n in NAMES]
    lines += ["", "static int fv_intern_names(void) {"]
    lines += [f'    if (!({c_name(n)} = PyUnicode_InternFromString("{n}"))) return -1;' for n in NAMES]
    lines += ["    return 0;", "}", ""]
    by_kind = {k: [a for a, v in CORE_ARGUMENTS.items() if v == k] for k in _KINDS}
    lines += ["/* Core(...)'s keyword arguments, each kept in the struct field of its name */"]
    lines.append("#define FV_CORE_OBJECTS(X) " + " ".join(f"X({a})" for a in by_kind["object"]))
    lines.append("#define FV_CORE_INTS(X) " + " ".join(f"X({a})" for a in by_kind["int"]))
    lines.append(f'#define FV_CORE_LAYOUT "{by_kind["layout"][0]}"')
    lines.append(f"#define FV_CORE_NARGS {len(CORE_ARGUMENTS)}")
    lines += ["", "/* keyword arguments C passes */"]
    lines += [f'#define FV_KW_{k.upper()} "{k}"' for k in CALL_KEYWORDS]
    lines += ["", "/* Note: [Parameter detach]: frames C looks up, from the innermost Python frame */"]
    lines.append(f"#define PARAM_NEW_FRAMES ({PARAM_NEW_FRAMES_UP} + 1)")
    lines += ["", f'#define FV_CONTRACT "{contract_hash()}"', "", "#endif", ""]
    return "\n".join(lines)


_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def _code(text: str) -> str:
    """C text without its comments (blanked, so lines keep their numbers)."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def source_problems(sources: dict[str, str]) -> list[str]:
    """Where C sources (text by file name, comments included) and the declaration disagree: a name-like
    string literal (an identifier) the declaration lacks (C must spell names through ``fv_names.h``), a
    declared name whose ``s_`` variable no source uses, a ``Core`` argument no source reads
    (``->name``), a keyword or method the sources never spell. Empty when they agree."""
    problems = _declaration_problems()
    code = {name: _code(text) for name, text in sources.items()}
    allowed = set(C_LITERALS) | set(CORE_METHODS)
    for name, text in code.items():
        for m in _LITERAL.finditer(text):
            lit = m.group(1)
            if lit.isidentifier() and lit not in allowed:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f'{name}:{line}: "{lit}" is not in the contract: declare it in '
                                "fakeviz/_engine/native_contract.py and use its s_ name or macro")  # fmt: skip
    everything = "\n".join(code.values())
    used = set(re.findall(r"\bs_\w+\b", everything))
    for n in NAMES:
        if c_name(n) not in used:
            problems.append(f"the contract declares {n!r} but no C source uses {c_name(n)}")
    for arg, kind in CORE_ARGUMENTS.items():
        if kind != "layout" and not re.search(rf"->{arg}\b", everything):
            problems.append(f"the contract declares Core argument {arg!r} but no C source reads ->{arg}")
    for kw in CALL_KEYWORDS:
        if f"FV_KW_{kw.upper()}" not in everything:
            problems.append(f"the contract declares keyword {kw!r} but no C source passes FV_KW_{kw.upper()}")
    for meth in CORE_METHODS:
        if f'"{meth}"' not in everything:
            problems.append(f"the contract declares Core method {meth!r} but the C method table lacks it")
    return problems
