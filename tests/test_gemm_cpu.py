"""The packed-panel GEMM the recurrent time loops call (``nnkit._ext.gemm_cpu``).

- ``matmul_packed`` == the float64 product of the same matrices (hypothesis over M, K, N
  including 0, 1, tails of the 4-row tile and of the 32/16-column panels, both dtypes);
- ``pack_panels``'s layout, written out by hand; ``stream_rows`` copies exactly its block;
- every build this CPU can run (baseline, AVX2+FMA, AVX-512), called directly, == the
  product; the kernel chosen for this CPU is one of them; bad input to the Python entry.
"""

import ctypes

import numba
import numpy as np
import pytest
from helpers import assert_matches_reference
from hypothesis import example, given
from hypothesis import strategies as st

from nnkit._ext import gemm_cpu, gemm_packed


@given(M=st.integers(0, 13), K=st.integers(0, 70), N=st.integers(0, 100),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
@example(M=32, K=128, N=512, dtype=np.float32, seed=0)  # an LSTM step, every tile full
@example(M=5, K=1, N=33, dtype=np.float64, seed=1)  # one full and one 1-column panel
@example(M=6, K=600, N=45, dtype=np.float32, seed=2)  # a long k loop, a partial panel
@example(M=13, K=384, N=70, dtype=np.float32, seed=3)  # 8-row, 4-row and 1-row tiles
def test_matmul_packed_is_the_matrix_product(M, K, N, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    got = gemm_cpu.matmul_packed(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    assert_matches_reference(got / scale, (want / scale).astype(dtype), dtype,
                             factor=8 * max(K, 1))


@pytest.mark.parametrize("dtype, width", [(np.float32, 32), (np.float64, 16)])
def test_pack_panels_layout(dtype, width):
    b = np.arange(3 * (width + 5), dtype=dtype).reshape(3, width + 5)
    panels = gemm_cpu.pack_panels(b)
    assert panels.shape == (2, 3, width) and panels.dtype == dtype
    np.testing.assert_array_equal(panels[0], b[:, :width])
    np.testing.assert_array_equal(panels[1, :, :5], b[:, width:])
    assert not panels[1, :, 5:].any()  # zero beyond the last column
    assert gemm_cpu.PANEL_WIDTH[np.dtype(dtype).name] == width


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pack_panels_of_views_and_stacks(dtype):
    """A transposed view (W.T, column-major) and a strided slice pack as their copies do;
    pack_stacked_panels(top, bottom) == pack_panels of the row stack."""
    rng = np.random.default_rng(4)
    w_ih, w_hh = rng.standard_normal((45, 7)).astype(dtype), rng.standard_normal((45, 19))
    w_hh = w_hh.astype(dtype)
    for b in (w_ih.T, w_hh.T, w_hh[::2].T, w_hh[:, ::3]):
        np.testing.assert_array_equal(gemm_cpu.pack_panels(b),
                                      gemm_cpu.pack_panels(np.ascontiguousarray(b)))
    want = gemm_cpu.pack_panels(np.concatenate((w_ih.T, w_hh.T)))
    for top, bottom in ((w_ih.T, w_hh.T), (np.ascontiguousarray(w_ih.T), w_hh.T)):
        np.testing.assert_array_equal(gemm_cpu.pack_stacked_panels(top, bottom), want)


@numba.njit
def _stream_copy(src, dst):
    gemm_cpu.stream_rows(src, dst)
    gemm_cpu.stream_fence()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stream_rows_copies_blocks_at_any_alignment(dtype):
    """stream_rows: dst = src for row blocks of wider matrices, whatever the alignment of
    dst's rows (its unaligned head and tail are plain stores), and nothing outside dst."""
    rng = np.random.default_rng(5)
    src = rng.standard_normal((9, 70)).astype(dtype)
    for r0, c0, d0, rows, cols in [(0, 0, 0, 9, 70), (1, 3, 1, 5, 33), (2, 0, 5, 1, 1),
                                   (0, 7, 2, 4, 0), (3, 1, 0, 0, 8)]:
        dst = np.full((11, 80), -1.0, dtype)
        _stream_copy(src[r0:r0 + rows, c0:c0 + cols], dst[1:1 + rows, d0:d0 + cols])
        want = np.full_like(dst, -1.0)
        want[1:1 + rows, d0:d0 + cols] = src[r0:r0 + rows, c0:c0 + cols]
        np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("build", sorted(gemm_packed.variant_addresses()))
def test_every_build_is_the_matrix_product(build):
    isa, dtype = build
    address = gemm_packed.variant_addresses()[build]
    kernel = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, *[ctypes.c_ssize_t] * 3)(address)
    rng = np.random.default_rng(3)
    for M, K, N in [(1, 1, 1), (7, 19, 45), (12, 130, 64), (4, 0, 3)]:
        a = rng.standard_normal((M, K)).astype(dtype)
        b = rng.standard_normal((K, N)).astype(dtype)
        out = np.full((M, N), np.nan, dtype)
        kernel(a.ctypes.data, gemm_cpu.pack_panels(b).ctypes.data, out.ctypes.data, M, K, N)
        assert_matches_reference(out, (a.astype(np.float64) @ b).astype(dtype), dtype,
                                 factor=8 * max(K, 1), err_msg=f"{isa} {(M, K, N)}")


def test_kernel_build_is_known():
    assert gemm_cpu.isa() in {"avx512", "avx2", "baseline", "plain"}


def test_matmul_packed_bad_input():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="float32 and float64"):
        gemm_cpu.matmul_packed(a, np.ones((3, 2)))
    with pytest.raises(TypeError, match="int64"):
        gemm_cpu.matmul_packed(a.astype(np.int64), np.ones((3, 2), np.int64))
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 2\)"):
        gemm_cpu.matmul_packed(a, np.ones((4, 2), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M, K, N", [(130, 128, 200), (257, 160, 130), (515, 300, 40)])
def test_backend_matmul_threaded_paths_equal_the_product(M, K, N, dtype):
    """``nnkit._backend.matmul`` runs mid-sized 2-D products on numba's threads: row blocks
    (a C-contiguous; edges on 4-row tiles, uneven blocks) and inner blocks (a = g^T)."""
    from nnkit import _backend

    rng = np.random.default_rng(5)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    g = rng.standard_normal((K, M)).astype(dtype)
    cases = {"rows": (a, b), "rows, b transposed": (a, np.asfortranarray(b)),
             "inner": (g.T, b)}
    for name, (left, right) in cases.items():
        blocks, how = _backend._blocks(left, right)
        want = left.astype(np.float64) @ right.astype(np.float64)
        if numba_threads() > 1:
            assert blocks > 1 and how == name.split(",")[0], name
        for parts in (1, 2, 3):
            run = (gemm_cpu.matmul_rows_parallel if how == "rows"
                   else gemm_cpu.matmul_inner_parallel)
            if how:
                got = run(left, right, parts)
                scale = float(np.abs(want).max())
                assert_matches_reference(got / scale, (want / scale).astype(dtype), dtype,
                                         factor=8 * K, err_msg=f"{name}, {parts} blocks")
        got = _backend.matmul(left, right)
        np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == np.float32 else 1e-12,
                                   atol=1e-4 * np.sqrt(K), err_msg=name)


def test_backend_matmul_keeps_blas_for_other_products():
    from nnkit import _backend

    a = np.ones((200, 64), np.float32)
    assert _backend._blocks(a, np.ones((64, 8), np.float64))[0] == 1  # mixed dtypes
    assert _backend._blocks(a[:100], np.ones((64, 8), np.float32))[0] == 1  # too few rows
    assert _backend._blocks(np.ones((2, 200, 64)), np.ones((64, 8)))[0] == 1  # batched
    assert _backend._blocks(a[:, ::2], np.ones((32, 512), np.float32))[0] == 1  # strided a


def test_backend_matmul_splits_large_products_too(monkeypatch):
    """Products above SMALL_GEMM_FLOPS that ``_blocks`` can split also run on numba's
    threads (with OpenBLAS's two threads between numba kernels a BERT step ran ~30%
    slower); unsplittable ones go to ``@``."""
    from nnkit import _backend

    monkeypatch.setattr(_backend, "SMALL_GEMM_FLOPS", 1 << 20)
    monkeypatch.setattr(_backend, "_blocks", lambda a, b: (2, "rows") if a.ndim == 2 else (
        1, ""))
    calls = []
    real = gemm_cpu.matmul_rows_parallel
    monkeypatch.setattr(gemm_cpu, "matmul_rows_parallel",
                        lambda a, b, parts: calls.append(parts) or real(a, b, parts))
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((256, 128)), rng.standard_normal((128, 64))
    np.testing.assert_allclose(_backend.matmul(a, b), a @ b, rtol=1e-12)
    assert calls == [2]
    batched = rng.standard_normal((3, 256, 128))
    np.testing.assert_allclose(_backend.matmul(batched, b), batched @ b, rtol=1e-12)
    assert calls == [2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_tiles_give_identical_rows(dtype):
    """Each element is the same k-ordered chain of multiply-adds in an 8-row, a 4-row and a
    1-row tile: 13 rows at once (8 + 4 + 1) equal the rows computed one at a time, bit for
    bit (the time loops' results do not depend on how a batch is split into tiles)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((13, 300)).astype(dtype)
    bp = gemm_cpu.pack_panels(rng.standard_normal((300, 70)).astype(dtype))
    whole = np.empty((13, 70), dtype)
    gemm_cpu.step_gemm(a, bp, whole)
    for i in range(13):
        row = np.empty((1, 70), dtype)
        gemm_cpu.step_gemm(a[i:i + 1], bp, row)
        np.testing.assert_array_equal(whole[i:i + 1], row, err_msg=f"row {i}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M, K", [(13, 70), (8, 1), (3, 0)])
def test_step_gemm_ld_on_column_blocks_accumulates(M, K, dtype):
    """step_gemm_ld on a block of columns of a wider matrix (rows lda apart): against every
    panel of a packed b, and against a block of rows of one panel, overwriting and then
    accumulating: summed over blocks, the whole product (as the weight-gradient kernel
    uses it)."""
    rng = np.random.default_rng(5)
    wide = rng.standard_normal((M, 2 * K + 3)).astype(dtype)
    b = rng.standard_normal((2 * K + 3, 45)).astype(dtype)
    a64, b64 = wide.astype(np.float64), b.astype(np.float64)
    out = np.full((M, 45), np.nan, dtype)
    gemm_cpu.step_gemm_ld(wide[:, K:2 * K], gemm_cpu.pack_panels(b[K:2 * K]), out, False)
    assert_matches_reference(out, (a64[:, K:2 * K] @ b64[K:2 * K]).astype(dtype), dtype,
                             factor=8 * max(K, 1))
    panel = gemm_cpu.pack_panels(b[:, :16])  # one panel (16 columns: float32 or float64)
    out = np.full((M, 16), np.nan, dtype)
    for k0, k1 in ((K, 2 * K), (0, K), (2 * K, 2 * K + 3)):
        gemm_cpu.step_gemm_ld(wide[:, k0:k1], panel[:, k0:k1], out, k0 != K)
    assert_matches_reference(out, (a64 @ b64[:, :16]).astype(dtype), dtype,
                             factor=8 * (2 * K + 3))


def numba_threads():
    import numba

    return numba.get_num_threads()


def test_step_gemm_from_python():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    b = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = np.empty((2, 4))
    gemm_cpu.step_gemm(a, gemm_cpu.pack_panels(b), out)
    np.testing.assert_array_equal(out, a @ b)
