/* fvcore/rows.c: output rows (_State._output) and where an op is: its user source line, the
 * Parameter.__new__ check (Note: [Parameter detach]) and the backward module.
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */

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
            /* a sparse tensor has no strides or nbytes (Note: [sparse tensors in the record] in
             * recorder/storages.py): the Python path knows its layout, and raises any other error itself */
            if (PyErr_Occurred()) {
                if (!is_storage_error()) return -1;
                PyErr_Clear();
            }
            return state_call_ll(self, s_output, flag, &t, 1); /* the Python path does it all */
        }
    }
    /* tensor id: an in-place op returns its (tagged) input, anything else is new (Note: [op log numbering]) */
    PyObject *d = NULL;
    long long tid;
    int f = own_tid(self, t, &d, &tid);
    if (f < 0) return -1;
    if (!f) {
        PyObject *nt = PyObject_GetAttr(self->state, s_next_tensor);
        int rc = as_ll(nt, &tid);
        Py_XDECREF(nt);
        PyObject *n1 = rc == 0 ? PyLong_FromLongLong(tid + 1) : NULL;
        PyObject *tag = rc == 0 ? PyLong_FromLongLong(self->tid_base + tid) : NULL;
        if (!n1 || !tag || PyObject_SetAttr(self->state, s_next_tensor, n1) < 0 ||
            PyDict_SetItem(d, s_fakeviz_tid, tag) < 0) {
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
    PyObject *m = PyDict_GetItemWithError(self->module_by_seq_nr, sn); /* borrowed */
    Py_DECREF(sn);
    if (m) return as_ll(m, module);
    if (PyErr_Occurred()) return -1;
    return state_call_ll(self, s_bw_module, module, NULL, 0);
}

static int list_last_ll(PyObject *list, long long *v) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    return as_ll(PyList_GET_ITEM(list, n - 1), v);
}
