/* fakeviz._fvcore: the recorder's per-op path in C (Note: [recorder core in C] in
 * fakeviz/_engine/native.py).
 *
 * Core mirrors, method by method, the Python reference in fakeviz/_engine/recorder/:
 *   dispatch / output_from_cache_entry / make_cache_entry  _FakeRecordingMode hooks (modes.py)
 *   run_op, record, pack_saved, on_free                     _State methods (ops.py, autograd.py, storages.py)
 *   fast_dispatch                                            _fake_dispatch_fast (modes.py)
 * on their common paths; every uncommon path calls the Python method that handles
 * it. Only the CPython C API is used (no torch headers): it builds in under a second
 * with any C compiler, and fakeviz records in Python where none exists.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <string.h>
#include <math.h>
/* The row layout of the record: FV_<table>_WIDTH and FV_<table>_<column> (a column's position in a
 * row), and the phase codes (FV_PHASE_<phase>), generated from fakeviz._core.schema.LAYOUT by fakeviz._engine.native.schema_header() into
 * the build's include path (angle brackets: never a stale copy next to this file). Rows are written
 * by column name; a column this file does not know fails the build (the widths below), and the
 * Python recorder then records instead. */
#include <fv_schema.h>

/* every column of the rows this file writes, each set by name below */
_Static_assert(FV_OP_WIDTH == 9, "fvcore.c writes 9 op columns: fill the new ones in record_body");
_Static_assert(FV_OUT_WIDTH == 8, "fvcore.c writes 8 output columns: fill the new ones in output_row");
_Static_assert(FV_ST_WIDTH == 7, "fvcore.c writes 7 storage columns: fill the new ones in new_storage");

enum { P_INIT = FV_PHASE_INIT, P_FORWARD = FV_PHASE_FORWARD, P_BACKWARD = FV_PHASE_BACKWARD,
       P_OPTIMIZER = FV_PHASE_OPTIMIZER, P_OTHER = FV_PHASE_OTHER };
#define PARAM_NEW_FRAMES 9

static PyObject *s_tid, *s_untyped_storage, *s_cdata, *s_sid, *s_in_optimizer, *s_seen_forward,
    *s_progress, *s_bw_line, *s_sequence_nr, *s_tensor_id, *s_is_internal, *s_line_id,
    *s_record_full, *s_bw_module, *s_report_progress, *s_output, *s_next_tensor, *s_shape, *s_stride,
    *s_dtype, *s_device, *s_nbytes, *s_storage_offset, *s_active, *s_storage_id, *s_grad_fn,
    *s_saved_alias, *s_py_record, *s_key, *s_on_free, *s_dict, *s_depth, *s_entry, *s_op_failed,
    *s_range_failed, *s_internal_error, *s_record, *s_namespace, *s_prim, *s_shape_env, *s_run_op,
    *s_fake_mode, *s_constant, *s_real_tensor, *s_in_kernel, *s_protos, *s_debug, *s_requires_grad,
    *s_allow_unsafe, *s_enter, *s_exit;

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

/* _State._new_storage: a new storage row, watched for its free */
static int new_storage(Core *self, PyObject *st, PyObject *key, long long devid, long long seq, long long roles,
                       long long *sid) {
    Py_ssize_t n = PyObject_Size(self->std);
    if (n < 0) return -1;
    *sid = n / FV_ST_WIDTH;
    long long nb = -1;
    PyObject *nbo = PyObject_CallMethodNoArgs(st, s_nbytes);
    if (nbo && PyLong_CheckExact(nbo)) {
        nb = PyLong_AsLongLong(nbo);
        if (nb == -1 && PyErr_Occurred()) PyErr_Clear();
    } else {
        PyErr_Clear(); /* unbacked symbolic size */
    }
    Py_XDECREF(nbo);
    long long row[FV_ST_WIDTH] = {
        [FV_ST_DEVICE] = devid, [FV_ST_NBYTES] = nb, [FV_ST_ALLOC] = seq, [FV_ST_FREE] = -1,
        [FV_ST_ROLES] = roles,  [FV_ST_NAME] = -1,   [FV_ST_OWNER] = -1,
    };
    if (extend(self->std_frombytes, row, FV_ST_WIDTH) < 0) return -1;
    PyObject *cb = PyObject_GetAttr(self->state, s_on_free);
    if (!cb) return -1;
    PyObject *ref = PyObject_CallFunctionObjArgs(self->ref_type, st, cb, NULL);
    Py_DECREF(cb);
    if (!ref) return -1;
    PyObject *sido = PyLong_FromLongLong(*sid);
    int rc = (sido && PyObject_SetAttr(ref, s_key, key) == 0 && PyObject_SetAttr(ref, s_sid, sido) == 0 &&
              PyDict_SetItem(self->live, key, ref) == 0)
                 ? 0
                 : -1;
    Py_XDECREF(sido);
    Py_DECREF(ref);
    return rc;
}

