/* fvcore/core.h: what every part uses: the generated row layout (fv_schema.h) and the
 * columns this core fills, the interned attribute names, the Core struct, and the shared helpers
 * (ints, array extends, calls into the Python state, tensor ids).
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */
#ifndef FVCORE_CORE_H
#define FVCORE_CORE_H

/* The row layout of the record: FV_<table>_WIDTH and FV_<table>_<column> (a column's position in a
 * row), and the phase codes (FV_PHASE_<phase>), generated from fakeviz._core.schema.LAYOUT by
 * fakeviz._engine.native.schema_header() into the build's include path (angle brackets: never a
 * stale copy next to this file). Rows are written by column name; a column the core does not know
 * fails the build (the widths below), and the Python recorder then records instead. */
#include <fv_schema.h>

/* every column of the rows the core writes, each set by name where the message says */
_Static_assert(FV_OP_WIDTH == 9, "the core writes 9 op columns: fill the new ones in record_body (record.c)");
_Static_assert(FV_OUT_WIDTH == 8, "the core writes 8 output columns: fill the new ones in output_row (rows.c)");
_Static_assert(FV_ST_WIDTH == 8, "the core writes 8 storage columns: fill the new ones in new_storage (storages.c)");

enum { P_INIT = FV_PHASE_INIT, P_FORWARD = FV_PHASE_FORWARD, P_BACKWARD = FV_PHASE_BACKWARD,
       P_OPTIMIZER = FV_PHASE_OPTIMIZER, P_OTHER = FV_PHASE_OTHER };
/* The names C reaches Python objects by (s_<name>, interned by fv_intern_names()), Core's keyword
 * arguments (FV_CORE_OBJECTS, FV_CORE_INTS: its struct fields below are named after them), the keywords C
 * passes (FV_KW_<NAME>), PARAM_NEW_FRAMES and FV_CONTRACT: generated from the declaration in
 * fakeviz/_engine/native_contract.py (Note: [the C core's contract]), the one place a name is spelled. A
 * name used here that the declaration lacks fails the build: an s_ variable does not exist, and a quoted
 * name is refused by native_contract.source_problems() before the compiler runs. */
#include <fv_names.h>

#define FV_OBJECT_FIELD(name) PyObject *name;
#define FV_INT_FIELD(name) long long name;
typedef struct {
    PyObject_HEAD
    /* Core(...)'s arguments: the state, the containers it shares with the core (same objects), the Python
     * types, ops and functions it compares with or calls (native_contract.CORE_ARGUMENTS) */
    FV_CORE_OBJECTS(FV_OBJECT_FIELD)
    /* and its numbers: tid_base, tid_limit (the trace's tensor ids), progress_every, role_saved, owner (the record's
     * thread: threading.get_ident()) */
    FV_CORE_INTS(FV_INT_FIELD)
    /* what the core makes itself: the rows' frombytes, the kinds of ops it has seen, _make_subclass's
     * keyword names, its own fast_dispatch as a bound method */
    PyObject *in_frombytes, *out_frombytes, *op_frombytes, *std_frombytes;
    PyObject *kinds, *make_subclass_kwnames, *c_fast_dispatch;
    /* Note: [threads] (fakeviz/_engine/patches.py): the record's thread, and the last autograd worker thread and
     * graph task of the record's backward that an op was dispatched on (state.own_thread() said so) */
    unsigned long worker;
    long long task;
} Core;

/* ------------------------------------------------------------------ helpers */

/* a core the cyclic GC has cleared has no state: its methods raise (or, for the free
 * callback, do nothing) instead of touching NULL */
#define REQUIRE_STATE(self)                                                        \
    do {                                                                           \
        if (!(self)->state) {                                                      \
            PyErr_SetString(PyExc_RuntimeError, "fakeviz core: recording is gone"); \
            return NULL;                                                           \
        }                                                                          \
    } while (0)

static int is_storage_error(void) {
    return PyErr_ExceptionMatches(PyExc_NotImplementedError) || PyErr_ExceptionMatches(PyExc_RuntimeError);
}

/* extend an array('q') by n int64 values through its frombytes method */
static int extend(PyObject *frombytes, const long long *v, Py_ssize_t n) {
    if (n == 0) return 0;
    PyObject *b = PyBytes_FromStringAndSize((const char *)v, n * (Py_ssize_t)sizeof(long long));
    if (!b) return -1;
    PyObject *r = PyObject_CallOneArg(frombytes, b);
    Py_DECREF(b);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

static int as_ll(PyObject *o, long long *v) {
    if (!o) return -1;
    *v = PyLong_AsLongLong(o);
    if (*v == -1 && PyErr_Occurred()) return -1;
    return 0;
}

/* call a method of the Python state and convert its int result */
static int state_call_ll(Core *self, PyObject *name, long long *v, PyObject *const *args, size_t nargs) {
    PyObject *stack[8];
    stack[0] = self->state;
    for (size_t i = 0; i < nargs; i++) stack[i + 1] = args[i];
    PyObject *r = PyObject_VectorcallMethod(name, stack, (nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (!r) return -1;
    int rc = as_ll(r, v);
    Py_DECREF(r);
    return rc;
}

/* The tensor id in t.__dict__ if it is one of this recording's: 1 found, 0 not, -1 error. */
static int own_tid(Core *self, PyObject *t, PyObject **dict_out, long long *tid) {
    PyObject *d = PyObject_GenericGetDict(t, NULL);
    if (!d) return -1;
    PyObject *tag = PyDict_GetItemWithError(d, s_fakeviz_tid); /* borrowed */
    int found = 0;
    if (tag) {
        if (PyLong_Check(tag)) {
            long long v = PyLong_AsLongLong(tag);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
            } else if (v >= self->tid_base && v < self->tid_limit) {
                *tid = v - self->tid_base;
                found = 1;
            }
        }
    } else if (PyErr_Occurred()) {
        Py_DECREF(d);
        return -1;
    }
    if (dict_out)
        *dict_out = d;
    else
        Py_DECREF(d);
    return found;
}

/* _State.tensor_id */
static int input_id(Core *self, PyObject *t, long long *tid) {
    int f = own_tid(self, t, NULL, tid);
    if (f != 0) return f < 0 ? -1 : 0;
    return state_call_ll(self, s_tensor_id, tid, &t, 1);
}

/* pop d[key] for this thread's ident: a new reference, or NULL (an error if one is set) */
static PyObject *pop_ident(PyObject *d) {
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (!ident) return NULL;
    PyObject *v = PyDict_GetItemWithError(d, ident); /* borrowed */
    if (v) {
        Py_INCREF(v);
        if (PyDict_DelItem(d, ident) < 0) Py_CLEAR(v);
    }
    Py_DECREF(ident);
    return v;
}

static Py_ssize_t num_ops(Core *self) {
    Py_ssize_t n = PyObject_Size(self->op_rows);
    return n < 0 ? -1 : n / FV_OP_WIDTH;
}

#endif /* FVCORE_CORE_H */
