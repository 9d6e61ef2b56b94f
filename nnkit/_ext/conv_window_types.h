/* The window kernels of both float types for one build, included by conv_window.h with
 * CW_ATTR, CW_NV and CW_TAG (the names' suffix: f32_<tag>, f64_<tag>) defined, and for the
 * AVX-512 build CW_ROWS8, CW_MASK_STORE_F32 and CW_MASK_STORE_F64. */

#define CW_PASTE2(a, b) a##_##b
#define CW_PASTE(a, b) CW_PASTE2(a, b)

#define CW_T float
#define CW_V cw_v16f
#define CW_L 16
#define CW_SUF CW_PASTE(f32, CW_TAG)
#ifdef CW_MASK_STORE_F32
#define CW_MASK_STORE CW_MASK_STORE_F32
#endif
#include "conv_window_body.h"
#undef CW_MASK_STORE
#undef CW_SUF
#undef CW_T
#undef CW_V
#undef CW_L

#define CW_T double
#define CW_V cw_v8d
#define CW_L 8
#define CW_SUF CW_PASTE(f64, CW_TAG)
#ifdef CW_MASK_STORE_F64
#define CW_MASK_STORE CW_MASK_STORE_F64
#endif
#include "conv_window_body.h"
#undef CW_MASK_STORE
#undef CW_SUF
#undef CW_T
#undef CW_V
#undef CW_L

#undef CW_PASTE
#undef CW_PASTE2