/* _State._on_free: the weakref callback of a watched storage */
static PyObject *Core_on_free(Core *self, PyObject *ref) {
    if (!self->state) Py_RETURN_NONE;
    long long sid;
    PyObject *so = PyObject_GetAttr(ref, s_sid);
    int rc = as_ll(so, &sid);
    Py_XDECREF(so);
    if (rc < 0) return NULL;
    Py_ssize_t ops = num_ops(self);
    if (ops < 0) return NULL;
    PyObject *v = PyLong_FromSsize_t(ops);
    if (!v) return NULL;
    rc = PySequence_SetItem(self->std, (Py_ssize_t)sid * FV_ST_WIDTH + FV_ST_FREE, v);
    Py_DECREF(v);
    if (rc < 0) return NULL;
    PyObject *key = PyObject_GetAttr(ref, s_key);
    if (!key) return NULL;
    PyObject *cur = PyDict_GetItemWithError(self->live, key); /* borrowed */
    if (cur == ref) rc = PyDict_DelItem(self->live, key);
    else if (!cur && PyErr_Occurred()) rc = -1;
    Py_DECREF(key);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* storage id of an output's storage (-1 where it has none), registering it if new */
static int output_storage(Core *self, PyObject *t, long long devid, long long *stor) {
    *stor = -1;
    PyObject *st = PyObject_CallMethodNoArgs(t, s_untyped_storage);
    if (!st) goto fail;
    PyObject *key = PyObject_GetAttr(st, s_cdata);
    if (!key) {
        Py_DECREF(st);
        goto fail;
    }
    PyObject *hit = PyDict_GetItemWithError(self->live, key); /* borrowed */
    int rc;
    if (hit) {
        PyObject *so = PyObject_GetAttr(hit, s_sid);
        rc = as_ll(so, stor);
        Py_XDECREF(so);
    } else if (PyErr_Occurred()) {
        rc = -1;
    } else {
        Py_ssize_t seq = num_ops(self);
        if (seq < 0) {
            rc = -1;
        } else {
            rc = new_storage(self, st, key, devid, seq, 0, stor);
        }
    }
    Py_DECREF(key);
    Py_DECREF(st);
    if (rc == 0) return 0;
fail:
    if (is_storage_error()) {
        PyErr_Clear();
        *stor = -1;
        return 0;
    }
    return -1;
}

/* where the fields of an output's metadata go in its row: the interned shape, stride, dtype and device
 * ids (the values of meta_ids), then storage offset and nbytes; a cached metadata tuple of the recorded
 * op cache has all six in this order (_OUT_META in recorder/common.py) */
static const int OUT_META[6] = {FV_OUT_SHAPE, FV_OUT_STRIDE, FV_OUT_DTYPE, FV_OUT_DEVICE, FV_OUT_OFFSET, FV_OUT_NBYTES};

/* _State._output(t, m): append t's output row; m is its cached metadata tuple or NULL */
static int output_row(Core *self, PyObject *t, PyObject *m, long long *flag) {
    long long row[FV_OUT_WIDTH];
    *flag = 0;
    if (m) {
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 6) {
            PyErr_SetString(PyExc_TypeError, "fakeviz core: bad cached output metadata");
            return -1;
        }
        for (int i = 0; i < 6; i++)
            if (as_ll(PyTuple_GET_ITEM(m, i), &row[OUT_META[i]]) < 0) return -1;
    } else {
        /* interned metadata ids of a known (shape, stride, dtype, device), else the Python path */
        PyObject *shape = PyObject_GetAttr(t, s_shape);
        PyObject *stride = shape ? PyObject_CallMethodNoArgs(t, s_stride) : NULL;
        PyObject *dt = stride ? PyObject_GetAttr(t, s_dtype) : NULL;
        PyObject *dev = dt ? PyObject_GetAttr(t, s_device) : NULL;
        PyObject *ids = NULL, *nb = NULL, *off = NULL;
        int ok = 0;
        if (dev) {
            PyObject *key = PyTuple_Pack(4, shape, stride, dt, dev);
            if (key) {
                ids = PyDict_GetItemWithError(self->meta_ids, key); /* borrowed */
                Py_XINCREF(ids);
                Py_DECREF(key);
                if (!ids && PyErr_Occurred()) {
                    if (PyErr_ExceptionMatches(PyExc_TypeError)) PyErr_Clear(); /* symbolic sizes */
                }
            }
        }
        if (ids && !PyErr_Occurred()) {
            nb = PyObject_GetAttr(t, s_nbytes);
            off = nb ? PyObject_CallMethodNoArgs(t, s_storage_offset) : NULL;
            if (off && PyLong_CheckExact(nb) && PyLong_CheckExact(off) && PyTuple_Check(ids) &&
                PyTuple_GET_SIZE(ids) == 4) {
                ok = 1;
                for (int i = 0; i < 4 && ok; i++)
                    if (as_ll(PyTuple_GET_ITEM(ids, i), &row[OUT_META[i]]) < 0) ok = -1;
                if (ok == 1 && (as_ll(off, &row[FV_OUT_OFFSET]) < 0 || as_ll(nb, &row[FV_OUT_NBYTES]) < 0)) ok = -1;
            }
        }
        Py_XDECREF(shape);
        Py_XDECREF(stride);
        Py_XDECREF(dt);
        Py_XDECREF(dev);
        Py_XDECREF(ids);
        Py_XDECREF(nb);
        Py_XDECREF(off);
        if (ok < 0) return -1;
        if (!ok) {
            if (PyErr_Occurred()) return -1;
            return state_call_ll(self, s_output, flag, &t, 1); /* the Python path does it all */
        }
    }
    /* tensor id: an in-place op returns its (tagged) input, anything else is new */
    PyObject *d = NULL;
    long long tid;
    int f = own_tid(self, t, &d, &tid);
    if (f < 0) return -1;
    if (!f) {
        PyObject *nt = PyObject_GetAttr(self->state, s_next_tensor);
        int rc = as_ll(nt, &tid);
        Py_XDECREF(nt);
        PyObject *n1 = rc == 0 ? PyLong_FromLongLong(tid + 1) : NULL;
        PyObject *tag = rc == 0 ? PyLong_FromLongLong(self->tbase + tid) : NULL;
        if (!n1 || !tag || PyObject_SetAttr(self->state, s_next_tensor, n1) < 0 ||
            PyDict_SetItem(d, s_tid, tag) < 0) {
            Py_XDECREF(n1);
            Py_XDECREF(tag);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(n1);
        Py_DECREF(tag);
    }
    Py_DECREF(d);
    row[FV_OUT_TENSOR] = tid;
    if (output_storage(self, t, row[FV_OUT_DEVICE], &row[FV_OUT_STORAGE]) < 0) return -1;
    return extend(self->out_frombytes, row, FV_OUT_WIDTH);
}

/* the first frame outside torch/fakeviz/stdlib (and excluded packages): its line id, or -1 */
static int user_line(Core *self, long long *line) {
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    *line = -1;
    while (f) {
        PyCodeObject *c = PyFrame_GetCode(f);
        PyObject *k = PyLong_FromVoidPtr(c);
        if (!k) {
            Py_DECREF(c);
            Py_DECREF(f);
            return -1;
        }
        PyObject *v = PyDict_GetItemWithError(self->internal_code, k); /* borrowed */
        int internal;
        if (v) {
            internal = PyObject_IsTrue(v);
        } else if (PyErr_Occurred()) {
            internal = -1;
        } else {
            PyObject *r = PyObject_CallMethodOneArg(self->state, s_is_internal, (PyObject *)c);
            internal = r ? PyObject_IsTrue(r) : -1;
            Py_XDECREF(r);
        }
        if (internal < 0) {
            Py_DECREF(k);
            Py_DECREF(c);
            Py_DECREF(f);
            return -1;
        }
        if (!internal) {
            int lineno = PyFrame_GetLineNumber(f);
            PyObject *ln = PyLong_FromLong(lineno);
            PyObject *key = ln ? PyTuple_Pack(2, k, ln) : NULL;
            int rc = -1;
            if (key) {
                PyObject *i = PyDict_GetItemWithError(self->line_ids, key); /* borrowed */
                if (i) {
                    rc = as_ll(i, line);
                } else if (!PyErr_Occurred()) {
                    PyObject *args[2] = {(PyObject *)c, ln};
                    rc = state_call_ll(self, s_line_id, line, args, 2);
                }
            }
            Py_XDECREF(key);
            Py_XDECREF(ln);
            Py_DECREF(k);
            Py_DECREF(c);
            Py_DECREF(f);
            return rc;
        }
        Py_DECREF(k);
        Py_DECREF(c);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    return 0;
}

/* Note: [Parameter detach] -- is Parameter.__new__ among the nearest Python frames? */
static int called_from_parameter_new(Core *self) {
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    int found = 0;
    for (int i = 0; f && i < PARAM_NEW_FRAMES && !found; i++) {
        PyCodeObject *c = PyFrame_GetCode(f);
        found = (PyObject *)c == self->param_new_code;
        Py_DECREF(c);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    return found;
}

static int bw_module(Core *self, long long *module) {
    PyObject *node = PyObject_CallNoArgs(self->current_node);
    if (!node) return -1;
    if (node == Py_None) {
        Py_DECREF(node);
        *module = -1;
        return 0;
    }
    PyObject *sn = PyObject_CallMethodNoArgs(node, s_sequence_nr);
    Py_DECREF(node);
    if (!sn) return -1;
    PyObject *m = PyDict_GetItemWithError(self->sn_cache, sn); /* borrowed */
    Py_DECREF(sn);
    if (m) return as_ll(m, module);
    if (PyErr_Occurred()) return -1;
    return state_call_ll(self, s_bw_module, module, NULL, 0);
}

static int list_last_ll(PyObject *list, long long *v) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    return as_ll(PyList_GET_ITEM(list, n - 1), v);
}

/* ------------------------------------------------------------------ record */

#define IN_STACK 32

typedef struct {
    long long *v;
    Py_ssize_t n, cap;
    long long stack[IN_STACK];
} ibuf;

static int ibuf_push(ibuf *b, long long x) {
    if (b->n == b->cap) {
        Py_ssize_t cap = b->cap * 2;
        long long *nv = PyMem_Malloc(cap * sizeof(long long));
        if (!nv) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(nv, b->v, b->n * sizeof(long long));
        if (b->v != b->stack) PyMem_Free(b->v);
        b->v = nv;
        b->cap = cap;
    }
    b->v[b->n++] = x;
    return 0;
}

static int push_input(Core *self, ibuf *ids, PyObject *a) {
    long long tid;
    if (input_id(self, a, &tid) < 0) return -1;
    return ibuf_push(ids, tid);
}

/* _same_zeros: do the float zeros of args have the signs the cached template was made for? */
static int same_zeros(PyObject *fargs, PyObject *zeros) {
    if (zeros == Py_None) return 1;
    if (!PyTuple_Check(zeros)) return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(zeros); k++) {
        PyObject *z = PyTuple_GET_ITEM(zeros, k);
        if (!PyTuple_Check(z) || PyTuple_GET_SIZE(z) != 2) return 0;
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(z, 0));
        if (i < 0 || i >= PyTuple_GET_SIZE(fargs)) {
            PyErr_Clear();
            return 0;
        }
        PyObject *a = PyTuple_GET_ITEM(fargs, i);
        if (!PyFloat_CheckExact(a)) return 0;
        double v = PyFloat_AS_DOUBLE(a);
        if (v != 0.0 || (signbit(v) != 0) != (PyTuple_GET_ITEM(z, 1) == Py_True)) return 0;
    }
    return 1;
}

