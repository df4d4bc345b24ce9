/* fvcore/run_op.c: _State.run_op: run one op, record it if outermost, and hand failures to
 * the Python state.
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */

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
    if (depth == 0 && out != Py_NotImplemented) { /* Note: [wrapper calls are not ops] */
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
