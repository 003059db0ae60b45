/* The order statistics of the pairwise slopes of many trend windows, in C.
 *
 * forensics.evidence.order_stats.slope_stats_rows in one call: for each row pair (x, y) of
 * two (k, n) float64 arrays, the values at ranks ``ks`` of its n(n-1)/2 slopes
 * (y[j] - y[i]) / (x[j] - x[i]), i < j, and at ranks ``ks_h`` of the slopes of the pairs
 * i < j < n / 2. The caller passes only rows whose slopes hold no NaN and no -0.0
 * (order_stats.plain_for_slopes_rows), so each order statistic is one value, whatever
 * algorithm selects it: these are the numbers numpy's partition gives. Each slope is the same
 * IEEE operation numpy performs (a subtraction of each, then a division).
 *
 * Why C: a million-step grad norm holds thousands of spikes, each with a 300-point trend
 * window of 44,850 slopes; numpy forms and brackets them in about 190 microseconds a window,
 * most of it the Python and numpy calls around small arrays. The GIL is released for the
 * whole call, so the caller can split the rows between threads.
 *
 * The selection: the ranks are bracketed by two order statistics of a fixed sample of the
 * slopes; one pass counts the values below the lower bound and gathers those between; the
 * gathered values are binned by value, and only the bins holding a rank are selected from.
 * Where the bounds miss a rank, the whole array is selected from (still exact, slower).
 * medians() applies the same selection to the bins of one long array (np.median of each,
 * bin_median's bins and the medians of whole series): one pass over a bin instead of numpy's
 * copy and partition of it.
 *
 * The module is optional: without a C compiler forensics uses the numpy path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PICK_MIN 4096    /* below this many values, select from all of them */
#define PICK_EVERY 44    /* one sampled slope in 44 */
#define PER_BIN 32       /* values a bin between the bounds, about */
#define MAX_KS 8

/* ---- selection ------------------------------------------------------------------------ */

static void heap_sift(double *a, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t root = start;
    while (2 * root + 1 < end) {
        Py_ssize_t child = 2 * root + 1;
        if (child + 1 < end && a[child] < a[child + 1]) child++;
        if (a[root] < a[child]) {
            double t = a[root]; a[root] = a[child]; a[child] = t;
            root = child;
        } else {
            return;
        }
    }
}

static void heap_sort(double *a, Py_ssize_t n) {
    for (Py_ssize_t s = n / 2 - 1; s >= 0; s--) heap_sift(a, s, n);
    for (Py_ssize_t e = n - 1; e > 0; e--) {
        double t = a[0]; a[0] = a[e]; a[e] = t;
        heap_sift(a, 0, e);
    }
}

/* a[k] after putting a[lo, hi) in an order where a[lo, k) <= a[k] <= a[k + 1, hi); no NaN. */
static double nth(double *a, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t k) {
    int depth = 0;
    while (hi - lo > 16) {
        if (++depth > 64) { /* a run of bad pivots: sort what is left */
            heap_sort(a + lo, hi - lo);
            return a[k];
        }
        Py_ssize_t mid = lo + (hi - lo) / 2;
        double p0 = a[lo], p1 = a[mid], p2 = a[hi - 1], pivot;
        if (p0 < p1) pivot = p1 < p2 ? p1 : (p0 < p2 ? p2 : p0);
        else pivot = p0 < p2 ? p0 : (p1 < p2 ? p2 : p1);
        Py_ssize_t i = lo, j = hi - 1;
        while (i <= j) { /* the pivot's value lies in the range: both scans stop */
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                double t = a[i]; a[i] = a[j]; a[j] = t;
                i++; j--;
            }
        }
        if (k <= j) hi = j + 1;
        else if (k >= i) lo = i;
        else return a[k]; /* between the two scans: equal to the pivot */
    }
    for (Py_ssize_t i = lo + 1; i < hi; i++) { /* insertion sort of a short range */
        double v = a[i];
        Py_ssize_t j = i - 1;
        while (j >= lo && a[j] > v) { a[j + 1] = a[j]; j--; }
        a[j + 1] = v;
    }
    return a[k];
}

