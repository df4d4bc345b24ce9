/* fvcore/hooks.c: the recording fake mode's hooks: __torch_dispatch__ (Note: [recorder fused into
 * the fake mode]) and the two dispatch-cache hooks that offer an op's cache entry to record.
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */

/* ---------------------------------------------------------- fake mode hooks */

/* Note: [threads] (fakeviz/_engine/patches.py): whether an op dispatched on a thread other than the record's is
 * the record's (1) or not (0; -1 on error): autograd's worker thread running the record's backward, which
 * state.own_thread() claims for the record, once per worker thread and graph task. */
static int own_thread(Core *self) {
    unsigned long me = PyThread_get_thread_ident();
    PyObject *g = PyObject_CallNoArgs(self->graph_task_id);
    if (!g) return -1;
    long long task = PyLong_AsLongLong(g);
    Py_DECREF(g);
    if (task == -1 && PyErr_Occurred()) return -1;
    if (task < 0) return 0; /* not a backward: another thread's op on the record's tensors */
    if (me == self->worker && task == self->task) return 1;
    PyObject *r = PyObject_CallMethodNoArgs(self->state, s_own_thread);
    if (!r) return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (ok == 1) {
        self->worker = me;
        self->task = task;
    }
    return ok;
}

/* Note: [recorder fused into the fake mode], in C: the recording FakeTensorMode's
 * __torch_dispatch__ (installed on the mode instance as a bound method while this core's
 * recording is on). prim.* ops, an inactive recording and another thread's ops go straight to FakeTensorMode. */
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
        if (on && PyThread_get_thread_ident() != (unsigned long)self->owner) on = own_thread(self); /* Note: [threads] */
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
    return PyObject_Vectorcall(self->output_from_cache_entry, args, 6, NULL);
}

/* FakeTensorMode._make_cache_entry(mode, state, key, func, args, kwargs, output), then offer it */
static PyObject *Core_make_entry(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    REQUIRE_STATE(self);
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "make_cache_entry(mode, state, key, func, args, kwargs, output)");
        return NULL;
    }
    PyObject *entry = PyObject_Vectorcall(self->make_cache_entry, args, 7, NULL);
    if (!entry) return NULL;
    if (offer_entry(self, args[0], args[3], entry) < 0) {
        Py_DECREF(entry);
        return NULL;
    }
    return entry;
}