/* _own_key: the recorded-op-cache key of aten._unsafe_view(t, size); NULL without an error when it has none */
static PyObject *own_key(Core *self, PyObject *fargs, PyObject *kwargs) {
    if (kwargs != Py_None && (!PyDict_Check(kwargs) || PyDict_GET_SIZE(kwargs))) return NULL;
    if (PyTuple_GET_SIZE(fargs) != 2) return NULL;
    PyObject *t = PyTuple_GET_ITEM(fargs, 0), *size = PyTuple_GET_ITEM(fargs, 1);
    if (!Py_IS_TYPE(t, (PyTypeObject *)self->fake_type) || !PyList_CheckExact(size)) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(size); i++)
        if (!PyLong_CheckExact(PyList_GET_ITEM(size, i))) return NULL;
    PyObject *st = PyList_AsTuple(size);
    PyObject *shape = st ? PyObject_GetAttr(t, s_shape) : NULL;
    PyObject *stride = shape ? PyObject_CallMethodNoArgs(t, s_stride) : NULL;
    PyObject *dt = stride ? PyObject_GetAttr(t, s_dtype) : NULL;
    PyObject *dev = dt ? PyObject_GetAttr(t, s_device) : NULL;
    PyObject *off = dev ? PyObject_CallMethodNoArgs(t, s_storage_offset) : NULL;
    PyObject *key = off ? PyTuple_Pack(6, st, shape, stride, dt, dev, off) : NULL;
    Py_XDECREF(st);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(dt);
    Py_XDECREF(dev);
    Py_XDECREF(off);
    if (key && PyObject_Hash(key) == -1) Py_CLEAR(key);
    if (!key && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError)) PyErr_Clear(); /* symbolic sizes */
    return key;
}

static PyObject *py_record(Core *self, PyObject *const *args) {
    /* the Python reference implementation, for the rare paths it alone handles */
    PyObject *stack[6] = {self->state, args[0], args[1], args[2], args[3], args[4]};
    return PyObject_VectorcallMethod(s_py_record, stack, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *guard_enter(PyObject *type);
static int guard_exit(PyObject *g);

/* Note: [torch function off while recording]
 * Inside a ``torch.device(...)`` block (and any TorchFunctionMode) every tensor method
 * and property the recorder reads -- untyped_storage(), shape, stride(), device --
 * goes through the mode's Python __torch_function__: about 1.4 us each instead of
 * 0.1 us. The recorder only reads metadata, so it turns torch function handling off
 * (torch._C.DisableTorchFunction) while it works on an op. */
static PyObject *tf_off(Core *self) {
    /* no torch function mode on this thread's stack (autograd's worker threads, plain runs): nothing to
     * turn off, and no guard to make */
    PyObject *on = PyObject_CallNoArgs(self->tf_mode_enabled);
    if (!on) return NULL;
    int enabled = PyObject_IsTrue(on);
    Py_DECREF(on);
    if (enabled < 0) return NULL;
    if (!enabled) {
        Py_INCREF(Py_None);
        return Py_None;
    }
    return guard_enter(self->disable_tf);
}

/* leave what tf_off entered; keeps a pending exception (returns -1 if one is set) */
static int tf_on(PyObject *g) {
    if (g == Py_None) {
        Py_DECREF(g);
        return PyErr_Occurred() ? -1 : 0;
    }
    return guard_exit(g);
}

static PyObject *record_body(Core *self, PyObject *const *args);

static PyObject *Core_record(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    REQUIRE_STATE(self);
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "record(func, args, kwargs, out, entry)");
        return NULL;
    }
    PyObject *g = tf_off(self);
    if (!g) return NULL;
    PyObject *r = record_body(self, args);
    if (tf_on(g) < 0) Py_CLEAR(r);
    return r;
}