/* out[i] = the value of rank ks[i] in a[0, n) (ks sorted, distinct); a is reordered. */
static void nth_many(double *a, Py_ssize_t n, const Py_ssize_t *ks, int nk, double *out) {
    Py_ssize_t hi = n;
    for (int i = nk - 1; i >= 0; i--) { /* from the highest rank down, each in the prefix */
        out[i] = nth(a, 0, hi, ks[i]);
        hi = ks[i];
    }
}

/* Where the compiler and the C library can pick a function's version when the module is
 * loaded (GCC's target_clones and target attributes, glibc's ifunc), hot loops are also
 * compiled for AVX2: the same IEEE operations on more values at a time. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
#define SLOPES_X86 1
#include <immintrin.h>
#define SLOPES_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SLOPES_X86 0
#define SLOPES_CLONES
#endif

/* The values of a[0, n) within [low, high] to in (which has room for n + 4), in order; the
 * count of those below low to *below. Branch-free: a value is always written and the end
 * moves on only when it lies within the bounds. */
static Py_ssize_t gather_plain(const double *a, Py_ssize_t n, double low, double high,
                               double *in, Py_ssize_t *below_out) {
    Py_ssize_t below = 0, m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = a[i];
        below += v < low;
        in[m] = v;
        m += (v >= low) & (v <= high);
    }
    *below_out = below;
    return m;
}

#if SLOPES_X86
/* For each 4-bit mask of the lanes kept, the permutation that moves those doubles (as pairs
 * of 32-bit halves) to the front. */
static int32_t keep_lanes[16][8];

static void init_keep_lanes(void) {
    for (int mask = 0; mask < 16; mask++) {
        int at = 0;
        for (int lane = 0; lane < 4; lane++) {
            if (mask & (1 << lane)) {
                keep_lanes[mask][2 * at] = 2 * lane;
                keep_lanes[mask][2 * at + 1] = 2 * lane + 1;
                at++;
            }
        }
        for (; at < 4; at++) keep_lanes[mask][2 * at] = keep_lanes[mask][2 * at + 1] = 0;
    }
}

/* gather_plain four values at a time: the kept ones moved to the front of a vector that is
 * stored whole at the end (up to 3 values past it are overwritten later or never read). */
__attribute__((target("avx2,popcnt")))
static Py_ssize_t gather_avx2(const double *a, Py_ssize_t n, double low, double high,
                              double *in, Py_ssize_t *below_out) {
    __m256d lo = _mm256_set1_pd(low), hi = _mm256_set1_pd(high);
    Py_ssize_t below = 0, m = 0, i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_loadu_pd(a + i);
        int under = _mm256_movemask_pd(_mm256_cmp_pd(v, lo, _CMP_LT_OQ));
        int keep = _mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd(v, lo, _CMP_GE_OQ),
                                                    _mm256_cmp_pd(v, hi, _CMP_LE_OQ)));
        __m256i perm = _mm256_loadu_si256((const __m256i *)keep_lanes[keep]);
        _mm256_storeu_ps((float *)(in + m),
                         _mm256_permutevar8x32_ps(_mm256_castpd_ps(v), perm));
        below += __builtin_popcount((unsigned)under);
        m += __builtin_popcount((unsigned)keep);
    }
    Py_ssize_t rest_below = 0;
    m += gather_plain(a + i, n - i, low, high, in + m, &rest_below);
    *below_out = below + rest_below;
    return m;
}

static int have_avx2 = 0;
#endif

static Py_ssize_t gather(const double *a, Py_ssize_t n, double low, double high, double *in,
                         Py_ssize_t *below_out) {
#if SLOPES_X86
    if (have_avx2) return gather_avx2(a, n, low, high, in, below_out);
#endif
    return gather_plain(a, n, low, high, in, below_out);
}

