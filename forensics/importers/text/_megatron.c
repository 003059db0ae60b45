/* Megatron iteration lines read in C, the lines of a long log that the layout read from its
 * last lines fits exactly (forensics.importers.text.megatron._kernel_read).
 *
 * read(buf, prefixes, consts, commas, dated, ln, step, wall, values, val, first, first_val)
 * reads the lines of buf (whole lines, as the text importer's "|" table has them: a row per
 * "\n"-ended line, the last one also without its "\n"). For each iteration line it writes,
 * from row `first` of the arrays on, the line's number within buf (ln), its step, its date
 * as unix seconds (wall, when dated; NaN for a line without "[") and one float per column
 * that has a key (values[k], NaN where the line has no such cell). prefixes and consts hold,
 * for each column after the first "|", the key a cell starts with (bytes, or None: a column
 * without a key) and the text every cell of the column is expected to repeat (or None). The
 * validation lines' (ln, start, end) go to val (int64, three a line) from triple `first_val`
 * on. It returns (n_lines, n_iterations, hint, const, n_validation, stop), const a bool per
 * column (every cell read held that text).
 *
 * It stops at the first line it could read differently from the polars path (stop: the
 * offset where that line starts; len(buf) when it read every line): a cell that does not
 * start with its column's key or that holds a ":" in a column without one, a number outside
 * [+-]digits[.digits][e[+-]digits] (nan, inf, nothing), a step between "iteration" and "/"
 * that mixes digits with other text, a date that is not YYYY-MM-DD[ T]HH:MM:SS after the
 * first "[". The caller has polars read from there (a line or a few) and the kernel go on
 * after them, so what comes out is always what the polars path gives: the same lines kept,
 * the same numbers bit for bit (correctly rounded by forensics/_decimal.h, which the JSONL
 * kernel shares). The interpreter lock is released while the lines are
 * read (taken back only for a number Python's parser reads): two threads read two pieces.
 *
 * lines(buf) returns (the number of line breaks, the offset of the first byte that is
 * neither printable ASCII, a tab nor a line break or -1): read() is only given bytes before
 * such a byte's line.
 *
 * Why C: polars splits every line into string cells and then slices, strips and casts each
 * column in turn (about 55 ms a 16 MB piece of 46,000 lines); one pass over the bytes here
 * takes a fraction of that.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../../_decimal.h"

#define MAX_COLUMNS 96

static const char *find(const char *h, const char *end, const char *lit, Py_ssize_t n) {
    while (end - h >= n) {
        const char *q = memchr(h, lit[0], (size_t)(end - h - n + 1));
        if (q == NULL) return NULL;
        if (memcmp(q, lit, (size_t)n) == 0) return q;
        h = q + 1;
    }
    return NULL;
}

#define FIND(h, end, lit) find((h), (end), (lit), (Py_ssize_t)(sizeof(lit) - 1))

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* A number of the form [+-](d+[.d*]|.d+)([eE][+-]?d+)? spanning [p, e) into *out: 1 done,
 * 0 not that form, -1 a Python error. */
static int parse_number(const char *p, const char *e, double *out, PyThreadState **save) {
    const char *s = p;
    int neg = 0;
    if (s < e && (*s == '+' || *s == '-')) {
        neg = *s == '-';
        s++;
    }
    uint64_t m = 0;
    int digits = 0, frac = 0, seen = 0;
    while (s < e && is_digit(*s)) {
        if (digits < 19) m = m * 10 + (uint64_t)(*s - '0');
        digits++;
        seen = 1;
        s++;
    }
    if (s < e && *s == '.') {
        s++;
        while (s < e && is_digit(*s)) {
            if (digits < 19) m = m * 10 + (uint64_t)(*s - '0');
            digits++;
            frac++;
            seen = 1;
            s++;
        }
    }
    if (!seen) return 0;
    int exp = 0;
    if (s < e && (*s == 'e' || *s == 'E')) {
        s++;
        int eneg = 0;
        if (s < e && (*s == '+' || *s == '-')) {
            eneg = *s == '-';
            s++;
        }
        if (s == e || !is_digit(*s)) return 0;
        while (s < e && is_digit(*s)) {
            if (exp < 100000) exp = exp * 10 + (*s - '0');
            s++;
        }
        if (eneg) exp = -exp;
    }
    if (s != e) return 0;
    /* (an overflow gives +-inf, as polars) */
    return decimal_to_double(p, e - p, m, digits, exp - frac, neg, out, save);
}

/* The first digits of c0 that follow "iteration" and whitespace (the importer's
 * r"iteration\s+\d+"), or NULL: c0 is not an iteration line. */