static PyObject *record_body(Core *self, PyObject *const *args) {
    PyObject *func = args[0], *fargs = args[1], *kwargs = args[2], *out = args[3], *entry = args[4];
    if (func == self->lift_fresh || !PyTuple_Check(fargs)) return py_record(self, args);
    if (func == self->detach) {
        /* Note: [unpack detach] */
        PyObject *u = NULL;
        if (PyDict_GET_SIZE(self->unpacked)) {
            u = pop_ident(self->unpacked);
            if (!u && PyErr_Occurred()) return NULL;
        }
        if (u && u != Py_None && PyTuple_GET_SIZE(fargs) && PyTuple_GET_ITEM(fargs, 0) == u) {
            PyObject *ud = PyObject_GenericGetDict(u, NULL);
            PyObject *tag = ud ? PyDict_GetItemWithError(ud, s_tid) : NULL;
            int rc = ud ? 0 : -1;
            if (!tag && PyErr_Occurred()) rc = -1;
            if (tag && PyObject_TypeCheck(out, (PyTypeObject *)self->tensor_type)) {
                PyObject *od = PyObject_GenericGetDict(out, NULL);
                if (!od || PyDict_SetItem(od, s_tid, tag) < 0) rc = -1;
                Py_XDECREF(od);
            }
            Py_XDECREF(ud);
            Py_DECREF(u);
            if (rc < 0) return NULL;
            Py_RETURN_NONE;
        }
        Py_XDECREF(u);
        if (called_from_parameter_new(self)) Py_RETURN_NONE; /* Note: [Parameter detach] */
    } else if (PyDict_GET_SIZE(self->unpacked)) {
        PyObject *u = pop_ident(self->unpacked);
        if (!u && PyErr_Occurred()) return NULL;
        Py_XDECREF(u);
    }

    /* phase, module, user line */
    long long phase, module = -1, line = -1;
    PyObject *inopt = PyObject_GetAttr(self->state, s_in_optimizer);
    if (!inopt) return NULL;
    int opt = PyObject_IsTrue(inopt);
    Py_DECREF(inopt);
    if (opt < 0) return NULL;
    if (opt) {
        phase = P_OPTIMIZER;
        if (user_line(self, &line) < 0) return NULL;
    } else {
        long long gt;
        PyObject *g = PyObject_CallNoArgs(self->graph_task_id);
        int rc = as_ll(g, &gt);
        Py_XDECREF(g);
        if (rc < 0) return NULL;
        if (gt >= 0) {
            phase = P_BACKWARD;
            PyObject *bl = PyObject_GetAttr(self->state, s_bw_line);
            rc = as_ll(bl, &line);
            Py_XDECREF(bl);
            if (rc < 0) return NULL;
            if (PyList_GET_SIZE(self->fw_stack)) {
                if (list_last_ll(self->fw_stack, &module) < 0) return NULL;
            } else if (bw_module(self, &module) < 0) {
                return NULL;
            }
        } else if (PyList_GET_SIZE(self->fw_stack)) {
            phase = P_FORWARD;
            if (list_last_ll(self->fw_stack, &module) < 0) return NULL;
            if (!PyList_GET_SIZE(self->fw_lines) || list_last_ll(self->fw_lines, &line) < 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "fakeviz core: fw_lines out of step");
                return NULL;
            }
            if (line == -2 && user_line(self, &line) < 0) return NULL;
        } else {
            PyObject *sf = PyObject_GetAttr(self->state, s_seen_forward);
            if (!sf) return NULL;
            int seen = PyObject_IsTrue(sf);
            Py_DECREF(sf);
            if (seen < 0) return NULL;
            phase = seen ? P_OTHER : P_INIT;
            if (user_line(self, &line) < 0) return NULL;
        }
    }

    /* inputs -> tensor ids */
    ibuf ids = {NULL, 0, IN_STACK, {0}};
    ids.v = ids.stack;
    PyObject *res = NULL, *entry_key = NULL, *own = NULL;
    PyTypeObject *tt = (PyTypeObject *)self->tensor_type;
    Py_ssize_t na = PyTuple_GET_SIZE(fargs);
    for (Py_ssize_t i = 0; i < na; i++) {
        PyObject *a = PyTuple_GET_ITEM(fargs, i);
        if (PyObject_TypeCheck(a, tt)) {
            if (push_input(self, &ids, a) < 0) goto done;
        } else if (PyList_CheckExact(a) && PyList_GET_SIZE(a) && PyObject_TypeCheck(PyList_GET_ITEM(a, 0), tt)) {
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(a); j++) {
                PyObject *x = PyList_GET_ITEM(a, j);
                if (PyObject_TypeCheck(x, tt) && push_input(self, &ids, x) < 0) goto done;
            }
        }
    }
    if (kwargs != Py_None && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v))
            if (PyObject_TypeCheck(v, tt) && push_input(self, &ids, v) < 0) goto done;
    }
    if (extend(self->in_frombytes, ids.v, ids.n) < 0) goto done;

    if (entry == Py_None && func == self->detach && Py_IS_TYPE(out, (PyTypeObject *)self->fake_type) && na == 1 &&
        (kwargs == Py_None || (PyDict_Check(kwargs) && !PyDict_GET_SIZE(kwargs))))
        entry = self->detach; /* Note: [fast fake detach]: cached under the op itself */
    else if (entry == Py_None && func == self->unsafe_view) {
        own = own_key(self, fargs, kwargs);
        if (own) entry = own;
        else if (PyErr_Occurred()) goto done;
    }
    PyObject *hit = NULL;
    if (entry != Py_None) {
        if (own) {
            hit = PyDict_GetItemWithError(self->fast, own); /* borrowed; equal keys */
        } else {
            entry_key = PyLong_FromVoidPtr(entry);
            if (!entry_key) goto done;
            hit = PyDict_GetItemWithError(self->fast, entry_key); /* borrowed */
        }
        if (!hit && PyErr_Occurred()) goto done;
    }
    long long op_id, flags, aid, flops;
    if (hit && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 7 && (own || PyTuple_GET_ITEM(hit, 0) == entry) &&
        same_zeros(fargs, PyTuple_GET_ITEM(hit, 6))) {
        /* Note: [recorded op cache] */
        Py_INCREF(hit);
        int rc = (as_ll(PyTuple_GET_ITEM(hit, 1), &op_id) < 0 || as_ll(PyTuple_GET_ITEM(hit, 2), &flags) < 0 ||
                  as_ll(PyTuple_GET_ITEM(hit, 3), &aid) < 0 || as_ll(PyTuple_GET_ITEM(hit, 4), &flops) < 0)
                     ? -1
                     : 0;
        PyObject *metas = PyTuple_GET_ITEM(hit, 5);
        if (rc == 0 && metas == Py_None) {
            long long fl;
            rc = output_row(self, out, NULL, &fl);
            flags |= fl;
        } else if (rc == 0) {
            Py_ssize_t nm = PyTuple_Check(metas) ? PyTuple_GET_SIZE(metas) : 0;
            long long fl;
            if (PyObject_TypeCheck(out, tt)) {
                if (nm) rc = output_row(self, out, PyTuple_GET_ITEM(metas, 0), &fl);
            } else if (PyTuple_Check(out) || PyList_Check(out)) {
                PyObject *seq = PySequence_Fast(out, "outputs");
                if (!seq) {
                    rc = -1;
                } else {
                    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
                    if (nm < n) n = nm;
                    for (Py_ssize_t i = 0; i < n && rc == 0; i++)
                        rc = output_row(self, PySequence_Fast_GET_ITEM(seq, i), PyTuple_GET_ITEM(metas, i), &fl);
                    Py_DECREF(seq);
                }
            }
        }
        Py_DECREF(hit);
        if (rc < 0) goto done;
    } else {
        PyObject *stack[6] = {self->state, func, fargs, kwargs, out, entry};
        PyObject *r = PyObject_VectorcallMethod(s_record_full, stack, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (!r) goto done;
        int rc = (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4 || as_ll(PyTuple_GET_ITEM(r, 0), &op_id) < 0 ||
                  as_ll(PyTuple_GET_ITEM(r, 1), &flags) < 0 || as_ll(PyTuple_GET_ITEM(r, 2), &aid) < 0 ||
                  as_ll(PyTuple_GET_ITEM(r, 3), &flops) < 0)
                     ? -1
                     : 0;
        Py_DECREF(r);
        if (rc < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "fakeviz core: bad _record_full result");
            goto done;
        }
    }
    Py_ssize_t n_in = PyObject_Size(self->in_tensor), n_outd = PyObject_Size(self->outd);
    if (n_in < 0 || n_outd < 0) goto done;
    long long row[FV_OP_WIDTH] = {
        [FV_OP_OP] = op_id, [FV_OP_PHASE] = phase, [FV_OP_MODULE] = module, [FV_OP_LINE] = line,
        [FV_OP_ARGS] = aid, [FV_OP_IN_END] = n_in, [FV_OP_OUT_END] = n_outd / FV_OUT_WIDTH,
        [FV_OP_FLAGS] = flags, [FV_OP_FLOPS] = flops,
    };
    if (extend(self->op_frombytes, row, FV_OP_WIDTH) < 0) goto done;
    Py_ssize_t n_opd = PyObject_Size(self->opd);
    if (n_opd < 0) goto done;
    if (n_opd % self->progress_every == 0) {
        PyObject *pr = PyObject_GetAttr(self->state, s_progress);
        if (!pr) goto done;
        int has = pr != Py_None;
        Py_DECREF(pr);
        if (has) {
            PyObject *a_ph = PyLong_FromLongLong(phase), *a_mod = PyLong_FromLongLong(module);
            PyObject *r =
                (a_ph && a_mod) ? PyObject_CallMethodObjArgs(self->state, s_report_progress, a_ph, a_mod, NULL) : NULL;
            Py_XDECREF(a_ph);
            Py_XDECREF(a_mod);
            if (!r) goto done;
            Py_DECREF(r);
        }
    }
    res = Py_None;
    Py_INCREF(res);
done:
    if (ids.v != ids.stack) PyMem_Free(ids.v);
    Py_XDECREF(entry_key);
    Py_XDECREF(own);
    return res;
}

/* ------------------------------------------------------------------ run_op */

/* call state.<name>(func, exc) with the pending exception (normalised, with its traceback) */
static PyObject *call_with_pending(Core *self, PyObject *name, PyObject *func) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb && ev) PyException_SetTraceback(ev, tb);
    PyObject *stack[3] = {self->state, func, ev ? ev : Py_None};
    PyObject *r = PyObject_VectorcallMethod(name, stack, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    return r;
}

