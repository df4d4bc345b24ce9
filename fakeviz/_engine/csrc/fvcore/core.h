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
#define PARAM_NEW_FRAMES 25 /* the Python recorder looks 24 frames up from its caller: ops._called_from_parameter_new */

static PyObject *s_tid, *s_untyped_storage, *s_cdata, *s_sid, *s_in_optimizer, *s_seen_forward,
    *s_progress, *s_bw_line, *s_sequence_nr, *s_tensor_id, *s_is_internal, *s_line_id,
    *s_record_full, *s_bw_module, *s_report_progress, *s_output, *s_next_tensor, *s_shape, *s_stride,
    *s_dtype, *s_device, *s_nbytes, *s_storage_offset, *s_active, *s_storage_id, *s_grad_fn,
    *s_saved_alias, *s_py_record, *s_key, *s_on_free, *s_dict, *s_depth, *s_entry, *s_op_failed,
    *s_range_failed, *s_internal_error, *s_record, *s_namespace, *s_prim, *s_shape_env, *s_run_op,
    *s_fake_mode, *s_constant, *s_real_tensor, *s_in_kernel, *s_protos, *s_debug, *s_requires_grad,
    *s_allow_unsafe, *s_enter, *s_exit, *s_own_thread;

typedef struct {
    PyObject_HEAD
    PyObject *state;
    /* containers shared with the Python state (same objects) */
    PyObject *live, *fast, *fw_stack, *fw_lines, *unpacked, *internal_code, *line_ids, *sn_cache, *meta_ids;
    PyObject *opd, *outd, *in_tensor, *std;
    PyObject *in_frombytes, *out_frombytes, *op_frombytes, *std_frombytes;
    /* torch objects */
    PyObject *tensor_type, *fake_type, *detach, *lift_fresh, *graph_task_id, *current_node, *get_seqnr,
        *param_new_code, *disable_tf, *ref_type, *local, *range_error, *fake_dispatch,
        *orig_from_entry, *orig_make_entry, *kinds, *meta_in_tls, *set_meta_in_tls,
        *disable_td, *preserve_keys, *detach_op, *make_subclass, *fake_config, *warn_mutable, *throw_mutable,
        *py_wrap_fake, *make_subclass_kwnames, *c_fast_dispatch, *unsafe_view, *tf_mode_enabled;
    long long tbase, ttop;
    Py_ssize_t progress_every;
    long long role_saved;
    /* Note: [threads] (fakeviz/_engine/patches.py): the record's thread, and the last autograd worker thread and
     * graph task of the record's backward that an op was dispatched on (state.own_thread() said so) */
    unsigned long owner, worker;
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
    PyObject *tag = PyDict_GetItemWithError(d, s_tid); /* borrowed */
    int found = 0;
    if (tag) {
        if (PyLong_Check(tag)) {
            long long v = PyLong_AsLongLong(tag);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
            } else if (v >= self->tbase && v < self->ttop) {
                *tid = v - self->tbase;
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
    Py_ssize_t n = PyObject_Size(self->opd);
    return n < 0 ? -1 : n / FV_OP_WIDTH;
}

#endif /* FVCORE_CORE_H */
