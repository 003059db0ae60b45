/* The plain lines of a JSONL metrics log read in C (forensics.importers.jsonl_blocks: a block
 * whose every line is a flat object of numbers).
 *
 * scan(buf) reads every line of buf (a block of whole lines: a line per "\n", the last one
 * also without its "\n") and returns None unless each line is blank or an object whose values
 * are all numbers:
 *
 *     ws "{" ws [ "key" ws ":" ws number ws ( "," ws "key" ws ":" ws number ws )* ] "}" ws
 *
 * (ws: spaces, tabs, carriage returns; a key: printable ASCII without a backslash; a number:
 * JSON's -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)? with a finite value, or the NaN, Infinity and
 * -Infinity Python's json module writes; or null, which gives no row; no key twice in a
 * line). Anything else (strings, booleans, nested objects, escapes, non-ASCII keys, a line
 * cut off) is left to the block reader's other paths, which handle it: this one only reads
 * what it can read exactly as they do.
 *
 * Otherwise it returns (n_lines, n_objects, keys, counts, lines, values): the lines and the
 * objects among them (lines that are not blank), the keys with a value as str in the order
 * the block first shows a value of them (by line, then place in the line), and for each key in that
 * order its values (float64) and the block line each came from (int32, ascending), one key
 * after the other (counts: int64, a key's number of values). The numbers are those polars'
 * JSON reader and Python's json module give: correctly rounded (Clinger's exact fast path for
 * the common decimals; Python's 17-digit float reprs and other numbers of up to 19 digits in
 * x87 extended precision, unless the result lies next to a midpoint between two doubles;
 * Python's parser for the rest), an integer such as -0 read as an integer. The interpreter lock is released
 * while the lines are read and their rows sorted by key (taken back only for a number
 * Python's parser reads), so two threads read two blocks.
 *
 * Why C: polars reads a block's lines into a wide frame whose columns the reader then takes
 * apart into each key's rows; this writes each key's rows as the line is read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../_decimal.h"

#define MAX_KEYS (1 << 20)

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* A JSON number starting at *pp (before e) into *out; *pp moved past it. 1 done, 0 not a JSON
 * number or not finite, -1 a Python error. */