/* _State.run_op(impl, mode, func, types, args, kwargs): run one op, record it if outermost */
static PyObject *Core_run_op(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    REQUIRE_STATE(self);
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run_op(impl, mode, func, types, args, kwargs)");
        return NULL;
    }
    PyObject *func = args[2];
    PyObject *d = PyObject_GetAttr(self->local, s_dict); /* this thread's dict */
    if (!d) return NULL;
    long long depth = 0;
    PyObject *dep = PyDict_GetItemWithError(d, s_depth); /* borrowed */
    if (dep) {
        if (as_ll(dep, &depth) < 0) goto fail_d;
    } else if (PyErr_Occurred()) {
        goto fail_d;
    }
    PyObject *dep1 = PyLong_FromLongLong(depth + 1), *dep0 = PyLong_FromLongLong(depth);
    if (!dep1 || !dep0 || PyDict_SetItem(d, s_depth, dep1) < 0 || (!depth && PyDict_SetItem(d, s_entry, Py_None) < 0)) {
        Py_XDECREF(dep1);
        Py_XDECREF(dep0);
        goto fail_d;
    }
    Py_DECREF(dep1);
    PyObject *out = PyObject_Vectorcall(args[0], args + 1, 5, NULL);
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int rc = PyDict_SetItem(d, s_depth, dep0);
        Py_DECREF(dep0);
        if (rc < 0) {
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            Py_XDECREF(out);
            goto fail_d;
        }
        PyErr_Restore(et, ev, tb);
    }
    if (!out) {
        Py_DECREF(d);
        if (depth == 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyObject *r = call_with_pending(self, s_op_failed, func); /* always raises */
            Py_XDECREF(r);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "fakeviz core: _op_failed returned");
        }
        return NULL;
    }
    if (depth == 0) {
        PyObject *e = PyDict_GetItemWithError(d, s_entry); /* borrowed: (func, entry) or None */
        PyObject *entry = Py_None;
        if (e && PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 2 && PyTuple_GET_ITEM(e, 0) == func)
            entry = PyTuple_GET_ITEM(e, 1);
        Py_XINCREF(e);
        PyObject *r = NULL;
        if (!PyErr_Occurred()) {
            /* through state.record (normally this core's record), so a wrapper set there sees every op */
            PyObject *rargs[6] = {self->state, func, args[4], args[5], out, entry};
            r = PyObject_VectorcallMethod(s_record, rargs, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        }
        Py_XDECREF(e);
        if (r) {
            Py_DECREF(r);
        } else if (PyErr_ExceptionMatches(self->range_error)) {
            /* a bad input (a cuda index past the fake devices): name the op, module, line */
            PyObject *x = call_with_pending(self, s_range_failed, func); /* always raises */
            Py_XDECREF(x);
            Py_DECREF(out);
            Py_DECREF(d);
            return NULL;
        } else if (PyErr_ExceptionMatches(PyExc_Exception)) {
            /* a recorder bug must never break the user's run */
            PyObject *x = call_with_pending(self, s_internal_error, func);
            if (!x) {
                Py_DECREF(out);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(x);
        } else {
            Py_DECREF(out);
            Py_DECREF(d);
            return NULL;
        }
    }
    Py_DECREF(d);
    return out;
fail_d:
    Py_DECREF(d);
    return NULL;
}

/* ------------------------------------------------------------- fast detach */

/* enter a C-implemented guard type; a new reference to the guard or NULL */
static PyObject *guard_enter(PyObject *type) {
    PyObject *g = PyObject_CallNoArgs(type);
    if (!g) return NULL;
    PyObject *r = PyObject_CallMethodNoArgs(g, s_enter);
    if (!r) {
        Py_DECREF(g);
        return NULL;
    }
    Py_DECREF(r);
    return g;
}

/* leave guard g (steals it), keeping a pending exception; -1 if an error is (now) set */
static int guard_exit(PyObject *g) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *stack[4] = {g, Py_None, Py_None, Py_None};
    PyObject *r = PyObject_VectorcallMethod(s_exit, stack, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(g);
    if (et) {
        Py_XDECREF(r);
        PyErr_Restore(et, ev, tb);
        return -1;
    }
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* the meta kernel of detach with fake dispatch off: in_kernel_invocation_manager(fmode), inlined */
static PyObject *meta_detach(Core *self, PyObject *t, PyObject *fmode) {
    PyObject *prev = PyObject_GetAttr(fmode, s_in_kernel);
    if (!prev) return NULL;
    PyObject *tls = PyObject_CallNoArgs(self->meta_in_tls);
    int same = tls ? PyObject_RichCompareBool(tls, prev, Py_EQ) : -1;
    Py_XDECREF(tls);
    if (same <= 0) {
        Py_DECREF(prev);
        if (same == 0) PyErr_SetString(PyExc_RuntimeError, "meta TLS out of step with in_kernel_invocation");
        return NULL;
    }
    PyObject *meta = NULL;
    PyObject *g1 = guard_enter(self->disable_td);
    if (g1) {
        if (PyObject_SetAttr(fmode, s_in_kernel, Py_True) == 0) {
            PyObject *g2 = guard_enter(self->preserve_keys);
            if (g2) {
                PyObject *r = PyObject_CallOneArg(self->set_meta_in_tls, Py_True);
                if (r) {
                    Py_DECREF(r);
                    meta = PyObject_CallOneArg(self->detach_op, t);
                }
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                int rc = PyObject_SetAttr(fmode, s_in_kernel, prev);
                if (et) PyErr_Restore(et, ev, tb);
                if (rc < 0) Py_CLEAR(meta);
                if (guard_exit(g2) < 0) Py_CLEAR(meta);
            }
        }
        if (guard_exit(g1) < 0) Py_CLEAR(meta);
    }
    Py_DECREF(prev);
    return meta;
}

/* Note: [light FakeTensor wrap], in C where the prototype __dict__ exists */
static PyObject *wrap_fake(Core *self, PyObject *fmode, PyObject *meta, PyObject *device) {
    PyObject *md = PyObject_GenericGetDict(fmode, NULL);
    if (!md) return NULL;
    PyObject *protos = PyDict_GetItemWithError(md, s_protos); /* borrowed */
    PyObject *proto = (protos && PyDict_Check(protos)) ? PyDict_GetItemWithError(protos, device) : NULL;
    Py_XINCREF(proto);
    Py_DECREF(md);
    if (PyErr_Occurred()) {
        Py_XDECREF(proto);
        return NULL;
    }
    int debug = 0;
    if (proto) {
        PyObject *dbg = PyObject_GetAttr(self->fake_config, s_debug);
        debug = dbg ? PyObject_IsTrue(dbg) : -1;
        Py_XDECREF(dbg);
        if (debug < 0) {
            Py_DECREF(proto);
            return NULL;
        }
    }
    if (!proto || debug) {
        Py_XDECREF(proto);
        PyObject *stack[3] = {fmode, meta, device};
        return PyObject_Vectorcall(self->py_wrap_fake, stack, 3, NULL);
    }
    PyObject *rg = PyObject_GetAttr(meta, s_requires_grad);
    if (!rg) {
        Py_DECREF(proto);
        return NULL;
    }
    PyObject *stack[5] = {self->fake_type, meta, rg, Py_True, device};
    PyObject *out = PyObject_Vectorcall(self->make_subclass, stack, 3, self->make_subclass_kwnames);
    Py_DECREF(rg);
    if (!out) {
        Py_DECREF(proto);
        return NULL;
    }
    PyObject *unsafe = PyObject_GetAttr(fmode, s_allow_unsafe);
    int u = unsafe ? PyObject_IsTrue(unsafe) : -1;
    Py_XDECREF(unsafe);
    PyObject *r = u < 0 ? NULL : PyObject_CallOneArg(u ? self->warn_mutable : self->throw_mutable, out);
    PyObject *od = r ? PyObject_GenericGetDict(out, NULL) : NULL;
    int rc = od ? PyDict_Update(od, proto) : -1;
    Py_XDECREF(r);
    Py_XDECREF(od);
    Py_DECREF(proto);
    if (rc < 0) Py_CLEAR(out);
    return out;
}

/* Note: [fast fake detach]: _fake_detach(t, mode) -- a new reference, or None where the caller must take
 * the ordinary path (not a plain FakeTensor of mode, a constant or real tensor attached, any failure) */
static PyObject *fast_detach(Core *self, PyObject *t, PyObject *mode) {
    if (!Py_IS_TYPE(t, (PyTypeObject *)self->fake_type)) Py_RETURN_NONE;
    PyObject *fmode = PyObject_GetAttr(t, s_fake_mode);
    PyObject *c = fmode ? PyObject_GetAttr(t, s_constant) : NULL;
    PyObject *rt = c ? PyObject_GetAttr(t, s_real_tensor) : NULL;
    PyObject *out = NULL;
    if (rt && (mode == NULL || fmode == mode) && c == Py_None && rt == Py_None) {
        PyObject *device = PyObject_GetAttr(t, s_device);
        PyObject *meta = device ? meta_detach(self, t, fmode) : NULL;
        if (meta) out = wrap_fake(self, fmode, meta, device);
        Py_XDECREF(meta);
        Py_XDECREF(device);
    }
    Py_XDECREF(fmode);
    Py_XDECREF(c);
    Py_XDECREF(rt);
    if (!out) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
        PyErr_Clear(); /* the ordinary path */
        Py_RETURN_NONE;
    }
    return out;
}

/* _fake_dispatch_fast(mode, func, types, args, kwargs): FakeTensorMode's dispatch with the detach short-cut */
static PyObject *Core_fast_dispatch(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    REQUIRE_STATE(self);
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "fast_dispatch(mode, func, types, args, kwargs)");
        return NULL;
    }
    PyObject *fargs = args[3], *kw = args[4];
    if (args[1] == self->detach && PyTuple_Check(fargs) && PyTuple_GET_SIZE(fargs) == 1 &&
        (kw == Py_None || (PyDict_Check(kw) && !PyDict_GET_SIZE(kw)))) {
        PyObject *out = fast_detach(self, PyTuple_GET_ITEM(fargs, 0), args[0]);
        if (!out) return NULL;
        if (out != Py_None) return out;
        Py_DECREF(out);
    }
    return PyObject_Vectorcall(self->fake_dispatch, args, 5, NULL);
}