typedef struct {
    double *sample;     /* the sampled values */
    double *inside;     /* the values between the bounds */
    Py_ssize_t *counts; /* per bin */
    int *bins;          /* each inside value's bin */
    signed char *slot;  /* per bin: which wanted bin it is, or -1 */
    double *bin_vals;   /* the values of the bins wanted */
} Scratch;

/* nth_many on a[0, n), in spare (a copy of a is made there first unless spare is a). */
static void nth_whole(const double *a, Py_ssize_t n, const Py_ssize_t *ks, int nk, double *out,
                      double *spare) {
    if (spare != a) memcpy(spare, a, sizeof(double) * (size_t)n);
    nth_many(spare, n, ks, nk, out);
}

/* The values of ranks ks (sorted, distinct, < n) of a[0, n), into out. Where the bracket
 * misses, the ranks are selected from all n values in ``spare`` (room for n): a copy of a,
 * or a itself (then a is reordered). */
static void select_ranks(const double *a, Py_ssize_t n, const Py_ssize_t *ks, int nk, double *out,
                         Scratch *s, double *spare) {
    if (nk == 0) return;
    if (n < PICK_MIN) {
        nth_whole(a, n, ks, nk, out, spare);
        return;
    }
    /* The sample: every PICK_EVERY-th value from a fixed offset pattern. Which values are
     * sampled decides only the speed. */
    Py_ssize_t ms = n / PICK_EVERY;
    for (Py_ssize_t i = 0; i < ms; i++) s->sample[i] = a[i * PICK_EVERY + (i * 17) % PICK_EVERY];
    Py_ssize_t margin = (Py_ssize_t)(1.3 * sqrt((double)ms)) + 4;
    Py_ssize_t ra = ks[0] * ms / n - margin;
    Py_ssize_t rb = (ks[nk - 1] * ms + n - 1) / n + margin;
    if (ra < 0 || rb >= ms) {
        nth_whole(a, n, ks, nk, out, spare);
        return;
    }
    double high = nth(s->sample, 0, ms, rb);
    double low = nth(s->sample, 0, rb, ra);
    /* One pass: count the values below low, gather those in [low, high]. */
    Py_ssize_t below = 0;
    double *in = s->inside;
    Py_ssize_t m = gather(a, n, low, high, in, &below);
    if (ks[0] < below || ks[nk - 1] - below >= m) {
        nth_whole(a, n, ks, nk, out, spare);
        return;
    }
    Py_ssize_t local[MAX_KS];
    for (int i = 0; i < nk; i++) local[i] = ks[i] - below;
    Py_ssize_t nb = m / PER_BIN;
    if (nb < 4) nb = 4;
    double scale = (double)nb / (high - low);
    if (!(isfinite(scale) && scale > 0)) {
        nth_many(in, m, local, nk, out);
        return;
    }
    /* Bins of equal width between the bounds: floor((v - low) * scale) is monotone in v, so
     * each bin holds a run of the sorted values and the counts say which bin holds a rank. */
    Py_ssize_t *counts = s->counts;
    int *bins = s->bins;
    memset(counts, 0, sizeof(Py_ssize_t) * (size_t)(nb + 1));
    for (Py_ssize_t i = 0; i < m; i++) {
        Py_ssize_t b = (Py_ssize_t)((in[i] - low) * scale);
        b = b > nb ? nb : b;
        bins[i] = (int)b;
        counts[b]++;
    }
    /* The bins holding a rank (at most nk), and where each one's values go in bin_vals. */
    Py_ssize_t held[MAX_KS], first[MAX_KS], fill[MAX_KS];
    int ng = 0, group_of[MAX_KS];
    Py_ssize_t start = 0, b = 0, at = 0;
    for (int i = 0; i < nk; i++) {
        while (start + counts[b] <= local[i]) { start += counts[b]; b++; }
        if (ng == 0 || held[ng - 1] != b) {
            held[ng] = b; first[ng] = start; fill[ng] = at; at += counts[b]; ng++;
        }
        group_of[i] = ng - 1;
    }
    signed char *slot = s->slot;
    memset(slot, -1, (size_t)(nb + 1));
    for (int g = 0; g < ng; g++) slot[held[g]] = (signed char)g;
    Py_ssize_t base[MAX_KS];
    for (int g = 0; g < ng; g++) base[g] = fill[g];
    for (Py_ssize_t t = 0; t < m; t++) { /* one pass: the values of every bin wanted */
        int g = slot[bins[t]];
        if (g >= 0) s->bin_vals[fill[g]++] = in[t];
    }
    for (int i = 0; i < nk;) { /* each bin's ranks, selected among its values */
        int g = group_of[i], j = i;
        Py_ssize_t kk[MAX_KS];
        while (j < nk && group_of[j] == g) { kk[j - i] = local[j] - first[g]; j++; }
        nth_many(s->bin_vals + base[g], counts[held[g]], kk, j - i, out + i);
        i = j;
    }
}