static int parse_number(const unsigned char **pp, const unsigned char *e, double *out,
                        PyThreadState **save) {
    const unsigned char *p = *pp, *s = p;
    int neg = 0;
    if (s < e && *s == '-') {
        neg = 1;
        s++;
    }
    /* The tokens Python's json module writes for a float that is not finite (a diverged
     * loss): NaN, Infinity, -Infinity. */
    if (!neg && e - s >= 3 && memcmp(s, "NaN", 3) == 0) {
        *pp = s + 3;
        *out = Py_NAN;
        return 1;
    }
    if (e - s >= 8 && memcmp(s, "Infinity", 8) == 0) {
        *pp = s + 8;
        *out = neg ? -Py_HUGE_VAL : Py_HUGE_VAL;
        return 1;
    }
    if (s == e || !is_digit(*s)) return 0;
    uint64_t m = 0;
    int digits = 0, frac = 0, integer = 1;
    if (*s == '0') {
        s++;
        if (s < e && is_digit(*s)) return 0; /* a leading zero */
    } else {
        while (s < e && is_digit(*s)) {
            if (digits < 19) m = m * 10 + (uint64_t)(*s - '0');
            digits++;
            s++;
        }
    }
    if (s < e && *s == '.') {
        integer = 0;
        s++;
        if (s == e || !is_digit(*s)) return 0;
        while (s < e && is_digit(*s)) {
            if (digits < 19) m = m * 10 + (uint64_t)(*s - '0');
            if (digits || *s != '0') digits++; /* (leading zeros of a fraction: no digits) */
            frac++;
            s++;
        }
    }
    int exp = 0;
    if (s < e && (*s == 'e' || *s == 'E')) {
        integer = 0;
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
    *pp = s;
    if (integer && m == 0 && digits == 0) {
        *out = 0.0; /* "-0" is the integer 0 to both readers */
        return 1;
    }
    int e10 = exp - frac;
    int got = decimal_to_double((const char *)p, s - p, m, digits, e10, neg, out, save);
    /* (a value out of range: polars refuses the line, so it is not read here) */
    return got == 1 && !(*out - *out == 0.0) ? 0 : got;
}

/* The keys seen: an open-addressing table of (hash, where the key's text is, its length). */
typedef struct {
    uint64_t *hash;
    int32_t *slot_id; /* -1: empty */
    const unsigned char **text;
    int32_t *len;
    int64_t *last_line; /* the last line holding the key (a key twice in a line) */
    int32_t *next;      /* the key that followed it the last time (-1: none yet) */
    Py_ssize_t n, cap, mask;
} keys_t;

static uint64_t hash_bytes(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

static int keys_init(keys_t *k) {
    memset(k, 0, sizeof(*k));
    k->mask = 255;
    k->slot_id = malloc(256 * sizeof(int32_t));
    k->hash = malloc(256 * sizeof(uint64_t));
    k->cap = 64;
    k->text = malloc((size_t)k->cap * sizeof(*k->text));
    k->len = malloc((size_t)k->cap * sizeof(int32_t));
    k->last_line = malloc((size_t)k->cap * sizeof(int64_t));
    k->next = malloc((size_t)k->cap * sizeof(int32_t));
    if (!k->slot_id || !k->hash || !k->text || !k->len || !k->last_line || !k->next) return -1;
    memset(k->slot_id, 0xff, 256 * sizeof(int32_t));
    return 0;
}

static void keys_free(keys_t *k) {
    free(k->hash);
    free(k->slot_id);
    free(k->text);
    free(k->len);
    free(k->last_line);
    free(k->next);
}

/* The key's id (new ones numbered in the order seen); -1 out of memory, -2 too many keys. */
static int32_t key_id(keys_t *k, const unsigned char *s, Py_ssize_t n) {
    uint64_t h = hash_bytes(s, n);
    Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)k->mask);
    while (k->slot_id[i] >= 0) {
        int32_t id = k->slot_id[i];
        if (k->hash[i] == h && k->len[id] == n && memcmp(k->text[id], s, (size_t)n) == 0)
            return id;
        i = (i + 1) & k->mask;
    }
    if (k->n >= MAX_KEYS) return -2;
    if (k->n == k->cap) {
        Py_ssize_t cap = 2 * k->cap;
        void *t = realloc(k->text, (size_t)cap * sizeof(*k->text));
        if (t) k->text = t;
        void *l = realloc(k->len, (size_t)cap * sizeof(int32_t));
        if (l) k->len = l;
        void *ll = realloc(k->last_line, (size_t)cap * sizeof(int64_t));
        if (ll) k->last_line = ll;
        void *nx = realloc(k->next, (size_t)cap * sizeof(int32_t));
        if (nx) k->next = nx;
        if (!t || !l || !ll || !nx) return -1;
        k->cap = cap;
    }
    int32_t id = (int32_t)k->n++;
    k->text[id] = s;
    k->len[id] = (int32_t)n;
    k->last_line[id] = -1;
    k->next[id] = -1;
    k->slot_id[i] = id;
    k->hash[i] = h;
    if (2 * k->n > k->mask) { /* grow the table: half full at most */
        Py_ssize_t size = 2 * (k->mask + 1);
        int32_t *ids = malloc((size_t)size * sizeof(int32_t));
        uint64_t *hs = malloc((size_t)size * sizeof(uint64_t));
        if (!ids || !hs) {
            free(ids);
            free(hs);
            return -1;
        }
        memset(ids, 0xff, (size_t)size * sizeof(int32_t));
        for (Py_ssize_t j = 0; j <= k->mask; j++) {
            if (k->slot_id[j] < 0) continue;
            Py_ssize_t at = (Py_ssize_t)(k->hash[j] & (uint64_t)(size - 1));
            while (ids[at] >= 0) at = (at + 1) & (size - 1);
            ids[at] = k->slot_id[j];
            hs[at] = k->hash[j];
        }
        free(k->slot_id);
        free(k->hash);
        k->slot_id = ids;
        k->hash = hs;
        k->mask = size - 1;
    }
    return id;
}

