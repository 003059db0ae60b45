/* The event file reader's record walk, length checks and scalar decoding, in C
 * (forensics.importers.tfevents_scan: walk, length_crc_ok, decode_fast).
 *
 * walk(buf, n, max_record, offs, lens) -> (count, end, stop): the TFRecord framing of
 * buf[:n] from its first byte, record after record, up to the first that cannot be complete
 * (stop 0 "eof", 1 "short", 2 "zero", 3 "huge", as tfevents_scan.walk names them). With
 * offs and lens None it only counts; else they (writable int64, count items at least) get
 * each record's start and data length.
 *
 * crc_lengths(buf, offs, out): out[i] (bool) is whether the masked CRC-32C of the 8 length
 * bytes at offs[i] is the one stored after them.
 *
 * decode(buf, offs, lens, flags, step, wall, value, tag_at, tag_len): per record, whether
 * it is of the scalar shape tfevents_scan.decode_fast reads without protobuf (flags: 1 a
 * row, 2 a tensor scalar, 4 with the "scalars" plugin metadata, 8 a writer's first record
 * to look at) and, for a row, its step, wall time, value (float64) and where its tag lies.
 * The byte tests are decode_fast's; a byte beyond buf reads as 0 (its padding).
 *
 * Why C: each of these is one pass over the records; numpy's versions walk the framing in
 * Python with a pattern guessed ahead, and decode with a dozen whole-array passes (about
 * 0.08 s of a 100k-step file's 0.15 s read; here a few ms). The GIL is released while they
 * run. The module is optional: without a C compiler the numpy path does the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static uint32_t crc_table[256];

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static inline uint64_t u64_at(const uint8_t *a, Py_ssize_t i) {
    uint64_t v;
    memcpy(&v, a + i, 8);
    return v; /* (little-endian machines only: see the module's init) */
}

static inline uint8_t byte_at(const uint8_t *a, Py_ssize_t len, int64_t i) {
    return (i >= 0 && i < len) ? a[i] : 0;
}

static int get(PyObject *o, Py_buffer *b, int writable, Py_ssize_t itemsize, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) < 0) return -1;
    if (itemsize && b->len % itemsize) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "%s: items of %zd bytes", what, itemsize);
        return -1;
    }
    return 0;
}

static void release_all(Py_buffer *b, int n) {
    while (n > 0) PyBuffer_Release(&b[--n]);
}

/* get() for each of n objects in turn, the ones from wmin on writable: 0, or -1 with every
 * buffer already acquired released. */
static int get_all(PyObject **o, Py_buffer *b, int n, int wmin, const Py_ssize_t *size,
                   const char **what) {
    for (int j = 0; j < n; j++) {
        if (get(o[j], &b[j], j >= wmin, size[j], what[j]) < 0) {
            release_all(b, j);
            return -1;
        }
    }
    return 0;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[3];
    Py_ssize_t n;
    unsigned long long max_record;
    if (!PyArg_ParseTuple(args, "OnKOO", &o[0], &n, &max_record, &o[1], &o[2])) return NULL;
    static const Py_ssize_t size[3] = {0, 8, 8};
    static const char *what[3] = {"buf", "offs", "lens"};
    Py_buffer b[3];
    int fill = o[1] != Py_None;
    int held = fill ? 3 : 1; /* counting only (offs and lens None): the buffer alone */
    if (get_all(o, b, held, 1, size, what) < 0) return NULL;
    if (n < 0 || n > b[0].len) {
        release_all(b, held);
        PyErr_SetString(PyExc_ValueError, "n: at most the buffer's length");
        return NULL;
    }
    const uint8_t *a = b[0].buf;
    int64_t *offs = fill ? b[1].buf : NULL, *lens = fill ? b[2].buf : NULL;
    Py_ssize_t cap = fill ? (b[1].len < b[2].len ? b[1].len : b[2].len) / 8 : 0;
    Py_ssize_t count = 0, pos = 0;
    int stop = 0, full = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        if (pos + 12 > n) {
            stop = 0;
            break;
        }
        uint64_t length = u64_at(a, pos);
        if (length == 0) {
            stop = 2;
            break;
        }
        if (length > max_record) {
            stop = 3;
            break;
        }
        if ((uint64_t)pos + length + 16 > (uint64_t)n) {
            stop = 1;
            break;
        }
        if (fill) {
            if (count == cap) {
                full = 1;
                break;
            }
            offs[count] = pos;
            lens[count] = (int64_t)length;
        }
        count++;
        pos += (Py_ssize_t)length + 16;
    }
    Py_END_ALLOW_THREADS
    release_all(b, held);
    if (full) {
        PyErr_SetString(PyExc_ValueError, "offs and lens: fewer items than records");
        return NULL;
    }
    if (stop == 0 && pos < n) stop = 1; /* fewer than 12 bytes left: a cut-off header */
    return Py_BuildValue("nni", count, pos, stop);
}

