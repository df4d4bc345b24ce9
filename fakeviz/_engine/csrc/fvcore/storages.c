/* fvcore/storages.c: storage rows: _State._new_storage, the weakref free callback (_State._on_free)
 * and the storage id of an output.
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */

/* _State._new_storage: a new storage row, watched for its free */
static int new_storage(Core *self, PyObject *st, PyObject *key, long long devid, long long seq, long long roles,
                       long long *sid) {
    Py_ssize_t n = PyObject_Size(self->storage_rows);
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
        [FV_ST_ROLES] = roles,  [FV_ST_NAME] = -1,   [FV_ST_OWNER] = -1,    [FV_ST_CARRIED] = -1,
    };
    if (extend(self->std_frombytes, row, FV_ST_WIDTH) < 0) return -1;
    PyObject *cb = PyObject_GetAttr(self->state, s_on_free);
    if (!cb) return -1;
    PyObject *ref = PyObject_CallFunctionObjArgs(self->storage_ref, st, cb, NULL);
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
    rc = PySequence_SetItem(self->storage_rows, (Py_ssize_t)sid * FV_ST_WIDTH + FV_ST_FREE, v);
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