/* The values read, in line order: key id, line, value. */
typedef struct {
    int32_t *id;
    int32_t *line;
    double *val;
    Py_ssize_t n, cap;
} rows_t;

static int rows_add(rows_t *r, int32_t id, int32_t line, double v) {
    if (r->n == r->cap) {
        Py_ssize_t cap = r->cap ? 2 * r->cap : 4096;
        void *a = realloc(r->id, (size_t)cap * sizeof(int32_t));
        if (a) r->id = a;
        void *b = realloc(r->line, (size_t)cap * sizeof(int32_t));
        if (b) r->line = b;
        void *c = realloc(r->val, (size_t)cap * sizeof(double));
        if (c) r->val = c;
        if (!a || !b || !c) return -1;
        r->cap = cap;
    }
    r->id[r->n] = id;
    r->line[r->n] = line;
    r->val[r->n] = v;
    r->n++;
    return 0;
}

enum { DONE = 1, DECLINED = 0, FAILED = -1 };

/* Every line of [p, end) into keys and rows; *n_lines the lines read. */
static int read_lines(const unsigned char *p, const unsigned char *end, keys_t *keys,
                      rows_t *rows, Py_ssize_t *n_lines, Py_ssize_t *n_objects,
                      PyThreadState **save) {
    int32_t line = 0, first_key = -1; /* (the first key of the line before) */
    Py_ssize_t objects = 0;
    while (p < end) {
        if (line == INT32_MAX) return DECLINED;
        const unsigned char *q = p;
        while (q < end && is_ws(*q)) q++;
        if (q == end || *q == '\n') { /* a blank line: no rows */
            p = q < end ? q + 1 : q;
            line++;
            continue;
        }
        if (*q++ != '{') return DECLINED;
        objects++;
        while (q < end && is_ws(*q)) q++;
        if (q < end && *q == '}') {
            q++;
        } else {
            int32_t prev = -1;
            for (;;) {
                if (q == end || *q != '"') return DECLINED;
                const unsigned char *k = ++q;
                /* Lines mostly repeat the keys of the lines before in the same order: the key
                 * that followed this one last time is tried first. */
                int32_t id = prev < 0 ? first_key : keys->next[prev];
                if (id >= 0) {
                    Py_ssize_t n = keys->len[id];
                    if (end - q > n && q[n] == '"' && memcmp(q, keys->text[id], (size_t)n) == 0)
                        q += n;
                    else
                        id = -1;
                }
                if (id < 0) {
                    while (q < end && *q != '"') {
                        if (*q < 0x20 || *q >= 0x7f || *q == '\\') return DECLINED;
                        q++;
                    }
                    if (q == end || q == k) return DECLINED; /* (an empty key: polars' way) */
                    id = key_id(keys, k, q - k);
                    if (id < 0) return id == -2 ? DECLINED : FAILED;
                }
                if (prev < 0)
                    first_key = id;
                else
                    keys->next[prev] = id;
                prev = id;
                if (keys->last_line[id] == line) return DECLINED; /* a key twice */
                keys->last_line[id] = line;
                q++;
                while (q < end && is_ws(*q)) q++;
                if (q == end || *q != ':') return DECLINED;
                q++;
                while (q < end && is_ws(*q)) q++;
                if (end - q >= 4 && memcmp(q, "null", 4) == 0) {
                    q += 4; /* no value: no row, as if the key were absent */
                } else {
                    double v;
                    int got = parse_number(&q, end, &v, save);
                    if (got <= 0) return got < 0 ? FAILED : DECLINED;
                    if (rows_add(rows, id, line, v) < 0) return FAILED;
                }
                while (q < end && is_ws(*q)) q++;
                if (q < end && *q == ',') {
                    q++;
                    while (q < end && is_ws(*q)) q++;
                    continue;
                }
                if (q < end && *q == '}') {
                    q++;
                    break;
                }
                return DECLINED;
            }
        }
        while (q < end && is_ws(*q)) q++;
        if (q < end && *q != '\n') return DECLINED; /* more after the object */
        p = q < end ? q + 1 : q;
        line++;
    }
    *n_lines = line;
    *n_objects = objects;
    return DONE;
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    keys_t keys;
    rows_t rows = {0};
    PyObject *result = NULL;
    Py_ssize_t n_lines = 0, n_objects = 0;
    int64_t *counts = NULL;
    int32_t *pos = NULL;
    if (keys_init(&keys) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    const unsigned char *p = b.buf;
    PyThreadState *save = PyEval_SaveThread();
    int got = read_lines(p, p + b.len, &keys, &rows, &n_lines, &n_objects, &save);
    PyEval_RestoreThread(save);
    if (got == FAILED) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    if (got == DECLINED) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    /* Each key's rows together (a counting sort: stable), keys in the order of their first
     * row: the order they were seen in, but for a key seen with null before its first value. */
    counts = calloc((size_t)keys.n + 1, sizeof(int64_t));
    pos = malloc(((size_t)keys.n + 1) * sizeof(int32_t));
    if (!counts || !pos) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n_out = 0; /* keys with a row */
    memset(pos, 0xff, ((size_t)keys.n + 1) * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < rows.n; i++) {
        int32_t id = rows.id[i];
        if (pos[id] < 0) pos[id] = (int32_t)n_out++;
        counts[pos[id]]++;
    }
    PyObject *cnt = PyBytes_FromStringAndSize((const char *)counts, (Py_ssize_t)(n_out * 8));
    PyObject *ln = PyBytes_FromStringAndSize(NULL, rows.n * 4);
    PyObject *vl = PyBytes_FromStringAndSize(NULL, rows.n * 8);
    PyObject *names = PyList_New(n_out);
    if (cnt && ln && vl && names) {
        int32_t *lo = (int32_t *)PyBytes_AS_STRING(ln);
        double *vo = (double *)PyBytes_AS_STRING(vl);
        Py_BEGIN_ALLOW_THREADS; /* (the new objects are this thread's alone yet) */
        int64_t at = 0;
        for (Py_ssize_t k = 0; k < n_out; k++) { /* counts -> where each key's rows start */
            int64_t c = counts[k];
            counts[k] = at;
            at += c;
        }
        for (Py_ssize_t i = 0; i < rows.n; i++) {
            int64_t at_i = counts[pos[rows.id[i]]]++;
            lo[at_i] = rows.line[i];
            vo[at_i] = rows.val[i];
        }
        Py_END_ALLOW_THREADS;
        int ok = 1;
        for (Py_ssize_t k = 0; k < keys.n && ok; k++) {
            if (pos[k] < 0) continue;
            PyObject *s = PyUnicode_DecodeASCII((const char *)keys.text[k], keys.len[k], NULL);
            if (!s) ok = 0;
            else PyList_SET_ITEM(names, pos[k], s);
        }
        if (ok) result = Py_BuildValue("(nnOOOO)", n_lines, n_objects, names, cnt, ln, vl);
    }
    Py_XDECREF(cnt);
    Py_XDECREF(ln);
    Py_XDECREF(vl);
    Py_XDECREF(names);
done:
    free(counts);
    free(pos);
    free(rows.id);
    free(rows.line);
    free(rows.val);
    keys_free(&keys);
    PyBuffer_Release(&b);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(buf): None, or (n_lines, n_objects, keys, counts, lines, values) of a block of "
     "JSONL lines that are all flat objects of numbers (see _jsonl.c); the interpreter lock "
     "is released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonl", "Plain JSONL metric lines read in C (see _jsonl.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__jsonl(void) { return PyModule_Create(&module); }