static PyObject *crc_lengths(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return NULL;
    static const Py_ssize_t size[3] = {0, 8, 1};
    static const char *what[3] = {"buf", "offs", "out"};
    Py_buffer b[3];
    if (get_all(o, b, 3, 2, size, what) < 0) return NULL;
    Py_ssize_t m = b[1].len / 8;
    const int64_t *offs = b[1].buf;
    const uint8_t *a = b[0].buf;
    uint8_t *ok = b[2].buf;
    int bad = b[2].len < m;
    for (Py_ssize_t i = 0; i < m && !bad; i++) bad = offs[i] < 0 || offs[i] + 12 > b[0].len;
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < m; i++) {
            const uint8_t *p = a + offs[i];
            uint32_t c = 0xFFFFFFFFu;
            for (int k = 0; k < 8; k++) c = crc_table[(c ^ p[k]) & 0xFF] ^ (c >> 8);
            c ^= 0xFFFFFFFFu;
            c = ((c >> 15) | (c << 17)) + 0xA282EAD8u;
            uint32_t stored;
            memcpy(&stored, p + 8, 4);
            ok[i] = c == stored;
        }
        Py_END_ALLOW_THREADS
    }
    release_all(b, 3);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "out too short, or a record's header past buf");
        return NULL;
    }
    Py_RETURN_NONE;
}

static const uint8_t META[13] = {0x4A, 0x0B, 0x0A, 0x09, 0x0A, 0x07, 's',
                                 'c',  'a',  'l',  'a',  'r',  's'};
static const uint8_t PAY_F32[6] = {0x42, 0x08, 0x08, 0x01, 0x2A, 0x04};
static const uint8_t PAY_F64[6] = {0x42, 0x0C, 0x08, 0x02, 0x32, 0x08};

static int same(const uint8_t *a, Py_ssize_t len, int64_t at, const uint8_t *want, int k) {
    for (int j = 0; j < k; j++)
        if (byte_at(a, len, at + j) != want[j]) return 0;
    return 1;
}

