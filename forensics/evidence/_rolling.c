/* Rolling order statistics of a float64 series, in C: scipy.ndimage's 1-D rank filter
 * (mode="nearest") for the short windows of forensics.evidence.rolling, one or two ranks a
 * pass, with the GIL released.
 *
 * rank(v, size, ranks, outs, start, stop): for each i in [start, stop), outs[j][i] is the
 * ranks[j]-th smallest value of the window v[i - size // 2 : i - size // 2 + size], its
 * indices clamped to the series (the edge values repeated: mode="nearest"). The same values
 * as ndimage.rank_filter(v, rank, size, mode="nearest") for any input without NaN: an order
 * statistic of a multiset is one value, whatever algorithm selects it (the callers pass no
 * -0.0 either: rolling.selectable).
 *
 * Why C: the spike search takes a dozen rolling medians of a million points; scipy's filter
 * holds the GIL for about 35 ms each, and an even window's median is two of its passes. Here
 * the window is kept as a sorted array: each step counts the values below the leaving and the
 * arriving value, moves the values between them one place, and puts the arriving value in
 * the gap. Per rank a little faster than scipy's filter for the windows used (9 to 41
 * points: 25 to 36 ms a million points against 30 to 40 here); both middle values of an even
 * window come from the same pass, and the caller splits the series between two threads.
 * The counting grows with the window: rolling.py takes scipy's filter above 64 points.
 * The module is optional: without a C compiler forensics calls scipy's filter.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZE 1024
#define MAX_RANKS 2

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline Py_ssize_t clamp(Py_ssize_t j, Py_ssize_t n) {
    return j < 0 ? 0 : (j >= n ? n - 1 : j);
}

/* With AVX2 the counting loop compares four values at a time (a third less time at 41
 * points); GCC builds both versions and picks one when the module loads. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROLLING_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ROLLING_CLONES
#endif

ROLLING_CLONES
static void run(const double *v, Py_ssize_t n, Py_ssize_t w, const Py_ssize_t *ranks, int nr,
                double **outs, Py_ssize_t start, Py_ssize_t stop, double *s) {
    Py_ssize_t left = w / 2;
    for (Py_ssize_t k = 0; k < w; k++) s[k] = v[clamp(start - left + k, n)];
    qsort(s, (size_t)w, sizeof(double), cmp_double);
    for (Py_ssize_t i = start;; i++) {
        for (int j = 0; j < nr; j++) outs[j][i] = s[ranks[j]];
        if (i + 1 >= stop) break;
        double gone = v[clamp(i - left, n)], come = v[clamp(i - left + w, n)];
        if (gone == come) continue;
        /* Where each lies: the number of values below it (no branch to mispredict; int
         * counters vectorise best). s[p] == gone: it is in the window. */
        Py_ssize_t p = 0, q = 0;
        for (Py_ssize_t k = 0; k < w; k++) {
            p += s[k] < gone;
            q += s[k] < come;
        }
        if (q > p) { /* gone leaves; the values (p, q) move down one place */
            for (Py_ssize_t k = p; k < q - 1; k++) s[k] = s[k + 1];
            s[q - 1] = come;
        } else { /* the values [q, p) move up one place */
            for (Py_ssize_t k = p; k > q; k--) s[k] = s[k - 1];
            s[q] = come;
        }
    }
}

static PyObject *rank(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *vo, *rankso, *outso;
    Py_ssize_t w, start, stop;
    if (!PyArg_ParseTuple(args, "OnOOnn", &vo, &w, &rankso, &outso, &start, &stop)) return NULL;
    Py_buffer vb;
    if (PyObject_GetBuffer(vo, &vb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    Py_buffer ob[MAX_RANKS];
    int nb = 0;
    PyObject *result = NULL, *rf = NULL, *of = NULL;
    double *s = NULL;
    Py_ssize_t n = vb.len / 8, ranks[MAX_RANKS];
    double *outs[MAX_RANKS];
    if (vb.itemsize != 8 || vb.format == NULL || strcmp(vb.format, "d") != 0) {
        PyErr_SetString(PyExc_ValueError, "expected a C-contiguous float64 array");
        goto done;
    }
    if (w < 1 || w > MAX_SIZE || n < 1 || start < 0 || stop > n || start >= stop) {
        PyErr_SetString(PyExc_ValueError, "bad window or range");
        goto done;
    }
    rf = PySequence_Fast(rankso, "ranks must be a sequence");
    of = PySequence_Fast(outso, "outs must be a sequence");
    if (rf == NULL || of == NULL) goto done;
    Py_ssize_t nr = PySequence_Fast_GET_SIZE(rf);
    if (nr < 1 || nr > MAX_RANKS || PySequence_Fast_GET_SIZE(of) != nr) {
        PyErr_SetString(PyExc_ValueError, "one or two ranks, an output array each");
        goto done;
    }
    for (Py_ssize_t j = 0; j < nr; j++) {
        ranks[j] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(rf, j));
        if (ranks[j] == -1 && PyErr_Occurred()) goto done;
        if (ranks[j] < 0 || ranks[j] >= w) {
            PyErr_SetString(PyExc_ValueError, "rank out of the window");
            goto done;
        }
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(of, j), &ob[nb], flags) < 0) goto done;
        nb++;
        if (ob[j].itemsize != 8 || ob[j].format == NULL || strcmp(ob[j].format, "d") != 0 ||
            ob[j].len != vb.len) {
            PyErr_SetString(PyExc_ValueError, "each output: a float64 array of the input's length");
            goto done;
        }
        outs[j] = ob[j].buf;
    }
    const double *v = vb.buf;
    /* NaN orders nothing: refused (the caller takes scipy's path). Only the points the
     * windows of [start, stop) read are looked at. */
    Py_ssize_t a = clamp(start - w / 2, n), b = clamp(stop - 2 - w / 2 + w, n);
    for (Py_ssize_t k = a; k <= b; k++) {
        if (v[k] != v[k]) {
            PyErr_SetString(PyExc_ValueError, "NaN in the series");
            goto done;
        }
    }
    s = malloc(sizeof(double) * (size_t)w);
    if (s == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    run(v, n, w, ranks, (int)nr, outs, start, stop, s);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free(s);
    for (int j = 0; j < nb; j++) PyBuffer_Release(&ob[j]);
    Py_XDECREF(rf);
    Py_XDECREF(of);
    PyBuffer_Release(&vb);
    return result;
}

static PyMethodDef methods[] = {
    {"rank", rank, METH_VARARGS,
     "rank(v, size, ranks, outs, start, stop): for i in [start, stop), outs[j][i] = the "
     "ranks[j]-th smallest of the window of size points centred as scipy.ndimage's (mode "
     "nearest); one or two ranks, size <= 1024; the GIL is released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rolling", "Rolling order statistics (see _rolling.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__rolling(void) { return PyModule_Create(&module); }
