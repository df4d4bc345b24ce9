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

#define FV_VISIT(name) Py_VISIT(self->name);
#define FV_CLEAR(name) Py_CLEAR(self->name);
#define FV_MADE(X) X(in_frombytes) X(out_frombytes) X(op_frombytes) X(std_frombytes) X(kinds) \
    X(make_subclass_kwnames) X(c_fast_dispatch)

static int Core_traverse(Core *self, visitproc visit, void *arg) {
    FV_CORE_OBJECTS(FV_VISIT)
    FV_MADE(FV_VISIT)
    return 0;
}

static int Core_clear(Core *self) {
    FV_CORE_OBJECTS(FV_CLEAR)
    FV_MADE(FV_CLEAR)
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
    /* exactly the arguments of native_contract.CORE_ARGUMENTS: one more is a name C would never read */
    if (PyDict_Size(kw) != FV_CORE_NARGS) {
        PyErr_Format(PyExc_TypeError, "fakeviz core: %zd arguments where this build takes %d (its contract: %s)",
                     PyDict_Size(kw), FV_CORE_NARGS, FV_CONTRACT);
        return -1;
    }
    PyObject *layout = NULL;
#define FV_TAKE(name) take(kw, #name, &self->name) ||
#define FV_TAKE_LL(name) take_ll(kw, #name, &self->name) ||
    if (FV_CORE_OBJECTS(FV_TAKE) FV_CORE_INTS(FV_TAKE_LL) take(kw, FV_CORE_LAYOUT, &layout)) {
        Py_XDECREF(layout);
        return -1;
    }
    /* the layout Python records with (fakeviz._engine.native.layout_signature()) must be the one
     * this build's header was generated from */
    int same_layout = PyUnicode_Check(layout) && PyUnicode_CompareWithASCIIString(layout, FV_LAYOUT) == 0;
    Py_DECREF(layout);
    if (!PyDict_CheckExact(self->live) || !PyDict_CheckExact(self->op_cache) || !PyList_CheckExact(self->fw_stack) ||
        !PyList_CheckExact(self->fw_lines) || !PyDict_CheckExact(self->unpacked) ||
        !PyDict_CheckExact(self->internal_code) || !PyDict_CheckExact(self->line_ids) ||
        !PyDict_CheckExact(self->module_by_seq_nr) || !PyDict_CheckExact(self->meta_ids) || !PyType_Check(self->tensor_type) ||
        !PyType_Check(self->fake_type)) {
        PyErr_SetString(PyExc_TypeError, "fakeviz core: unexpected container types");
        return -1;
    }
    if (!same_layout || self->progress_every <= 0 || self->progress_every % FV_OP_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "fakeviz core: trace layout differs from this build");
        return -1;
    }
    self->worker = 0;
    self->task = -1;
    static const char *fb = "frombytes";
    Py_XSETREF(self->in_frombytes, PyObject_GetAttrString(self->in_tensor, fb));
    Py_XSETREF(self->out_frombytes, PyObject_GetAttrString(self->out_rows, fb));
    Py_XSETREF(self->op_frombytes, PyObject_GetAttrString(self->op_rows, fb));
    Py_XSETREF(self->std_frombytes, PyObject_GetAttrString(self->storage_rows, fb));
    Py_XSETREF(self->kinds, PyDict_New());
    if (!self->kinds) return -1;
    Py_XSETREF(self->make_subclass_kwnames, Py_BuildValue("(ss)", FV_KW_DISPATCH_DEVICE, FV_KW_DEVICE_FOR_BACKEND_KEYS));
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

PyMODINIT_FUNC PyInit__fvcore(void) {
    if (fv_intern_names() < 0) return NULL;
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    /* the contract this core was built with: native._load uses no core built from another declaration */
    if (PyModule_AddStringConstant(m, "CONTRACT", FV_CONTRACT) < 0 ||
        PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
