/*
 * Layer-tap callback for llama.cpp's cb_eval, in C so that the per-node cost is nanoseconds, and the
 * per-token fill of the sampler chain's candidate array (262,144 entries for Gemma 3) from the logits,
 * and the positions of its k best candidates (CARD's own top-k cut when a user's token bias is on).
 *
 * llama.cpp calls the callback once per graph node (about 730 per token for Gemma 3 270M) with
 * ask=true, and again with ask=false once a node it said yes to has been computed. A Python callback
 * costs microseconds per call, which is 10-70 % of a 10 ms token; this one costs almost nothing.
 * It does no allocation: Python owns the buffers and passes the ggml functions it needs as pointers
 * (so nothing here links against ggml). It is a Python extension module only so that pip builds it;
 * the engine loads the symbol with ctypes and falls back to a Python callback when it is missing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LP_MAX_TAPS 16
#define LP_NAME_LEN 64

typedef const char *(*lp_get_name_fn)(const void *tensor);
typedef size_t (*lp_nbytes_fn)(const void *tensor);
typedef void (*lp_tensor_get_fn)(const void *tensor, void *data, size_t offset, size_t size);

typedef struct {
    lp_get_name_fn get_name;
    lp_nbytes_fn nbytes;
    lp_tensor_get_fn tensor_get;
    int n_taps;
    int error; /* 0 ok, 1 tensor not f32, 2 buffer too small */
    char names[LP_MAX_TAPS][LP_NAME_LEN];
    char *buffers[LP_MAX_TAPS];
    size_t capacity[LP_MAX_TAPS];
    size_t filled[LP_MAX_TAPS];
    int stop_after; /* tap index after whose copy the rest of the graph is skipped; -1: never */
} lp_taps;

static int lp_find(const lp_taps *taps, const char *name) {
    if (name == NULL || strncmp(name, "l_out-", 6) != 0) {
        return -1;
    }
    for (int i = 0; i < taps->n_taps; i++) {
        if (strcmp(name, taps->names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

PyMODINIT_FUNC PyInit__taps(void);

__attribute__((visibility("default"))) bool localpers_tap_callback(void *tensor, bool ask, void *user_data) {
    lp_taps *taps = (lp_taps *)user_data;
    int index = lp_find(taps, taps->get_name(tensor));
    if (ask) {
        return index >= 0;
    }
    if (index < 0) {
        return true;
    }
    if (*(const int *)tensor != 0) { /* enum ggml_type is the first field; 0 = GGML_TYPE_F32 */
        taps->error = 1;
        return true;
    }
    size_t size = taps->nbytes(tensor);
    if (taps->filled[index] + size > taps->capacity[index]) {
        taps->error = 2;
        return true;
    }
    taps->tensor_get(tensor, taps->buffers[index] + taps->filled[index], 0, size);
    taps->filled[index] += size;
    /* false makes ggml skip the graph's remaining nodes (the output norm and the vocabulary projection) */
    return index != taps->stop_after;
}

/* Mirror of llama.cpp's llama_token_data. */
typedef struct {
    int32_t id;
    float logit;
    float p;
} lp_token_data;

/* candidates[i] = {i, logits[i], 0}: what llama_sampler_sample does before running a chain, done here so
 * the engine can feed the chain logits it holds itself (a cached prompt's) at C speed. */
__attribute__((visibility("default"))) void localpers_fill_candidates(const float *logits, lp_token_data *candidates,
                                                                      int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        candidates[i].id = i;
        candidates[i].logit = logits[i];
        candidates[i].p = 0.0f;
    }
}

/* The positions of the k highest logits among n candidates, best first, written to `out`; returns how many
 * (min(k, n), fewer when some logits are NaN). One pass keeping a sorted buffer of k: for the small k of a
 * top-k correction nearly every candidate costs one comparison. Ties keep the earlier position first. */
__attribute__((visibility("default"))) int32_t localpers_top_k_positions(const lp_token_data *candidates, int32_t n,
                                                                        int32_t k, int32_t *out) {
    if (k <= 0 || n <= 0) {
        return 0;
    }
    int32_t kept = 0;
    int32_t i = 0;
    for (; i < n && kept < k; i++) { /* fill the buffer */
        float logit = candidates[i].logit;
        if (logit != logit) { /* NaN */
            continue;
        }
        int32_t slot = kept++;
        while (slot > 0 && logit > candidates[out[slot - 1]].logit) {
            out[slot] = out[slot - 1];
            slot--;
        }
        out[slot] = i;
    }
    /* The buffer is full: a candidate must beat the k-th best, kept in a register (a NaN never does). */
    float floor = kept == k ? candidates[out[k - 1]].logit : 0.0f;
    for (; i < n; i++) {
        float logit = candidates[i].logit;
        if (!(logit > floor)) {
            continue;
        }
        int32_t slot = k - 1;
        while (slot > 0 && logit > candidates[out[slot - 1]].logit) {
            out[slot] = out[slot - 1];
            slot--;
        }
        out[slot] = i;
        floor = candidates[out[k - 1]].logit;
    }
    return kept;
}

static struct PyModuleDef lp_module = {
    PyModuleDef_HEAD_INIT, "_taps", "C layer-tap callback, candidate fill and top-k positions for llama.cpp (loaded through ctypes).", -1, NULL,
};

PyMODINIT_FUNC PyInit__taps(void) { return PyModule_Create(&lp_module); }