/* ---------------------------------------------------------- fake mode hooks */

/* Note: [recorder fused into the fake mode], in C: the recording FakeTensorMode's
 * __torch_dispatch__ (installed on the mode instance as a bound method while this core's
 * recording is on). prim.* ops and an inactive recording go straight to FakeTensorMode. */
static PyObject *Core_dispatch(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    REQUIRE_STATE(self);
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "dispatch(mode, func, types, args, kwargs=None)");
        return NULL;
    }
    PyObject *mode = args[0], *func = args[1];
    PyObject *kw = nargs == 5 ? args[4] : Py_None;
    PyObject *full[5] = {mode, func, args[2], args[3], kw};
    /* what to do with func, cached per op: 0 prim (not recorded), 1 record, 2 record with fast detach */
    long kind;
    PyObject *k = PyDict_GetItemWithError(self->kinds, func); /* borrowed */
    if (k) {
        kind = PyLong_AsLong(k);
    } else {
        if (PyErr_Occurred()) return NULL;
        PyObject *ns = PyObject_GetAttr(func, s_namespace);
        if (!ns) return NULL;
        int is_prim = PyUnicode_Check(ns) && PyUnicode_Compare(ns, s_prim) == 0;
        Py_DECREF(ns);
        kind = is_prim ? 0 : (func == self->detach ? 2 : 1);
        PyObject *v = PyLong_FromLong(kind);
        if (!v || PyDict_SetItem(self->kinds, func, v) < 0) {
            Py_XDECREF(v);
            return NULL;
        }
        Py_DECREF(v);
    }
    if (kind) {
        PyObject *act = PyObject_GetAttr(self->state, s_active);
        if (!act) return NULL;
        int on = PyObject_IsTrue(act);
        Py_DECREF(act);
        if (on < 0) return NULL;
        if (!on) kind = 0;
    }
    if (!kind) return PyObject_Vectorcall(self->fake_dispatch, full, 5, NULL);
    PyObject *stack[7] = {self->state, kind == 2 ? self->c_fast_dispatch : self->fake_dispatch, mode, func,
                          args[2], args[3], kw};
    /* through state.run_op (normally this core's), like the Python mode does */
    return PyObject_VectorcallMethod(s_run_op, stack, 7 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* _FakeRecordingMode._fv_entry: hand the outermost op's dispatch-cache entry to record */
static int offer_entry(Core *self, PyObject *mode, PyObject *func, PyObject *entry) {
    PyObject *se = PyObject_GetAttr(mode, s_shape_env);
    if (!se) return -1;
    int plain = se == Py_None;
    Py_DECREF(se);
    if (!plain) return 0;
    PyObject *d = PyObject_GetAttr(self->local, s_dict);
    if (!d) return -1;
    int rc = 0;
    PyObject *dep = PyDict_GetItemWithError(d, s_depth); /* borrowed */
    if (dep && PyLong_Check(dep) && PyLong_AsLong(dep) == 1) {
        PyObject *cur = PyDict_GetItemWithError(d, s_entry);
        if (cur == Py_None || (!cur && !PyErr_Occurred())) {
            PyObject *t = PyTuple_Pack(2, func, entry);
            rc = t ? PyDict_SetItem(d, s_entry, t) : -1;
            Py_XDECREF(t);
        }
    }
    if (PyErr_Occurred()) rc = -1;
    Py_DECREF(d);
    return rc;
}

/* FakeTensorMode._output_from_cache_entry(mode, state, entry, key, func, args), offering entry first */
static PyObject *Core_output_from_entry(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    REQUIRE_STATE(self);
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "output_from_cache_entry(mode, state, entry, key, func, args)");
        return NULL;
    }
    if (offer_entry(self, args[0], args[4], args[2]) < 0) return NULL;
    return PyObject_Vectorcall(self->orig_from_entry, args, 6, NULL);
}

/* FakeTensorMode._make_cache_entry(mode, state, key, func, args, kwargs, output), then offer it */
static PyObject *Core_make_entry(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    REQUIRE_STATE(self);
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "make_cache_entry(mode, state, key, func, args, kwargs, output)");
        return NULL;
    }
    PyObject *entry = PyObject_Vectorcall(self->orig_make_entry, args, 7, NULL);
    if (!entry) return NULL;
    if (offer_entry(self, args[0], args[3], entry) < 0) {
        Py_DECREF(entry);
        return NULL;
    }
    return entry;
}

/* --------------------------------------------------------------- pack_saved */

/* Note: [saved tensors] -- _State.pack_saved */
static PyObject *pack_body(Core *self, PyObject *t);

static PyObject *Core_pack_saved(Core *self, PyObject *t) {
    REQUIRE_STATE(self);
    PyObject *g = tf_off(self);
    if (!g) return NULL;
    PyObject *r = pack_body(self, t);
    if (tf_on(g) < 0) Py_CLEAR(r);
    return r;
}

