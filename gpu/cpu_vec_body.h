/* cpu_vec_body.h - the bodies of cpu_vec.c's functions, included there
 * once per instruction set, with SUF(name) naming that copy of each (see
 * cpu_vec.c). No include guard: it is meant to be included several
 * times. */

#define ld SUF(ld)
#define st SUF(st)
#define splat SUF(splat)
#define sel SUF(sel)
#define vexp2 SUF(vexp2)
#define vgelu SUF(vgelu)
#define cpuv_exp SUF(cpuv_exp)
#define cpuv_bias_gelu SUF(cpuv_bias_gelu)
#define cpuv_bias_relu SUF(cpuv_bias_relu)
#define cpuv_softmax_row SUF(cpuv_softmax_row)
#define cpuv_layernorm_row SUF(cpuv_layernorm_row)

INLINE vf ld(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof(v));
    return v;
}

INLINE void st(float *p, vf v)
{
    memcpy(p, &v, sizeof(v));
}

INLINE vf splat(float a)
{
    return (vf){0} + a;
}

/* m ? a : b, lane by lane (m from a comparison: all ones or zero). */
INLINE vf sel(vi m, vf a, vf b)
{
    return (vf)((m & (vi)a) | (~m & (vi)b));
}

/* exp(a + b) * 2^k for |b| <= 1.5, without rounding a + b first: n
 * comes from the rounded sum, r = (a - n ln2_hi) + b - n ln2_lo, and
 * 2^(n + k) is applied in two halves so that neither leaves the normal
 * range (denormal results come out of the last multiply, rounded once).
 * 0 below 2^-150, inf above FLT_MAX; NaN stays NaN. */
INLINE vf vexp2(vf a, vf b, int k)
{
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vf s = a + b;
    vi under = s < splat(-(150.0f + (float)k) * 0.693147181f);
    vi over = s > splat((128.0f - (float)k) * 0.693147181f);
    a = sel(under, splat(0.0f), a);
    a = sel(over, splat(0.0f), a);
    b = sel(under, splat(0.0f), b);
    b = sel(over, splat(0.0f), b);
    s = a + b;
    vf n = (s * splat(1.44269504f) + magic) - magic;
    vf r = ((a - n * splat(0.693145751953125f)) + b) - n * splat(1.428606765330187045e-6f);
    vf p = splat(1.0f / 5040.0f);
    p = p * r + splat(1.0f / 720.0f);
    p = p * r + splat(1.0f / 120.0f);
    p = p * r + splat(1.0f / 24.0f);
    p = p * r + splat(1.0f / 6.0f);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    vi nt = __builtin_convertvector(n, vi) + k;
    vi n1 = nt >> 1, n2 = nt - n1;
    vf y = (p * (vf)((n1 + 127) << 23)) * (vf)((n2 + 127) << 23);
    y = sel(under, splat(0.0f), y);
    return sel(over, splat(INFINITY), y);
}

/* gelu(x) = x (1 - erfc(z)/2) for x >= 0, x erfc(-z)/2 below, z = x/sqrt 2. */
INLINE vf vgelu(vf x)
{
    vf ax = (vf)((vi)x & 0x7fffffff);
    ax = sel(ax > splat(20.0f), splat(20.0f), ax); /* erfc is 0 long before */
    vf z = ax * splat(0.70710678118654752f);
    vf t = splat(1.0f) / (splat(1.0f) + splat(0.5f) * z);
    vf q = splat(0.17087277f);
    q = q * t + splat(-0.82215223f);
    q = q * t + splat(1.48851587f);
    q = q * t + splat(-1.13520398f);
    q = q * t + splat(0.27886807f);
    q = q * t + splat(-0.18628806f);
    q = q * t + splat(0.09678418f);
    q = q * t + splat(0.37409196f);
    q = q * t + splat(1.00002368f);
    q = q * t + splat(-1.26551223f);
    vf xh = (vf)((vi)ax & (int32_t)0xfffff000); /* 12 significant bits: xh^2 is exact */
    vf xl = ax - xh;
    vf hi = (xh * xh) * splat(-0.5f);
    vf lo = (xl * (ax + xh)) * splat(-0.5f) + q;
    /* erfc(|z|) / 2, scaled by 2^24 so that it stays a normal float
     * wherever the GELU does (x up to 20 times it) */
    vf e = (splat(0.5f) * t) * vexp2(hi, lo, 24);
    vf neg = (x * e) * splat(0x1p-24f);
    return sel(x < splat(0.0f), neg, x * (splat(1.0f) - e * splat(0x1p-24f)));
}

static void cpuv_exp(float *y, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + VL <= n; i += VL) st(y + i, vexp2(ld(x + i), splat(0.0f), 0));
    if (i < n) {
        float t[VL] = {0};
        memcpy(t, x + i, (n - i) * sizeof(float));
        st(t, vexp2(ld(t), splat(0.0f), 0));
        memcpy(y + i, t, (n - i) * sizeof(float));
    }
}

