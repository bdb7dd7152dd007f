/* refmlp.h - the float64 reference of the demo model (dense -> relu ->
 * dense, tensors 0.weight/0.bias/2.weight/2.bias, as model_write_demo
 * writes it) that the integration and fault tests check results against.
 * The weights are read back through the project's safetensors reader; the
 * arithmetic is the test's own, in double. Header-only; include after
 * cmocka.h. */
#ifndef KINFER_REFMLP_H
#define KINFER_REFMLP_H

#include <stdlib.h>

#include "../gpu/safetensors.h"

struct ref_mlp {
    size_t in, hid, out;
    double *w0, *b0, *w1, *b1; /* [hid][in], [hid], [out][hid], [out] */
};

/* Copies one tensor into a new double array, checking its element count. */
static __attribute__((unused)) double *ref_mlp_tensor(const struct st_file *f, const char *name,
                                                      size_t numel)
{
    const struct st_tensor *t = st_find(f, name);
    if (!t || t->numel != numel) fail_msg("reference model: tensor %s missing or not %zu values",
                                          name, numel);
    float *tmp = malloc(numel * sizeof(float));
    double *d = malloc(numel * sizeof(double));
    assert_true(tmp && d && st_to_f32(t, tmp) == 0);
    for (size_t i = 0; i < numel; i++) d[i] = tmp[i];
    free(tmp);
    return d;
}

/* Loads the demo model at path; shapes come from its tensors. */
static __attribute__((unused)) void ref_mlp_load(struct ref_mlp *m, const char *path)
{
    char err[512];
    struct st_file *f = st_open(path, err, sizeof(err));
    if (!f) fail_msg("reference model: %s", err);
    const struct st_tensor *w0 = st_find(f, "0.weight"), *w1 = st_find(f, "2.weight");
    assert_true(w0 && w1 && w0->ndim == 2 && w1->ndim == 2);
    m->hid = (size_t)w0->shape[0];
    m->in = (size_t)w0->shape[1];
    m->out = (size_t)w1->shape[0];
    m->w0 = ref_mlp_tensor(f, "0.weight", m->hid * m->in);
    m->b0 = ref_mlp_tensor(f, "0.bias", m->hid);
    m->w1 = ref_mlp_tensor(f, "2.weight", m->out * m->hid);
    m->b1 = ref_mlp_tensor(f, "2.bias", m->out);
    st_close(f);
}

/* rows x in floats through the model, in double, into rows x out. */
static __attribute__((unused)) void ref_mlp_forward(const struct ref_mlp *m, const float *in,
                                                    size_t rows, double *out)
{
    double *h = malloc(m->hid * sizeof(double));
    assert_non_null(h);
    for (size_t r = 0; r < rows; r++) {
        for (size_t i = 0; i < m->hid; i++) {
            double s = m->b0[i];
            for (size_t k = 0; k < m->in; k++) s += m->w0[i * m->in + k] * in[r * m->in + k];
            h[i] = s > 0 ? s : 0;
        }
        for (size_t o = 0; o < m->out; o++) {
            double s = m->b1[o];
            for (size_t k = 0; k < m->hid; k++) s += m->w1[o * m->hid + k] * h[k];
            out[r * m->out + o] = s;
        }
    }
    free(h);
}

static __attribute__((unused)) void ref_mlp_free(struct ref_mlp *m)
{
    free(m->w0);
    free(m->b0);
    free(m->w1);
    free(m->b1);
}

#endif