static PyObject *pack_body(Core *self, PyObject *t) {
    PyObject *act = PyObject_GetAttr(self->state, s_active);
    if (!act) return NULL;
    int active = PyObject_IsTrue(act);
    Py_DECREF(act);
    if (active <= 0) {
        if (active < 0) return NULL;
        Py_INCREF(t);
        return t;
    }
    /* add_roles(t, ROLE_SAVED): the common case (a live storage) here, the rest in Python */
    int handled = 0;
    PyObject *st = PyObject_CallMethodNoArgs(t, s_untyped_storage);
    PyObject *key = st ? PyObject_GetAttr(st, s_cdata) : NULL;
    if (key) {
        PyObject *hit = PyDict_GetItemWithError(self->live, key); /* borrowed */
        if (hit) {
            long long sid, roles;
            PyObject *so = PyObject_GetAttr(hit, s_sid);
            int rc = as_ll(so, &sid);
            Py_XDECREF(so);
            if (rc == 0) {
                Py_ssize_t i = (Py_ssize_t)sid * FV_ST_WIDTH + FV_ST_ROLES;
                PyObject *cur = PySequence_GetItem(self->std, i);
                rc = as_ll(cur, &roles);
                Py_XDECREF(cur);
                if (rc == 0) {
                    PyObject *nv = PyLong_FromLongLong(roles | self->role_saved);
                    rc = nv ? PySequence_SetItem(self->std, i, nv) : -1;
                    Py_XDECREF(nv);
                }
            }
            handled = rc == 0 ? 1 : -1;
        } else if (PyErr_Occurred()) {
            handled = -1;
        }
    } else {
        handled = -1;
    }
    Py_XDECREF(key);
    Py_XDECREF(st);
    if (handled <= 0) {
        PyErr_Clear(); /* the Python path says what it makes of it */
        PyObject *roles = PyLong_FromLongLong(self->role_saved), *minus = PyLong_FromLong(-1);
        PyObject *r =
            (roles && minus) ? PyObject_CallMethodObjArgs(self->state, s_storage_id, t, minus, roles, NULL) : NULL;
        Py_XDECREF(roles);
        Py_XDECREF(minus);
        if (!r) {
            PyErr_Clear(); /* never break autograd */
            Py_INCREF(t);
            return t;
        }
        Py_DECREF(r);
    }
    /* outputs of the node being built are saved as a grad_fn-less alias */
    PyObject *fn = PyObject_GetAttr(t, s_grad_fn);
    if (!fn) return NULL;
    if (fn == Py_None) {
        Py_DECREF(fn);
        Py_INCREF(t);
        return t;
    }
    PyObject *sn = PyObject_CallMethodNoArgs(fn, s_sequence_nr);
    Py_DECREF(fn);
    PyObject *cur = sn ? PyObject_CallNoArgs(self->get_seqnr) : NULL;
    long long a = 0, b = 0;
    int rc = (sn && cur && as_ll(sn, &a) == 0 && as_ll(cur, &b) == 0) ? 0 : -1;
    Py_XDECREF(sn);
    Py_XDECREF(cur);
    if (rc < 0) return NULL;
    if (a != b - 1) {
        Py_INCREF(t);
        return t;
    }
    PyObject *alias = fast_detach(self, t, NULL);
    if (!alias) return NULL;
    if (alias == Py_None) {
        Py_DECREF(alias);
        PyObject *stack[2] = {self->state, t};
        return PyObject_VectorcallMethod(s_saved_alias, stack, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    /* the alias takes t's tensor id, so backward ops name the forward tensor */
    PyObject *td = PyObject_GenericGetDict(t, NULL);
    PyObject *tag = td ? PyDict_GetItemWithError(td, s_tid) : NULL;
    rc = td ? 0 : -1;
    if (tag) {
        PyObject *ad = PyObject_GenericGetDict(alias, NULL);
        rc = ad ? PyDict_SetItem(ad, s_tid, tag) : -1;
        Py_XDECREF(ad);
    } else if (PyErr_Occurred()) {
        rc = -1;
    }
    Py_XDECREF(td);
    if (rc < 0) Py_CLEAR(alias);
    return alias;
}

/* ------------------------------------------------------------------ type */

static int Core_traverse(Core *self, visitproc visit, void *arg) {
    Py_VISIT(self->state);
    Py_VISIT(self->live);
    Py_VISIT(self->fast);
    Py_VISIT(self->fw_stack);
    Py_VISIT(self->fw_lines);
    Py_VISIT(self->unpacked);
    Py_VISIT(self->internal_code);
    Py_VISIT(self->line_ids);
    Py_VISIT(self->sn_cache);
    Py_VISIT(self->meta_ids);
    Py_VISIT(self->opd);
    Py_VISIT(self->outd);
    Py_VISIT(self->in_tensor);
    Py_VISIT(self->std);
    Py_VISIT(self->in_frombytes);
    Py_VISIT(self->out_frombytes);
    Py_VISIT(self->op_frombytes);
    Py_VISIT(self->std_frombytes);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->fake_type);
    Py_VISIT(self->detach);
    Py_VISIT(self->lift_fresh);
    Py_VISIT(self->graph_task_id);
    Py_VISIT(self->current_node);
    Py_VISIT(self->get_seqnr);
    Py_VISIT(self->param_new_code);
    Py_VISIT(self->disable_tf);
    Py_VISIT(self->ref_type);
    Py_VISIT(self->local);
    Py_VISIT(self->range_error);
    Py_VISIT(self->c_fast_dispatch);
    Py_VISIT(self->unsafe_view);
    Py_VISIT(self->tf_mode_enabled);
    Py_VISIT(self->make_subclass_kwnames);
    Py_VISIT(self->py_wrap_fake);
    Py_VISIT(self->throw_mutable);
    Py_VISIT(self->warn_mutable);
    Py_VISIT(self->fake_config);
    Py_VISIT(self->make_subclass);
    Py_VISIT(self->detach_op);
    Py_VISIT(self->preserve_keys);
    Py_VISIT(self->disable_td);
    Py_VISIT(self->set_meta_in_tls);
    Py_VISIT(self->meta_in_tls);
    Py_VISIT(self->kinds);
    Py_VISIT(self->orig_make_entry);
    Py_VISIT(self->orig_from_entry);
    Py_VISIT(self->fake_dispatch);
    return 0;
}

static int Core_clear(Core *self) {
    Py_CLEAR(self->state);
    Py_CLEAR(self->live);
    Py_CLEAR(self->fast);
    Py_CLEAR(self->fw_stack);
    Py_CLEAR(self->fw_lines);
    Py_CLEAR(self->unpacked);
    Py_CLEAR(self->internal_code);
    Py_CLEAR(self->line_ids);
    Py_CLEAR(self->sn_cache);
    Py_CLEAR(self->meta_ids);
    Py_CLEAR(self->opd);
    Py_CLEAR(self->outd);
    Py_CLEAR(self->in_tensor);
    Py_CLEAR(self->std);
    Py_CLEAR(self->in_frombytes);
    Py_CLEAR(self->out_frombytes);
    Py_CLEAR(self->op_frombytes);
    Py_CLEAR(self->std_frombytes);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->fake_type);
    Py_CLEAR(self->detach);
    Py_CLEAR(self->lift_fresh);
    Py_CLEAR(self->graph_task_id);
    Py_CLEAR(self->current_node);
    Py_CLEAR(self->get_seqnr);
    Py_CLEAR(self->param_new_code);
    Py_CLEAR(self->disable_tf);
    Py_CLEAR(self->ref_type);
    Py_CLEAR(self->local);
    Py_CLEAR(self->range_error);
    Py_CLEAR(self->c_fast_dispatch);
    Py_CLEAR(self->unsafe_view);
    Py_CLEAR(self->tf_mode_enabled);
    Py_CLEAR(self->make_subclass_kwnames);
    Py_CLEAR(self->py_wrap_fake);
    Py_CLEAR(self->throw_mutable);
    Py_CLEAR(self->warn_mutable);
    Py_CLEAR(self->fake_config);
    Py_CLEAR(self->make_subclass);
    Py_CLEAR(self->detach_op);
    Py_CLEAR(self->preserve_keys);
    Py_CLEAR(self->disable_td);
    Py_CLEAR(self->set_meta_in_tls);
    Py_CLEAR(self->meta_in_tls);
    Py_CLEAR(self->kinds);
    Py_CLEAR(self->orig_make_entry);
    Py_CLEAR(self->orig_from_entry);
    Py_CLEAR(self->fake_dispatch);
    return 0;
}