static const char *iteration_digits(const char *p, const char *e) {
    for (const char *q = FIND(p, e, "iteration"); q != NULL; q = FIND(q + 1, e, "iteration")) {
        const char *s = q + 9;
        const char *t = s;
        while (t < e && (*t == ' ' || *t == '\t')) t++;
        if (t > s && t < e && is_digit(*t)) return t;
    }
    return NULL;
}

static int two(const char *s) { return (s[0] - '0') * 10 + (s[1] - '0'); }

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* YYYY-MM-DD[ T]HH:MM:SS at s (19 bytes) into unix seconds as the polars path computes them
 * (microseconds as a float, over 1e6); 0 when it is not such a date. */
static int parse_date(const char *s, double *out) {
    static const char shape[] = "dddd-dd-dd?dd:dd:dd";
    for (int i = 0; i < 19; i++) {
        char c = shape[i];
        if (c == 'd' ? !is_digit(s[i]) : c == '?' ? (s[i] != ' ' && s[i] != 'T') : s[i] != c)
            return 0;
    }
    int y = two(s) * 100 + two(s + 2), mo = two(s + 5), d = two(s + 8);
    int h = two(s + 11), mi = two(s + 14), se = two(s + 17);
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 ||
        se > 59 || (mo == 2 && d == 29 && !leap))
        return 0;
    int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se;
    *out = (double)(secs * 1000000) / 1e6;
    return 1;
}

/* The number of "\n" in buf; *bad: the offset of its first byte that is neither printable
 * ASCII, a tab nor "\n" (-1: none). Written without an early exit inside a block so that the
 * compiler makes it vector code (a byte at a time with a branch, this check alone took longer
 * than the rest of the reading). */
static Py_ssize_t count_lines(const unsigned char *s, Py_ssize_t n, Py_ssize_t *bad) {
    Py_ssize_t lines = 0;
    *bad = -1;
    for (Py_ssize_t i = 0; i < n; i += 255) {
        /* Blocks of 255 bytes: a byte-wide count of line breaks cannot overflow in one. */
        Py_ssize_t m = n - i < 255 ? n - i : 255;
        const unsigned char *b = s + i;
        unsigned char odd = 0, nl = 0;
        for (Py_ssize_t k = 0; k < m; k++) {
            unsigned char c = b[k];
            odd |= (unsigned char)(((unsigned char)(c - 0x20) >= 0x5f) & (c != '\n') & (c != '\t'));
            nl += c == '\n';
        }
        if (odd && *bad < 0) {
            for (Py_ssize_t k = 0; k < m; k++) {
                unsigned char c = b[k];
                if ((c < 0x20 && c != '\n' && c != '\t') || c >= 0x7f) {
                    *bad = i + k;
                    break;
                }
            }
        }
        lines += nl;
    }
    return lines;
}

static PyObject *lines(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t n, bad;
    Py_BEGIN_ALLOW_THREADS
    n = count_lines(b.buf, b.len, &bad);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return Py_BuildValue("nn", n, bad);
}

typedef struct {
    Py_buffer b;
    int have;
} buffer;

static int get(PyObject *o, buffer *out, Py_ssize_t itemsize, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, &out->b, flags) < 0) return -1;
    out->have = 1;
    if (itemsize && out->b.itemsize != itemsize) {
        PyErr_SetString(PyExc_ValueError, "an output array of the wrong item size");
        return -1;
    }
    return 0;
}

