/* The exact k nearest neighbours both ways, x->y and y->x, from one fused pass on an
 * x86-64 CPU with AVX2 and FMA: each 6 x 16 block of inner products is computed in
 * registers (a GEMM micro-kernel, BLIS's loop order) and checked there against the
 * k-th best score of its 6 rows and of its 16 columns; only a block holding a score
 * above one of them leaves the registers, to be inserted into the sorted lists.
 *
 * Why it is here and not in a library: BLAS returns the whole product, which a top-k
 * must then read again (faiss's IndexFlatIP does that, one direction a search; the XLA
 * kernel in knn.py reads each tile twice more for its group maxima). XLA:CPU does not
 * fuse a dot with the reductions that follow it. Fused, the selection costs a few
 * compares per 6 x 16 block (docs/performance.md, "A fused kernel on CPU").
 *
 * Loaded by vmx/evaluation/knn_cpu.py with ctypes (no Python API here); one call handles
 * a range of x's rows against all of y and keeps its own column lists, so several calls
 * run at once in threads (ctypes releases the GIL) and their column lists are merged.
 * Built by setup.py as an optional extension; without a compiler or AVX2, knn.py's XLA
 * kernel serves. */
#include <math.h>
#include <stdint.h>

#if !defined(__x86_64__)
int vmx_knn_supported(void) { return 0; }   /* another architecture: knn.py's XLA kernel */
#else
#include <immintrin.h>

#define MR 6    /* rows of a micro-kernel block: 12 accumulators + 3 registers of 16 */
#define NR 16   /* columns: two 8-float registers */
#define MC 240  /* rows packed at a time: 240 x D floats stay in L2 (120 KiB at D = 128) */

int vmx_knn_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Rows packed at a time: the caller's scratch is vmx_knn_block_rows() * D floats. */
int vmx_knn_block_rows(void) { return MC; }

/* y [M, D] row-major -> panels [ceil(M / 16)][D][16]; columns past M are zeros. */
void vmx_knn_pack_cols(const float *y, int64_t M, int64_t D, float *yp) {
  int64_t panels = (M + NR - 1) / NR;
  for (int64_t p = 0; p < panels; p++) {
    float *dst = yp + p * D * NR;
    for (int t = 0; t < NR; t++) {
      int64_t j = p * NR + t;
      const float *src = y + j * D;
      for (int64_t d = 0; d < D; d++) dst[d * NR + t] = j < M ? src[d] : 0.f;
    }
  }
}

/* Insert score s with id j into a list of k sorted best first, given s > v[k - 1]. */
static inline void insert(float *v, int32_t *ix, int k, float s, int32_t j) {
  int p = k - 1;
  while (p > 0 && v[p - 1] < s) {
    v[p] = v[p - 1];
    ix[p] = ix[p - 1];
    p--;
  }
  v[p] = s;
  ix[p] = j;
}

/* Rows [r0, r1) of x [N, D] against the packed y (M columns):
 *   row_v / row_i [r1 - r0, k]: those rows' lists (filled by the caller with -inf / 0);
 *   col_v / col_i [M, k]: this call's column lists, over its rows only (ditto);
 *   col_thr [panels * 16]: each column's k-th best so far (-inf; +inf past M);
 *   apack: scratch of MC * D floats, 32-byte aligned. */
