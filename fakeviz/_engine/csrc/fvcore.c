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
 *
 * This file holds the Core type and the module; the rest is in the parts under fvcore/,
 * included below into this one translation unit (a unity build: every function stays
 * static and the compiler inlines across parts as it did in one file):
 *   core.h      the row layout (generated fv_schema.h), interned names, the Core struct, helpers
 *   storages.c  storage rows and their free callback (new_storage, on_free)
 *   rows.c      output rows and where an op is (user line, Parameter.__new__, backward module)
 *   record.c    record: an op's row, the recorded op cache, torch function off
 *   run_op.c    run_op: run an op, record it if outermost, hand failures to Python
 *   detach.c    the fast fake detach and fast_dispatch
 *   hooks.c     the fake mode's __torch_dispatch__ and dispatch-cache hooks
 *   pack.c      pack_saved, autograd's saved-tensor hook
 * fakeviz/_engine/native.py hashes this file and every part into the cached build's name.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <string.h>
#include <math.h>
/* the parts, in this order (each uses only what the ones before it define, but for the two guard
 * helpers record.c declares); each says what it holds at its top */
#include "fvcore/core.h"
#include "fvcore/storages.c"
#include "fvcore/rows.c"
#include "fvcore/record.c"
#include "fvcore/run_op.c"
#include "fvcore/detach.c"
#include "fvcore/hooks.c"
#include "fvcore/pack.c"

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
    long long every, owner;
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
        take_ll(kw, "progress_every", &every) || take_ll(kw, "role_saved", &self->role_saved) ||
        take_ll(kw, "owner", &owner)) {
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
    self->owner = (unsigned long)owner; /* threading.get_ident() of the record's thread */
    self->worker = 0;
    self->task = -1;
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
    INTERN(s_own_thread, "own_thread");
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