static PyObject *read_lines(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *bo, *po, *co, *lno, *sto, *wo, *vo, *vlo;
    int commas, dated;
    Py_ssize_t first, first_val;
    if (!PyArg_ParseTuple(args, "OOOppOOOOOnn", &bo, &po, &co, &commas, &dated, &lno, &sto,
                          &wo, &vo, &vlo, &first, &first_val))
        return NULL;
    buffer text = {0}, lnb = {0}, stb = {0}, wb = {0}, vb = {0}, vlb = {0};
    PyObject *result = NULL, *flags = NULL;
    const char *pre[MAX_COLUMNS], *cst[MAX_COLUMNS];
    Py_ssize_t pre_n[MAX_COLUMNS], cst_n[MAX_COLUMNS], slot[MAX_COLUMNS];
    int same[MAX_COLUMNS];
    if (!PyTuple_Check(po) || !PyTuple_Check(co) || PyTuple_GET_SIZE(po) != PyTuple_GET_SIZE(co)) {
        PyErr_SetString(PyExc_TypeError, "prefixes and consts: tuples of the same length");
        return NULL;
    }
    Py_ssize_t nc = PyTuple_GET_SIZE(po), nk = 0;
    if (nc > MAX_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "more columns than the kernel reads");
        return NULL;
    }
    for (Py_ssize_t j = 0; j < nc; j++) {
        PyObject *p = PyTuple_GET_ITEM(po, j), *c = PyTuple_GET_ITEM(co, j);
        if ((p != Py_None && !PyBytes_Check(p)) || (c != Py_None && !PyBytes_Check(c))) {
            PyErr_SetString(PyExc_TypeError, "prefixes and consts: bytes or None");
            return NULL;
        }
        pre[j] = p == Py_None ? NULL : PyBytes_AS_STRING(p);
        pre_n[j] = p == Py_None ? 0 : PyBytes_GET_SIZE(p);
        cst[j] = c == Py_None ? NULL : PyBytes_AS_STRING(c);
        cst_n[j] = c == Py_None ? 0 : PyBytes_GET_SIZE(c);
        same[j] = pre[j] != NULL && cst[j] != NULL;
        slot[j] = pre[j] == NULL ? -1 : nk++;
    }
    if (get(bo, &text, 0, 0) < 0 || get(lno, &lnb, 8, 1) < 0 || get(sto, &stb, 8, 1) < 0 ||
        get(wo, &wb, 8, 1) < 0 || get(vo, &vb, 8, 1) < 0 || get(vlo, &vlb, 8, 1) < 0)
        goto done;
    const char *buf = text.b.buf, *end = buf + text.b.len;
    Py_ssize_t cap = lnb.b.len / 8;
    if (stb.b.len / 8 < cap || wb.b.len / 8 < cap || vb.b.len / 8 < cap * nk ||
        vlb.b.len / 8 < cap * 3) {
        PyErr_SetString(PyExc_ValueError, "output arrays smaller than ln's capacity");
        goto done;
    }
    if (first < 0 || first > cap || first_val < 0 || first_val > cap) {
        PyErr_SetString(PyExc_ValueError, "first rows outside the arrays");
        goto done;
    }
    int64_t *ln = (int64_t *)lnb.b.buf + first, *step = (int64_t *)stb.b.buf + first;
    int64_t *val = (int64_t *)vlb.b.buf + 3 * first_val;
    double *wall = (double *)wb.b.buf + first, *values = (double *)vb.b.buf + first;
    Py_ssize_t room = cap - first, vroom = cap - first_val;
    Py_ssize_t lines = 0, n = 0, nv = 0;
    const char *stop = end; /* where the reading stopped: a line it declined, or the end */
    int hint = 0, status = 1; /* 1 read, -1 a Python error, -2 out of room */
    /* The lines are read without the interpreter lock: pieces are read side by side. */
    PyThreadState *save = PyEval_SaveThread();
    for (const char *p = buf; p < end; lines++) {
        const char *le = memchr(p, '\n', (size_t)(end - p));
        if (le == NULL) le = end;
        const char *c0e = memchr(p, '|', (size_t)(le - p));
        if (c0e == NULL) c0e = le;
        /* (a declined line's hint is the polars reading's: counted once the line is read) */
        int line_hint = !hint && (FIND(p, c0e, "verflow") || FIND(p, c0e, "OVERFLOW") ||
                                  FIND(p, c0e, "dynamic loss scale"));
        if (FIND(p, c0e, "validation loss at")) {
            hint |= line_hint;
            if (nv >= vroom) {
                status = -2;
                goto out;
            }
            val[3 * nv] = lines;
            val[3 * nv + 1] = p - buf;
            val[3 * nv + 2] = le - buf;
            nv++;
            p = le + 1;
            continue;
        }
        const char *digits = iteration_digits(p, c0e);
        if (digits == NULL) {
            hint |= line_hint;
            p = le + 1;
            continue;
        }
        if (n >= room) {
            status = -2;
            goto out;
        }
        /* The step: the text between the first "iteration" and the first "/" when it is plain
         * digits; when there is no "/" or no digit there (polars reads a null), the digits of
         * the first "iteration N" ("saving checkpoint at iteration 500 to ..."). */
        const char *s = FIND(p, c0e, "iteration") + 9, *t = NULL;
        const char *slash = memchr(p, '/', (size_t)(c0e - p));
        if (slash != NULL) {
            if (slash < s) goto declined;
            t = slash;
            while (s < t && (*s == ' ' || *s == '\t')) s++;
            while (t > s && (t[-1] == ' ' || t[-1] == '\t')) t--;
            int all = t > s, any = 0;
            for (const char *q = s; q < t; q++) {
                all &= is_digit(*q);
                any |= is_digit(*q);
            }
            if (any && !all) goto declined; /* "+5", "5 of 9": polars' cast rules, not ours */
            if (!all) t = NULL;
        }
        if (t == NULL) {
            s = t = digits;
            while (t < c0e && is_digit(*t)) t++;
        }
        if (t - s > 18) goto declined;
        int64_t k = 0;
        for (const char *q = s; q < t; q++) k = k * 10 + (*q - '0');
        ln[n] = lines;
        step[n] = k;
        if (dated) {
            /* No "[": no date (NaN, null to the caller), as polars slices nothing there. */
            const char *br = memchr(p, '[', (size_t)(c0e - p));
            if (br == NULL)
                wall[n] = Py_NAN;
            else if (c0e - (br + 1) < 19 || !parse_date(br + 1, &wall[n]))
                goto declined;
        }
        /* The cells after c0: one per column, null past the line's last "|" or when empty. */
        const char *q = c0e;
        for (Py_ssize_t j = 0; j < nc; j++) {
            const char *cs = NULL, *ce = NULL;
            if (q < le) {
                cs = q + 1;
                ce = memchr(cs, '|', (size_t)(le - cs));
                if (ce == NULL) ce = le;
                q = ce;
                if (ce == cs) cs = NULL; /* an empty cell: null */
            }
            double *out = slot[j] < 0 ? NULL : &values[slot[j] * cap + n];
            if (cs == NULL) {
                if (out != NULL) *out = Py_NAN;
                continue;
            }
            Py_ssize_t len = ce - cs;
            if (pre[j] == NULL) {
                if (memchr(cs, ':', (size_t)len) != NULL) goto declined;
                continue;
            }
            if (len < pre_n[j] || memcmp(cs, pre[j], (size_t)pre_n[j]) != 0) goto declined;
            if (same[j] && (len != cst_n[j] || memcmp(cs, cst[j], (size_t)len) != 0)) same[j] = 0;
            const char *a = cs + pre_n[j], *b = ce;
            while (a < b && *a == ' ') a++;
            while (b > a && b[-1] == ' ') b--;
            int got;
            if (commas && memchr(a, ',', (size_t)(b - a)) != NULL) {
                char small[64];
                Py_ssize_t m = 0;
                if (b - a >= (Py_ssize_t)sizeof(small)) goto declined;
                for (const char *x = a; x < b; x++)
                    if (*x != ',') small[m++] = *x;
                got = parse_number(small, small + m, out, &save);
            } else {
                got = parse_number(a, b, out, &save);
            }
            if (got < 0) {
                status = -1;
                goto out;
            }
            if (got == 0) goto declined;
        }
        hint |= line_hint;
        n++;
        p = le + 1;
        continue;
    declined:
        stop = p; /* this line and what follows are the caller's */
        break;
    }
