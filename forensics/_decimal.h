/* Decimal numbers made doubles, correctly rounded: shared by the compiled text readers
 * (forensics/importers/_jsonl.c, forensics/importers/text/_megatron.c). Each reader checks
 * its own grammar and gathers the digits; decimal_to_double turns them into the double that
 * Python's and polars' correctly rounded parsers give.
 */
#ifndef FORENSICS_DECIMAL_H
#define FORENSICS_DECIMAL_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

static const double DECIMAL_POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                         1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                         1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* x87's extended precision (x86-64): a 64-bit significand, stored first. */
#if defined(__x86_64__) && defined(__LDBL_MANT_DIG__) && __LDBL_MANT_DIG__ == 64
#define DECIMAL_EXTENDED 1
static const long double DECIMAL_POW10L[28] = {
    1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
    1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
    1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};
#else
#define DECIMAL_EXTENDED 0
#endif

/* The number written as the n characters at p, whose grammar the caller checked: m holds its
 * first 19 significant digits as an integer and `digits` counts them all (m is exact when
 * there are at most 19), e10 is the power of ten m is scaled by, neg its sign. Its double
 * goes to *out: 1 done, 0 Python's parser did not read the whole text, -1 a Python error.
 * The caller runs without the interpreter lock (*save, its thread state): it is taken back
 * only for Python's parser. An overflow gives +-inf, as both parsers give it. */
static int decimal_to_double(const char *p, Py_ssize_t n, uint64_t m, int digits, int e10,
                             int neg, double *out, PyThreadState **save) {
    if (digits <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        /* Clinger: both operands exact, so the one rounding of * or / is the correct one. */
        double d = (double)m;
        d = e10 < 0 ? d / DECIMAL_POW10[-e10] : d * DECIMAL_POW10[e10];
        *out = neg ? -d : d;
        return 1;
    }
#if DECIMAL_EXTENDED
    if (digits <= 19 && e10 >= -27 && e10 <= 27) {
        /* Python's float repr writes 17 digits, more than a double holds: the same one
         * rounding in x87's 64-bit precision (m and 10^|e10| exact there), then rounded to a
         * double, which is the correct rounding unless the extended result lies within one
         * of its units of a midpoint between two doubles (its 11 bits below a double's 53
         * read 0x3ff-0x401): those go to Python's parser. */
        long double x = (long double)m;
        x = e10 < 0 ? x / DECIMAL_POW10L[-e10] : x * DECIMAL_POW10L[e10];
        uint64_t mant;
        memcpy(&mant, &x, sizeof mant); /* (the explicit 64-bit significand) */
        uint64_t low = mant & 0x7ff;
        if (m == 0 || low < 0x3ff || low > 0x401) {
            double d = (double)x;
            *out = neg ? -d : d;
            return 1;
        }
    }
#endif
    /* The rare other numbers: Python's correctly rounded parser. */
    PyEval_RestoreThread(*save);
    char small[64];
    int ok = -1;
    char *text = n < (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc((size_t)n + 1);
    if (text == NULL) {
        PyErr_NoMemory();
    } else {
        memcpy(text, p, (size_t)n);
        text[n] = '\0';
        char *stop = NULL;
        double d = PyOS_string_to_double(text, &stop, NULL);
        if (!PyErr_Occurred()) {
            ok = stop == text + n;
            *out = d;
        }
        if (text != small) PyMem_Free(text);
    }
    *save = PyEval_SaveThread();
    return ok;
}

#endif
