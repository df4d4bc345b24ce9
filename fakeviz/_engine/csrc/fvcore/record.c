/* fvcore/record.c: _State.record: an op's row from its inputs, outputs and the recorded op
 * cache (Note: [recorded op cache]), with torch function off (Note: [torch function off while
 * recording]).
 * Part of the recorder core (Note: [recorder core in C] in fakeviz/_engine/native.py),
 * included by ../fvcore.c: one translation unit, so every function stays static and inlines
 * across parts; not compiled on its own. */

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

/* the ids of an argument: a tensor, or every tensor of a Tensor[] / Tensor?[] list, whose first item is a
 * tensor or None (Note: [tensor lists in the op log] in recorder/ops.py); anything else has none */
static int push_inputs(Core *self, ibuf *ids, PyObject *a, PyTypeObject *tt) {
    if (PyObject_TypeCheck(a, tt)) return push_input(self, ids, a);
    if (!PyList_CheckExact(a) || !PyList_GET_SIZE(a)) return 0;
    PyObject *first = PyList_GET_ITEM(a, 0);
    if (first != Py_None && !PyObject_TypeCheck(first, tt)) return 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(a); j++) {
        PyObject *x = PyList_GET_ITEM(a, j);
        if (PyObject_TypeCheck(x, tt) && push_input(self, ids, x) < 0) return -1;
    }
    return 0;
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

/* in fvcore/detach.c */
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
    PyObject *on = PyObject_CallNoArgs(self->torch_function_mode_enabled);
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
            PyObject *tag = ud ? PyDict_GetItemWithError(ud, s_fakeviz_tid) : NULL;
            int rc = ud ? 0 : -1;
            if (!tag && PyErr_Occurred()) rc = -1;
            if (tag && PyObject_TypeCheck(out, (PyTypeObject *)self->tensor_type)) {
                PyObject *od = PyObject_GenericGetDict(out, NULL);
                if (!od || PyDict_SetItem(od, s_fakeviz_tid, tag) < 0) rc = -1;
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
    for (Py_ssize_t i = 0; i < na; i++)
        if (push_inputs(self, &ids, PyTuple_GET_ITEM(fargs, i), tt) < 0) goto done;
    if (kwargs != Py_None && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v))
            if (push_inputs(self, &ids, v, tt) < 0) goto done;
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
            hit = PyDict_GetItemWithError(self->op_cache, own); /* borrowed; equal keys */
        } else {
            entry_key = PyLong_FromVoidPtr(entry);
            if (!entry_key) goto done;
            hit = PyDict_GetItemWithError(self->op_cache, entry_key); /* borrowed */
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
                PyObject *seq = PySequence_Fast(out, "fakeviz core: an op's outputs are a sequence");
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
    Py_ssize_t n_in = PyObject_Size(self->in_tensor), n_outd = PyObject_Size(self->out_rows);
    if (n_in < 0 || n_outd < 0) goto done;
    long long row[FV_OP_WIDTH] = {
        [FV_OP_OP] = op_id, [FV_OP_PHASE] = phase, [FV_OP_MODULE] = module, [FV_OP_LINE] = line,
        [FV_OP_ARGS] = aid, [FV_OP_IN_END] = n_in, [FV_OP_OUT_END] = n_outd / FV_OUT_WIDTH,
        [FV_OP_FLAGS] = flags, [FV_OP_FLOPS] = flops,
    };
    if (extend(self->op_frombytes, row, FV_OP_WIDTH) < 0) goto done;
    Py_ssize_t n_opd = PyObject_Size(self->op_rows);
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