static void Core_dealloc(Core *self) {
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int take(PyObject *kw, const char *name, PyObject **slot) {
    PyObject *v = PyDict_GetItemString(kw, name); /* borrowed */
    if (!v) {
        PyErr_Format(PyExc_TypeError, "fakeviz core: missing %s", name);
        return -1;
    }
    Py_INCREF(v);
    Py_XSETREF(*slot, v);
    return 0;
}

static int take_ll(PyObject *kw, const char *name, long long *v) {
    PyObject *o = PyDict_GetItemString(kw, name);
    if (!o) {
        PyErr_Format(PyExc_TypeError, "fakeviz core: missing %s", name);
        return -1;
    }
    return as_ll(o, v);
}

static int Core_init(Core *self, PyObject *args, PyObject *kw) {
    if (!kw || PyTuple_GET_SIZE(args)) {
        PyErr_SetString(PyExc_TypeError, "Core(**parts): keyword arguments only");
        return -1;
    }
    long long every;
    PyObject *layout = NULL;
    if (take(kw, "state", &self->state) || take(kw, "live", &self->live) || take(kw, "fast", &self->fast) ||
        take(kw, "fw_stack", &self->fw_stack) || take(kw, "fw_lines", &self->fw_lines) ||
        take(kw, "unpacked", &self->unpacked) || take(kw, "internal_code", &self->internal_code) ||
        take(kw, "line_ids", &self->line_ids) || take(kw, "sn_cache", &self->sn_cache) ||
        take(kw, "meta_ids", &self->meta_ids) || take(kw, "opd", &self->opd) || take(kw, "outd", &self->outd) ||
        take(kw, "in_tensor", &self->in_tensor) || take(kw, "std", &self->std) ||
        take(kw, "tensor_type", &self->tensor_type) || take(kw, "fake_type", &self->fake_type) ||
        take(kw, "detach", &self->detach) || take(kw, "lift_fresh", &self->lift_fresh) ||
        take(kw, "unsafe_view", &self->unsafe_view) ||
        take(kw, "torch_function_mode_enabled", &self->tf_mode_enabled) ||
        take(kw, "graph_task_id", &self->graph_task_id) || take(kw, "current_node", &self->current_node) ||
        take(kw, "get_sequence_nr", &self->get_seqnr) || take(kw, "param_new_code", &self->param_new_code) ||
        take(kw, "disable_tf", &self->disable_tf) || take(kw, "storage_ref", &self->ref_type) ||
        take(kw, "local", &self->local) ||
        take(kw, "range_error", &self->range_error) || take(kw, "fake_dispatch", &self->fake_dispatch) ||
        take(kw, "output_from_cache_entry", &self->orig_from_entry) ||
        take(kw, "make_cache_entry", &self->orig_make_entry) || take(kw, "meta_in_tls", &self->meta_in_tls) ||
        take(kw, "set_meta_in_tls", &self->set_meta_in_tls) || take(kw, "disable_torch_dispatch", &self->disable_td) ||
        take(kw, "preserve_dispatch_keys", &self->preserve_keys) || take(kw, "detach_op", &self->detach_op) ||
        take(kw, "make_subclass", &self->make_subclass) || take(kw, "fake_config", &self->fake_config) ||
        take(kw, "warn_mutable_data_ptr", &self->warn_mutable) ||
        take(kw, "throw_mutable_data_ptr", &self->throw_mutable) || take(kw, "wrap_fake", &self->py_wrap_fake) ||
        take_ll(kw, "tbase", &self->tbase) || take_ll(kw, "ttop", &self->ttop) || take(kw, "layout", &layout) ||
        take_ll(kw, "progress_every", &every) || take_ll(kw, "role_saved", &self->role_saved)) {
        Py_XDECREF(layout);
        return -1;
    }
    /* the layout Python records with (fakeviz._engine.native.layout_signature()) must be the one
     * this build's header was generated from */
    int same_layout = PyUnicode_Check(layout) && PyUnicode_CompareWithASCIIString(layout, FV_LAYOUT) == 0;
    Py_DECREF(layout);
    if (!PyDict_CheckExact(self->live) || !PyDict_CheckExact(self->fast) || !PyList_CheckExact(self->fw_stack) ||
        !PyList_CheckExact(self->fw_lines) || !PyDict_CheckExact(self->unpacked) ||
        !PyDict_CheckExact(self->internal_code) || !PyDict_CheckExact(self->line_ids) ||
        !PyDict_CheckExact(self->sn_cache) || !PyDict_CheckExact(self->meta_ids) || !PyType_Check(self->tensor_type) ||
        !PyType_Check(self->fake_type)) {
        PyErr_SetString(PyExc_TypeError, "fakeviz core: unexpected container types");
        return -1;
    }
    if (!same_layout || every <= 0 || every % FV_OP_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "fakeviz core: trace layout differs from this build");
        return -1;
    }
    self->progress_every = (Py_ssize_t)every;
    static const char *fb = "frombytes";
    Py_XSETREF(self->in_frombytes, PyObject_GetAttrString(self->in_tensor, fb));
    Py_XSETREF(self->out_frombytes, PyObject_GetAttrString(self->outd, fb));
    Py_XSETREF(self->op_frombytes, PyObject_GetAttrString(self->opd, fb));
    Py_XSETREF(self->std_frombytes, PyObject_GetAttrString(self->std, fb));
    Py_XSETREF(self->kinds, PyDict_New());
    if (!self->kinds) return -1;
    Py_XSETREF(self->make_subclass_kwnames, Py_BuildValue("(ss)", "dispatch_device", "device_for_backend_keys"));
    if (!self->make_subclass_kwnames) return -1;
    Py_XSETREF(self->c_fast_dispatch, PyObject_GetAttrString((PyObject *)self, "fast_dispatch"));
    if (!self->c_fast_dispatch) return -1;
    if (!self->in_frombytes || !self->out_frombytes || !self->op_frombytes || !self->std_frombytes) return -1;
    return 0;
}

static PyMethodDef Core_methods[] = {
    {"record", (PyCFunction)(void (*)(void))Core_record, METH_FASTCALL,
     "record(func, args, kwargs, out, entry): _State.record in C"},
    {"pack_saved", (PyCFunction)Core_pack_saved, METH_O, "pack_saved(t): _State.pack_saved in C"},
    {"on_free", (PyCFunction)Core_on_free, METH_O, "on_free(ref): _State._on_free in C"},
    {"fast_dispatch", (PyCFunction)(void (*)(void))Core_fast_dispatch, METH_FASTCALL,
     "fast_dispatch(mode, func, types, args, kwargs): _fake_dispatch_fast in C"},
    {"dispatch", (PyCFunction)(void (*)(void))Core_dispatch, METH_FASTCALL,
     "dispatch(mode, func, types, args, kwargs=None): the recording mode's __torch_dispatch__"},
    {"output_from_cache_entry", (PyCFunction)(void (*)(void))Core_output_from_entry, METH_FASTCALL,
     "FakeTensorMode._output_from_cache_entry, handing the entry to record"},
    {"make_cache_entry", (PyCFunction)(void (*)(void))Core_make_entry, METH_FASTCALL,
     "FakeTensorMode._make_cache_entry, handing the entry to record"},
    {"run_op", (PyCFunction)(void (*)(void))Core_run_op, METH_FASTCALL,
     "run_op(impl, mode, func, types, args, kwargs): _State.run_op in C"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fakeviz._fvcore.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The recorder's per-op path (Note: [recorder core in C]).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_fvcore", "fakeviz recorder core", -1, NULL};

#define INTERN(var, text)                                         \
    do {                                                          \
        if (!(var = PyUnicode_InternFromString(text))) return NULL; \
    } while (0)

PyMODINIT_FUNC PyInit__fvcore(void) {
    INTERN(s_tid, "_fakeviz_tid");
    INTERN(s_untyped_storage, "untyped_storage");
    INTERN(s_cdata, "_cdata");
    INTERN(s_sid, "sid");
    INTERN(s_in_optimizer, "in_optimizer");
    INTERN(s_seen_forward, "seen_forward");
    INTERN(s_progress, "progress");
    INTERN(s_bw_line, "bw_line");
    INTERN(s_sequence_nr, "_sequence_nr");
    INTERN(s_tensor_id, "tensor_id");
    INTERN(s_is_internal, "_is_internal");
    INTERN(s_line_id, "_line_id");
    INTERN(s_record_full, "_record_full");
    INTERN(s_bw_module, "_bw_module");
    INTERN(s_report_progress, "_report_progress");
    INTERN(s_output, "_output");
    INTERN(s_next_tensor, "next_tensor");
    INTERN(s_shape, "shape");
    INTERN(s_stride, "stride");
    INTERN(s_dtype, "dtype");
    INTERN(s_device, "device");
    INTERN(s_nbytes, "nbytes");
    INTERN(s_storage_offset, "storage_offset");
    INTERN(s_active, "active");
    INTERN(s_storage_id, "storage_id");
    INTERN(s_grad_fn, "grad_fn");
    INTERN(s_saved_alias, "_saved_alias");
    INTERN(s_py_record, "_py_record");
    INTERN(s_key, "key");
    INTERN(s_on_free, "on_free");
    INTERN(s_dict, "__dict__");
    INTERN(s_depth, "depth");
    INTERN(s_record, "record");
    INTERN(s_namespace, "_namespace");
    INTERN(s_prim, "prim");
    INTERN(s_shape_env, "shape_env");
    INTERN(s_run_op, "run_op");
    INTERN(s_fake_mode, "fake_mode");
    INTERN(s_constant, "constant");
    INTERN(s_real_tensor, "real_tensor");
    INTERN(s_in_kernel, "in_kernel_invocation");
    INTERN(s_protos, "_fv_protos");
    INTERN(s_debug, "debug");
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_allow_unsafe, "_allow_unsafe_data_ptr_access");
    INTERN(s_enter, "__enter__");
    INTERN(s_exit, "__exit__");
    INTERN(s_entry, "entry");
    INTERN(s_op_failed, "_op_failed");
    INTERN(s_range_failed, "_range_failed");
    INTERN(s_internal_error, "internal_error");
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