/* ---- the slopes ---------------------------------------------------------------------- */

/* The n(n-1)/2 slopes of (x, y) into buf (pairs i < j, by i then j) and those of the pairs
 * i < j < n / 2 into half as well. */
SLOPES_CLONES
static void form_slopes(const double *x, const double *y, Py_ssize_t n, double *buf,
                        double *half) {
    Py_ssize_t h = n / 2, p = 0, q = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double xi = x[i], yi = y[i];
        Py_ssize_t j = i + 1;
        for (; j < h; j++) { /* a pair of the first half: kept twice */
            double v = (y[j] - yi) / (x[j] - xi);
            buf[p++] = v;
            half[q++] = v;
        }
        for (; j < n; j++) buf[p++] = (y[j] - yi) / (x[j] - xi);
    }
}

/* ---- the module function ---------------------------------------------------------------- */

static int get_ranks(PyObject *seq, Py_ssize_t *ks, int *nk, Py_ssize_t size) {
    PyObject *fast = PySequence_Fast(seq, "ranks must be a sequence");
    if (fast == NULL) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (len > MAX_KS) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many ranks");
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        ks[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (ks[i] == -1 && PyErr_Occurred()) { Py_DECREF(fast); return -1; }
        if (ks[i] < 0 || ks[i] >= size || (i && ks[i] <= ks[i - 1])) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_ValueError, "ranks must be sorted, distinct and in range");
            return -1;
        }
    }
    *nk = (int)len;
    Py_DECREF(fast);
    return 0;
}

static int get_doubles(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t size) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->itemsize != 8 || view->format == NULL || strcmp(view->format, "d") != 0 ||
        view->len != size * 8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "expected a C-contiguous float64 array of the shape");
        return -1;
    }
    return 0;
}

