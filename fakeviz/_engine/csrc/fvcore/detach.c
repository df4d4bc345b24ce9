/* fvcore/detach.c: the fast fake detach (Note: [fast fake detach]): the guard helpers, the meta
 * detach, the light FakeTensor wrap, and _fake_dispatch_fast.
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */

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
    PyObject *prev = PyObject_GetAttr(fmode, s_in_kernel_invocation);
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
    PyObject *g1 = guard_enter(self->disable_torch_dispatch);
    if (g1) {
        if (PyObject_SetAttr(fmode, s_in_kernel_invocation, Py_True) == 0) {
            PyObject *g2 = guard_enter(self->preserve_dispatch_keys);
            if (g2) {
                PyObject *r = PyObject_CallOneArg(self->set_meta_in_tls, Py_True);
                if (r) {
                    Py_DECREF(r);
                    meta = PyObject_CallOneArg(self->detach_op, t);
                }
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                int rc = PyObject_SetAttr(fmode, s_in_kernel_invocation, prev);
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
    PyObject *protos = PyDict_GetItemWithError(md, s_fv_protos); /* borrowed */
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
        return PyObject_Vectorcall(self->wrap_fake, stack, 3, NULL);
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
    PyObject *unsafe = PyObject_GetAttr(fmode, s_allow_unsafe_data_ptr_access);
    int u = unsafe ? PyObject_IsTrue(unsafe) : -1;
    Py_XDECREF(unsafe);
    PyObject *r = u < 0 ? NULL : PyObject_CallOneArg(u ? self->warn_mutable_data_ptr : self->throw_mutable_data_ptr, out);
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
