/* fvcore/pack.c: _State.pack_saved, autograd's saved-tensor pack hook (Note: [saved tensors]).
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */

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
                PyObject *cur = PySequence_GetItem(self->storage_rows, i);
                rc = as_ll(cur, &roles);
                Py_XDECREF(cur);
                if (rc == 0) {
                    PyObject *nv = PyLong_FromLongLong(roles | self->role_saved);
                    rc = nv ? PySequence_SetItem(self->storage_rows, i, nv) : -1;
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
    PyObject *cur = sn ? PyObject_CallNoArgs(self->get_sequence_nr) : NULL;
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
    PyObject *tag = td ? PyDict_GetItemWithError(td, s_fakeviz_tid) : NULL;
    rc = td ? 0 : -1;
    if (tag) {
        PyObject *ad = PyObject_GenericGetDict(alias, NULL);
        rc = ad ? PyDict_SetItem(ad, s_fakeviz_tid, tag) : -1;
        Py_XDECREF(ad);
    } else if (PyErr_Occurred()) {
        rc = -1;
    }
    Py_XDECREF(td);
    if (rc < 0) Py_CLEAR(alias);
    return alias;
}