__attribute__((target("avx2,fma")))
void vmx_knn_rows(const float *x, int64_t r0, int64_t r1, int64_t D, const float *yp,
                  int64_t M, int k, float *row_v, int32_t *row_i, float *col_v,
                  int32_t *col_i, float *col_thr, float *apack) {
  const int64_t panels = (M + NR - 1) / NR;
  float rthr[MC];
  float s[MR][NR] __attribute__((aligned(32)));
  for (int64_t i0 = r0; i0 < r1; i0 += MC) {
    const int64_t mc = (r1 - i0 < MC) ? r1 - i0 : MC;
    const int64_t blocks = (mc + MR - 1) / MR;
    for (int64_t q = 0; q < blocks; q++) {
      float *dst = apack + q * D * MR;
      for (int u = 0; u < MR; u++) {
        int64_t i = i0 + q * MR + u;
        if (q * MR + u < mc) {
          const float *src = x + i * D;
          for (int64_t d = 0; d < D; d++) dst[d * MR + u] = src[d];
          rthr[q * MR + u] = row_v[(i - r0) * k + k - 1];
        } else {
          for (int64_t d = 0; d < D; d++) dst[d * MR + u] = 0.f;
          rthr[q * MR + u] = INFINITY;   /* a padding row never enters a row list */
        }
      }
    }
    for (int64_t p = 0; p < panels; p++) {
      const float *b = yp + p * D * NR;
      for (int64_t q = 0; q < blocks; q++) {
        const float *a = apack + q * D * MR;
        __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
        __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
        __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
        __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
        __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
        __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
          const __m256 b0 = _mm256_load_ps(b + d * NR), b1 = _mm256_load_ps(b + d * NR + 8);
          const float *ad = a + d * MR;
          __m256 av = _mm256_broadcast_ss(ad);
          c00 = _mm256_fmadd_ps(av, b0, c00); c01 = _mm256_fmadd_ps(av, b1, c01);
          av = _mm256_broadcast_ss(ad + 1);
          c10 = _mm256_fmadd_ps(av, b0, c10); c11 = _mm256_fmadd_ps(av, b1, c11);
          av = _mm256_broadcast_ss(ad + 2);
          c20 = _mm256_fmadd_ps(av, b0, c20); c21 = _mm256_fmadd_ps(av, b1, c21);
          av = _mm256_broadcast_ss(ad + 3);
          c30 = _mm256_fmadd_ps(av, b0, c30); c31 = _mm256_fmadd_ps(av, b1, c31);
          av = _mm256_broadcast_ss(ad + 4);
          c40 = _mm256_fmadd_ps(av, b0, c40); c41 = _mm256_fmadd_ps(av, b1, c41);
          av = _mm256_broadcast_ss(ad + 5);
          c50 = _mm256_fmadd_ps(av, b0, c50); c51 = _mm256_fmadd_ps(av, b1, c51);
        }
        /* columns: any score above its column's k-th best? */
        const __m256 t0 = _mm256_loadu_ps(col_thr + p * NR);
        const __m256 t1 = _mm256_loadu_ps(col_thr + p * NR + 8);
        __m256 hit = _mm256_or_ps(
            _mm256_or_ps(_mm256_cmp_ps(c00, t0, _CMP_GT_OQ), _mm256_cmp_ps(c01, t1, _CMP_GT_OQ)),
            _mm256_or_ps(_mm256_cmp_ps(c10, t0, _CMP_GT_OQ), _mm256_cmp_ps(c11, t1, _CMP_GT_OQ)));
        hit = _mm256_or_ps(hit, _mm256_or_ps(
            _mm256_or_ps(_mm256_cmp_ps(c20, t0, _CMP_GT_OQ), _mm256_cmp_ps(c21, t1, _CMP_GT_OQ)),
            _mm256_or_ps(_mm256_cmp_ps(c30, t0, _CMP_GT_OQ), _mm256_cmp_ps(c31, t1, _CMP_GT_OQ))));
        hit = _mm256_or_ps(hit, _mm256_or_ps(
            _mm256_or_ps(_mm256_cmp_ps(c40, t0, _CMP_GT_OQ), _mm256_cmp_ps(c41, t1, _CMP_GT_OQ)),
            _mm256_or_ps(_mm256_cmp_ps(c50, t0, _CMP_GT_OQ), _mm256_cmp_ps(c51, t1, _CMP_GT_OQ))));
        /* rows: any score above its row's k-th best? */
        const float *rt = rthr + q * MR;
        __m256 rhit = _mm256_or_ps(
            _mm256_cmp_ps(_mm256_max_ps(c00, c01), _mm256_broadcast_ss(rt), _CMP_GT_OQ),
            _mm256_cmp_ps(_mm256_max_ps(c10, c11), _mm256_broadcast_ss(rt + 1), _CMP_GT_OQ));
        rhit = _mm256_or_ps(rhit, _mm256_or_ps(
            _mm256_cmp_ps(_mm256_max_ps(c20, c21), _mm256_broadcast_ss(rt + 2), _CMP_GT_OQ),
            _mm256_cmp_ps(_mm256_max_ps(c30, c31), _mm256_broadcast_ss(rt + 3), _CMP_GT_OQ)));
        rhit = _mm256_or_ps(rhit, _mm256_or_ps(
            _mm256_cmp_ps(_mm256_max_ps(c40, c41), _mm256_broadcast_ss(rt + 4), _CMP_GT_OQ),
            _mm256_cmp_ps(_mm256_max_ps(c50, c51), _mm256_broadcast_ss(rt + 5), _CMP_GT_OQ)));
        if (!_mm256_movemask_ps(_mm256_or_ps(hit, rhit))) continue;
        _mm256_store_ps(s[0], c00); _mm256_store_ps(s[0] + 8, c01);
        _mm256_store_ps(s[1], c10); _mm256_store_ps(s[1] + 8, c11);
        _mm256_store_ps(s[2], c20); _mm256_store_ps(s[2] + 8, c21);
        _mm256_store_ps(s[3], c30); _mm256_store_ps(s[3] + 8, c31);
        _mm256_store_ps(s[4], c40); _mm256_store_ps(s[4] + 8, c41);
        _mm256_store_ps(s[5], c50); _mm256_store_ps(s[5] + 8, c51);
        for (int u = 0; u < MR; u++) {
          const int64_t r = q * MR + u;
          if (r >= mc) break;
          const int64_t i = i0 + r;
          float *rv = row_v + (i - r0) * k;
          int32_t *ri = row_i + (i - r0) * k;
          for (int t = 0; t < NR; t++) {
            const int64_t j = p * NR + t;
            if (j >= M) break;
            const float v = s[u][t];
            if (v > rthr[r]) {
              insert(rv, ri, k, v, (int32_t)j);
              rthr[r] = rv[k - 1];
            }
            if (v > col_thr[j]) {
              insert(col_v + j * k, col_i + j * k, k, v, (int32_t)i);
              col_thr[j] = col_v[j * k + k - 1];
            }
          }
        }
      }
    }
  }
}
#endif  /* __x86_64__ */