static PyObject *stats_rows(PyObject *self, PyObject *args) {
    PyObject *xo, *yo, *kso, *ksho, *go, *gho;
    Py_ssize_t k, n, r0, r1;
    if (!PyArg_ParseTuple(args, "OOnnOOOOnn", &xo, &yo, &k, &n, &kso, &ksho, &go, &gho, &r0, &r1))
        return NULL;
    if (n < 2 || k < 0 || r0 < 0 || r1 > k || r0 > r1) {
        PyErr_SetString(PyExc_ValueError, "bad shape or row range");
        return NULL;
    }
    Py_ssize_t h = n / 2, nt = n * (n - 1) / 2, nth_ = h * (h - 1) / 2;
    Py_ssize_t ks[MAX_KS], ksh[MAX_KS];
    int nk = 0, nkh = 0;
    if (get_ranks(kso, ks, &nk, nt) < 0 || get_ranks(ksho, ksh, &nkh, nth_ > 0 ? nth_ : 0) < 0)
        return NULL;
    Py_buffer xb, yb, gb, ghb;
    if (get_doubles(xo, &xb, 0, k * n) < 0) return NULL;
    if (get_doubles(yo, &yb, 0, k * n) < 0) { PyBuffer_Release(&xb); return NULL; }
    if (get_doubles(go, &gb, 1, k * nk) < 0) {
        PyBuffer_Release(&xb); PyBuffer_Release(&yb); return NULL;
    }
    if (get_doubles(gho, &ghb, 1, k * nkh) < 0) {
        PyBuffer_Release(&xb); PyBuffer_Release(&yb); PyBuffer_Release(&gb); return NULL;
    }
    double *buf = malloc(sizeof(double) * (size_t)(nt + nth_ + 1));
    double *work = malloc(sizeof(double) * (size_t)(2 * nt + nt / PICK_EVERY + 8));
    Py_ssize_t *counts = malloc(sizeof(Py_ssize_t) * (size_t)(nt / PER_BIN + 8));
    int *bins = malloc(sizeof(int) * (size_t)(nt + 1));
    signed char *slot = malloc((size_t)(nt / PER_BIN + 8));
    PyObject *result = NULL;
    if (buf == NULL || work == NULL || counts == NULL || bins == NULL || slot == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    double *half = buf + nt;
    Scratch s = {work, work + nt / PICK_EVERY + 1, counts, bins, slot,
                 work + nt / PICK_EVERY + 1 + nt + 4};
    const double *X = xb.buf, *Y = yb.buf;
    double *G = gb.buf, *GH = ghb.buf;
    for (Py_ssize_t r = r0; r < r1; r++) {
        form_slopes(X + r * n, Y + r * n, n, buf, half);
        select_ranks(buf, nt, ks, nk, G + r * nk, &s, buf);
        select_ranks(half, nth_, ksh, nkh, GH + r * nkh, &s, half);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free(buf);
    free(work);
    free(counts);
    free(bins);
    free(slot);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    PyBuffer_Release(&gb);
    PyBuffer_Release(&ghb);
    return result;
}

/* medians(a, edges, out, b0, b1): for each bin b in [b0, b1), out[b] = np.median of
 * a[edges[b], edges[b + 1]) (a float64, edges int64 increasing, every bin non-empty): NaN
 * where the bin holds a NaN, else the middle order statistic as ``0.0 + v`` or the two as
 * ``(0.0 + u + v) / 2.0``, numpy's arithmetic. Starting the sum from +0.0 (numpy's sum starts
 * from its identity) makes the result independent of which zero a selection picks, so the
 * bracketed selection of select_ranks gives numpy's number. The GIL is released. */
static PyObject *medians(PyObject *self, PyObject *args) {
    PyObject *ao, *eo, *oo;
    Py_ssize_t b0, b1;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnn", &ao, &eo, &oo, &b0, &b1)) return NULL;
    Py_buffer ab, eb, ob;
    if (PyObject_GetBuffer(ao, &ab, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(eo, &eb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&ab);
        return NULL;
    }
    if (PyObject_GetBuffer(oo, &ob, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&ab);
        PyBuffer_Release(&eb);
        return NULL;
    }
    PyObject *result = NULL;
    double *work = NULL, *spare = NULL, *inside = NULL, *bin_vals = NULL;
    Py_ssize_t *counts = NULL;
    int *bins = NULL;
    signed char *slot = NULL;
    Py_ssize_t n = ab.len / 8, nb = ob.len / 8;
    const double *A = ab.buf;
    const int64_t *E = eb.buf;
    double *O = ob.buf;
    if (ab.itemsize != 8 || strcmp(ab.format, "d") != 0 || ob.itemsize != 8 ||
        strcmp(ob.format, "d") != 0 || eb.itemsize != 8 ||
        (strcmp(eb.format, "l") != 0 && strcmp(eb.format, "q") != 0) ||
        eb.len / 8 != nb + 1 || b0 < 0 || b1 > nb || b0 > b1) {
        PyErr_SetString(PyExc_ValueError, "medians: bad arrays or bin range");
        goto done;
    }
    Py_ssize_t most = 0;
    for (Py_ssize_t b = b0; b < b1; b++) {
        Py_ssize_t lo = (Py_ssize_t)E[b], hi = (Py_ssize_t)E[b + 1];
        if (lo < 0 || hi > n || hi <= lo) {
            PyErr_SetString(PyExc_ValueError, "medians: a bin out of range or empty");
            goto done;
        }
        if (hi - lo > most) most = hi - lo;
    }
    if (b1 == b0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    work = malloc(sizeof(double) * (size_t)(most / PICK_EVERY + 2));
    spare = malloc(sizeof(double) * (size_t)(most + 1));
    inside = malloc(sizeof(double) * (size_t)(most + 8));
    bin_vals = malloc(sizeof(double) * (size_t)(most + 1));
    counts = malloc(sizeof(Py_ssize_t) * (size_t)(most / PER_BIN + 8));
    bins = malloc(sizeof(int) * (size_t)(most + 1));
    slot = malloc((size_t)(most / PER_BIN + 8));
    if (!work || !spare || !inside || !bin_vals || !counts || !bins || !slot) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    Scratch sc = {work, inside, counts, bins, slot, bin_vals};
    for (Py_ssize_t b = b0; b < b1; b++) {
        const double *v = A + E[b];
        Py_ssize_t m = (Py_ssize_t)(E[b + 1] - E[b]), h = m / 2;
        int nan = 0;
        for (Py_ssize_t i = 0; i < m; i++) nan |= v[i] != v[i];
        if (nan) {
            O[b] = NAN;
            continue;
        }
        Py_ssize_t ks[2] = {h - 1, h};
        double got[2];
        if (m % 2) {
            select_ranks(v, m, ks + 1, 1, got + 1, &sc, spare);
            O[b] = 0.0 + got[1];
        } else {
            select_ranks(v, m, ks, 2, got, &sc, spare);
            O[b] = (0.0 + got[0] + got[1]) / 2.0;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free(work);
    free(spare);
    free(inside);
    free(bin_vals);
    free(counts);
    free(bins);
    free(slot);
    PyBuffer_Release(&ab);
    PyBuffer_Release(&eb);
    PyBuffer_Release(&ob);
    return result;
}

/* simd(flag=None): whether the AVX2 loops are used; flag False turns them off (the tests
 * compare both ways), True back on where the processor has them. */
static PyObject *simd(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *flag = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &flag)) return NULL;
#if SLOPES_X86
    if (flag != Py_None) {
        int on = PyObject_IsTrue(flag);
        if (on < 0) return NULL;
        have_avx2 = on && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    }
    return PyBool_FromLong(have_avx2);
#else
    return PyBool_FromLong(0);
#endif
}

static PyMethodDef methods[] = {
    {"simd", simd, METH_VARARGS,
     "simd(flag=None) -> bool: whether the gathering pass uses AVX2 (flag: turn it off/on)."},
    {"stats_rows", stats_rows, METH_VARARGS,
     "stats_rows(x, y, k, n, ks, ks_h, got, got_h, row0, row1): order_stats.slope_stats_rows "
     "for rows row0..row1 of (k, n) float64 arrays, into got (k, len(ks)) and got_h "
     "(k, len(ks_h)); the GIL is released."},
    {"medians", medians, METH_VARARGS,
     "medians(a, edges, out, b0, b1): np.median of each bin a[edges[b]:edges[b + 1]] for b in "
     "[b0, b1), into out (float64 a and out, int64 edges); the GIL is released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_slopes", "Pairwise-slope order statistics (see _slopes.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__slopes(void) {
#if SLOPES_X86
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    init_keep_lanes();
#endif
    return PyModule_Create(&module);
}