static void cpuv_bias_gelu(float *x, const float *bias, size_t n)
{
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf v = ld(x + i);
        if (bias) v += ld(bias + i);
        st(x + i, vgelu(v));
    }
    if (i < n) {
        float t[VL] = {0}, tb[VL] = {0};
        memcpy(t, x + i, (n - i) * sizeof(float));
        if (bias) memcpy(tb, bias + i, (n - i) * sizeof(float));
        st(t, vgelu(ld(t) + ld(tb)));
        memcpy(x + i, t, (n - i) * sizeof(float));
    }
}

static void cpuv_bias_relu(float *x, const float *bias, size_t n, int relu)
{
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf v = ld(x + i);
        if (bias) v += ld(bias + i);
        if (relu) v = sel(v < splat(0.0f), splat(0.0f), v);
        st(x + i, v);
    }
    for (; i < n; i++) {
        float v = x[i] + (bias ? bias[i] : 0.0f);
        x[i] = relu && v < 0.0f ? 0.0f : v;
    }
}

static void cpuv_softmax_row(float *x, size_t w)
{
    size_t i = 0;
    vf m = splat(-INFINITY);
    for (; i + VL <= w; i += VL) {
        vf v = ld(x + i);
        m = sel(v > m, v, m);
    }
    float mx = -INFINITY;
    for (int k = 0; k < VL; k++)
        if (m[k] > mx) mx = m[k];
    for (size_t j = i; j < w; j++)
        if (x[j] > mx) mx = x[j];
    if (mx == -INFINITY) {
        memset(x, 0, w * sizeof(float));
        return;
    }
    vf acc = splat(0.0f), vm = splat(mx);
    for (i = 0; i + VL <= w; i += VL) {
        vf e = vexp2(ld(x + i) - vm, splat(0.0f), 0);
        acc += e;
        st(x + i, e);
    }
    if (i < w) {
        float t[VL];
        for (int k = 0; k < VL; k++) t[k] = -INFINITY;
        memcpy(t, x + i, (w - i) * sizeof(float));
        vf e = vexp2(ld(t) - vm, splat(0.0f), 0); /* the padding's exp is 0 */
        acc += e;
        st(t, e);
        memcpy(x + i, t, (w - i) * sizeof(float));
    }
    double sum = 0.0;
    for (int k = 0; k < VL; k++) sum += acc[k];
    vf inv = splat((float)(1.0 / sum));
    for (i = 0; i + VL <= w; i += VL) st(x + i, ld(x + i) * inv);
    for (; i < w; i++) x[i] *= inv[0];
}

static void cpuv_layernorm_row(const float *g, const float *b, float eps, float *x,
                               const float *res, float *y, size_t w)
{
    /* Sums in double lanes, eight values at a time. */
    vd8 s8 = {0};
    size_t i = 0;
    for (; i + 8 <= w; i += 8) {
        vf8 v;
        memcpy(&v, x + i, sizeof(v));
        if (res) {
            vf8 r;
            memcpy(&r, res + i, sizeof(r));
            v += r;
            memcpy(x + i, &v, sizeof(v));
        }
        s8 += __builtin_convertvector(v, vd8);
    }
    double sum = 0.0;
    for (; i < w; i++) {
        if (res) x[i] += res[i];
        sum += x[i];
    }
    for (int k = 0; k < 8; k++) sum += s8[k];
    double mean = sum / (double)w;
    vd8 q8 = {0}, m8 = (vd8){0} + mean;
    double var = 0.0;
    for (i = 0; i + 8 <= w; i += 8) {
        vf8 v;
        memcpy(&v, x + i, sizeof(v));
        vd8 d = __builtin_convertvector(v, vd8) - m8;
        q8 += d * d;
    }
    for (; i < w; i++) {
        double d = x[i] - mean;
        var += d * d;
    }
    for (int k = 0; k < 8; k++) var += q8[k];
    var /= (double)w;
    /* x - mean as (x - mean_f) - (mean - mean_f): float, yet exact to a
     * rounding of x - mean however large the mean. */
    float mf = (float)mean, dm = (float)(mean - (double)mf);
    float inv = (float)(1.0 / sqrt(var + (double)eps));
    vf vmf = splat(mf), vdm = splat(dm), vinv = splat(inv);
    for (i = 0; i + VL <= w; i += VL) {
        vf v = ((ld(x + i) - vmf) - vdm) * vinv;
        if (g) v *= ld(g + i);
        if (b) v += ld(b + i);
        st(y + i, v);
    }
    for (; i < w; i++) {
        float v = ((x[i] - mf) - dm) * inv;
        if (g) v *= g[i];
        if (b) v += b[i];
        y[i] = v;
    }
}

#undef ld
#undef st
#undef splat
#undef sel
#undef vexp2
#undef vgelu
#undef cpuv_exp
#undef cpuv_bias_gelu
#undef cpuv_bias_relu
#undef cpuv_softmax_row
#undef cpuv_layernorm_row