out:
    PyEval_RestoreThread(save);
    if (status == -2) {
        PyErr_SetString(PyExc_ValueError, "more lines than ln's capacity");
        goto done;
    }
    if (status == -1) goto done;
    flags = PyTuple_New(nc);
    if (flags == NULL) goto done;
    for (Py_ssize_t j = 0; j < nc; j++) PyTuple_SET_ITEM(flags, j, PyBool_FromLong(same[j]));
    result = Py_BuildValue("nnNNnn", lines, n, PyBool_FromLong(hint), flags, nv,
                           (Py_ssize_t)(stop - buf));
    flags = NULL;
done:
    Py_XDECREF(flags);
    if (vlb.have) PyBuffer_Release(&vlb.b);
    if (text.have) PyBuffer_Release(&text.b);
    if (lnb.have) PyBuffer_Release(&lnb.b);
    if (stb.have) PyBuffer_Release(&stb.b);
    if (wb.have) PyBuffer_Release(&wb.b);
    if (vb.have) PyBuffer_Release(&vb.b);
    return result;
}

static PyMethodDef methods[] = {
    {"lines", lines, METH_O,
     "lines(buf): (the number of line breaks in buf, the offset of its first byte that is "
     "neither printable ASCII, a tab nor a line break, or -1)."},
    {"read", read_lines, METH_VARARGS,
     "read(buf, prefixes, consts, commas, dated, ln, step, wall, values, val, first, "
     "first_val): the iteration lines of a piece of a Megatron log into the arrays given, up "
     "to the first line the polars path must read (see _megatron.c); the interpreter lock is "
     "released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_megatron", "Megatron iteration lines read in C (see _megatron.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__megatron(void) { return PyModule_Create(&module); }