/* One record: its flags, and for a row its step, wall time, value and tag. */
static uint8_t decode_one(const uint8_t *a, Py_ssize_t len, int64_t off, int64_t size,
                          int64_t *step, double *wall, double *value, int64_t *tag_at,
                          int64_t *tag_len) {
    int64_t d = off + 12, e = d + size;
    uint8_t flags = 0;
    uint8_t b0 = byte_at(a, len, d), b9 = byte_at(a, len, d + 9);
    if (size >= 11 && b0 == 0x09 && b9 == 0x1A) flags |= 8;
    if (!(size >= 19 && b0 == 0x09)) return flags;
    int64_t q;
    uint64_t s = 0;
    if (b9 == 0x10) { /* the step, a varint of up to 10 bytes */
        int vlen = 0;
        for (int k = 0; k < 10; k++) {
            uint8_t b = byte_at(a, len, d + 10 + k);
            s |= (uint64_t)(b & 0x7F) << (7 * k);
            if (b < 0x80) {
                vlen = k + 1;
                break;
            }
        }
        if (!vlen) return flags;
        q = d + 10 + vlen;
    } else {
        q = d + 9;
    }
    uint8_t l1 = byte_at(a, len, q + 1), l2 = byte_at(a, len, q + 3), lt = byte_at(a, len, q + 5);
    if (byte_at(a, len, q) != 0x2A || byte_at(a, len, q + 2) != 0x0A ||
        byte_at(a, len, q + 4) != 0x0A || (l1 | l2 | lt) & 0x80)
        return flags;
    if (q + 2 + l1 != e || (int)l2 != (int)l1 - 2) return flags;
    int64_t r = q + 6 + lt; /* the value's payload */
    if (r + 5 == e && byte_at(a, len, r) == 0x15) {
        float f;
        memcpy(&f, a + r + 1, 4);
        *value = (double)f;
        flags |= 1;
    } else {
        int f32 = same(a, len, r, PAY_F32, 6), f64 = !f32 && same(a, len, r, PAY_F64, 6);
        if (!f32 && !f64) return flags;
        int64_t vend = r + (f32 ? 10 : 14);
        if (vend == e) {
            flags |= 1 | 2;
        } else if (vend + 13 == e && same(a, len, vend, META, 13)) {
            flags |= 1 | 2 | 4;
        } else {
            return flags;
        }
        if (f32) {
            float f;
            memcpy(&f, a + r + 6, 4);
            *value = (double)f;
        } else {
            memcpy(value, a + r + 6, 8);
        }
    }
    *step = b9 == 0x10 ? (int64_t)s : 0;
    memcpy(wall, a + d + 1, 8);
    *tag_at = q + 6;
    *tag_len = lt;
    return flags;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &o[8]))
        return NULL;
    static const Py_ssize_t size[9] = {0, 8, 8, 1, 8, 8, 8, 8, 8};
    static const char *what[9] = {"buf",  "offs",  "lens",   "flags", "step",
                                  "wall", "value", "tag_at", "tag_len"};
    Py_buffer b[9];
    PyObject *result = NULL;
    if (get_all(o, b, 9, 3, size, what) < 0) return NULL;
    Py_ssize_t m = b[1].len / 8;
    for (int j = 2; j < 9; j++) {
        if (b[j].len / size[j] != m) {
            PyErr_Format(PyExc_ValueError, "%s: one item a record", what[j]);
            goto done;
        }
    }
    const uint8_t *a = b[0].buf;
    Py_ssize_t len = b[0].len;
    const int64_t *offs = b[1].buf, *lens = b[2].buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        /* every record within buf (its wall time and value are read where the shape says) */
        if (offs[i] < 0 || lens[i] < 0 || offs[i] + lens[i] + 16 > len) {
            PyErr_SetString(PyExc_ValueError, "a record past buf");
            goto done;
        }
    }
    uint8_t *flags = b[3].buf;
    int64_t *step = b[4].buf, *tag_at = b[7].buf, *tag_len = b[8].buf;
    double *wall = b[5].buf, *value = b[6].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        step[i] = 0;
        wall[i] = 0.0;
        value[i] = 0.0;
        tag_at[i] = 0;
        tag_len[i] = 0;
        flags[i] = decode_one(a, len, offs[i], lens[i], &step[i], &wall[i], &value[i],
                              &tag_at[i], &tag_len[i]);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    release_all(b, 9);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(buf, n, max_record, offs, lens) -> (count, end, stop): the records of buf[:n]."},
    {"crc_lengths", crc_lengths, METH_VARARGS,
     "crc_lengths(buf, offs, out): each record's length CRC checked into out."},
    {"decode", decode, METH_VARARGS,
     "decode(buf, offs, lens, flags, step, wall, value, tag_at, tag_len): the scalar rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tfscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tfscan(void) {
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) {
        PyErr_SetString(PyExc_ImportError, "_tfscan reads little-endian words");
        return NULL;
    }
    make_table();
    return PyModule_Create(&module);
}
