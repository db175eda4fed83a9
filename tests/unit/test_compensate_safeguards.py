"""App. B numerical safeguards, each triggered on purpose, and degenerate statistics."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from coec.compensate import compensate, gram, linalg, watchdog
from coec.compensate.method import METHODS
from conftest import method_kwargs
from test_compensate_method_problems import make_problem

pytestmark = pytest.mark.usefixtures("one_thread")


def _finite(out):
    return bool(torch.isfinite(out.weight).all()) and (out.bias is None or bool(torch.isfinite(out.bias).all()))


def _monotone(h):
    return all(b <= a for a, b in zip(h, h[1:]))


def _split_gram(W0, keep, kept_val, pruned_val):
    d = torch.full((W0.shape[1],), pruned_val, dtype=W0.dtype)
    d[keep] = kept_val
    return torch.diag(d)


def test_nonpositive_scale_denominator_is_skipped():
    """Indefinite (here negative on the kept block) Gram: <W, W Gxx> < 0, the scale is not applied."""
    W0, _, mean, keep, _ = make_problem(16, 40, 28, 300)
    G = _split_gram(W0, keep, -1.0, 10.0)  # ||Y||^2 > 0 but Gxx negative definite
    r = compensate(W0, G, mean, keep, "rcpu")
    assert r.info["scale_skipped"] == 1 and _finite(r)
    out = compensate(W0, G, mean, keep, "coec", alpha=1.0, psd_clip=False, max_rounds=5)
    assert out.info["scale_skipped"] > 0 and _finite(out)
    assert float(out.weight.abs().max()) < 1e3 * float(W0.abs().max())
    assert _monotone(out.info["objective_history"])
    # default: negative eigenvalues clipped before tempering (reported), still finite
    out = compensate(W0, G, mean, keep, "coec", max_rounds=5)
    assert out.info["temper_negative_eigs"] == keep.numel() and _finite(out)


def test_indefinite_gram_unbounded_without_clip_is_bounded_with_clip():
    W0, G, mean, keep, X = make_problem(16, 40, 28, 300, seed=2)
    ev, E = torch.linalg.eigh(G)
    ev[0] = -1e-3 * float(ev.max())  # an fp-error-like negative eigenvalue
    Gi = (E * ev) @ E.mT
    out = compensate(W0, Gi, mean, keep, "coec", max_rounds=10)
    assert _finite(out) and out.info["temper_negative_eigs"] == 1
    assert out.info["relerr_tempered_after"] >= 0.0  # clipped metric is PSD: error cannot go negative


def test_svd_fallback_chain(monkeypatch):
    W0, G, mean, keep, _ = make_problem(16, 40, 28, 300)
    ref = compensate(W0, G, mean, keep, "coec", max_rounds=5, compute_dtype="float64")
    real = torch.linalg.svd
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated cuSOLVER failure")
        return real(*a, **k)

    monkeypatch.setattr(torch.linalg, "svd", flaky)
    out = compensate(W0, G, mean, keep, "coec", max_rounds=5, compute_dtype="float64")
    assert out.info["svd_fallbacks"] == ["cpu_float64"]
    assert torch.allclose(out.weight, ref.weight, atol=1e-10)
    calls["n"] = 0
    r = compensate(W0, G, mean, keep, "rcpu")
    assert r.info["svd_fallbacks"] == ["cpu_float64"] and _finite(r)


def test_svd_fallback_on_nonfinite_and_total_failure(monkeypatch):
    A = torch.randn(6, 4, dtype=torch.float64)
    real = torch.linalg.svd
    state = {"n": 0}

    def nan_once(*a, **k):
        state["n"] += 1
        U, S, Vh = real(*a, **k)
        return (U * float("nan"), S, Vh) if state["n"] == 1 else (U, S, Vh)

    monkeypatch.setattr(torch.linalg, "svd", nan_once)
    rec = []
    U, S, Vh = linalg.svd(A, rec)
    assert rec == ["cpu_float64"] and torch.allclose((U * S) @ Vh, A, atol=1e-12)

    def always(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(torch.linalg, "svd", always)
    with pytest.raises(RuntimeError, match="fallback chain"):
        linalg.svd(A, [])


def test_eigh_failures_fall_back(monkeypatch):
    """Every eigh path has a fallback (App. B's chain, for the GPU's eigh factorisations): the
    eigh itself retries in float64 on the CPU; the eigh-based polar / SVD / top vectors fall back
    to the SVD chain; each recorded."""
    real_eigh = torch.linalg.eigh

    def fails_below_fp64(M, *a, **k):
        if M.dtype != torch.float64:
            raise torch.linalg.LinAlgError("simulated cuSOLVER syevd failure")
        return real_eigh(M, *a, **k)

    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 12, generator=g, dtype=torch.float64)
    G = X.mT @ X
    monkeypatch.setattr(torch.linalg, "eigh", fails_below_fp64)
    rec = []
    w, E = linalg.eigh(G.float(), rec)
    assert rec == ["eigh->cpu_float64"] and w.dtype == torch.float32
    torch.testing.assert_close((E * w) @ E.mT, G.float(), rtol=1e-4, atol=1e-3)
    rec = []
    Ga = gram.temper_gram(G.float(), 0.9, record=rec).G
    ref = gram.temper_gram(G, 0.9).G
    assert rec == ["eigh->cpu_float64"]
    torch.testing.assert_close(Ga.double(), ref, rtol=1e-5, atol=1e-4)

    def always(*a, **k):
        raise torch.linalg.LinAlgError("simulated failure")

    A = torch.randn(9, 5, generator=g, dtype=torch.float64)
    P_ref = linalg.polar(A)
    monkeypatch.setattr(torch.linalg, "eigh", always)
    rec = []
    torch.testing.assert_close(linalg.polar_eigh(A, rec), P_ref)
    assert rec == ["polar_eigh->svd"]
    rec = []
    U, S, Vh = linalg.svd_eigh(A, rec)
    assert rec == ["svd_eigh->svd"]
    torch.testing.assert_close((U * S) @ Vh, A)
    rec = []
    top = linalg.top_singular_vectors(A, 2, "right", "eigh", rec)
    assert rec == ["eigh->svd"] and top.shape == (5, 2)
    with pytest.raises(RuntimeError, match="eigh failed"):
        linalg.eigh(G, [])


def test_kappa_band_triggers_in_compensate():
    """Kept weight with tiny tail singular values whose output directions the pruned (but
    correlated) columns write strongly: with lambda forced -> 0 the per-mode optimum of the tail
    modes is orders of magnitude above s* sigma_i (App. B: up to ~1e4x measured)."""
    g = torch.Generator().manual_seed(3)
    d_out, k = 10, 8
    U, _ = torch.linalg.qr(torch.randn(d_out, k, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(k, k, generator=g, dtype=torch.float64))
    WK = (U * torch.logspace(0, -4, k, dtype=torch.float64)) @ V.mT
    WP = torch.randn(d_out, k, generator=g, dtype=torch.float64)
    W0 = torch.cat([WK, WP], 1)
    XK = torch.randn(k, 200, generator=g, dtype=torch.float64)
    X = torch.cat([XK, XK + 0.1 * torch.randn(k, 200, generator=g, dtype=torch.float64)])
    keep = torch.arange(k)
    G, mean = X @ X.mT, X.mean(1)
    kw = dict(gcv_grid=(1e-10, 1e-9, 2), max_rounds=3, compute_dtype="float64")
    out = compensate(W0, G, mean, keep, "coec", kappa=10.0, **kw)
    assert out.info["kappa_clamped"] > 0 and _finite(out)
    assert _monotone(out.info["objective_history"])
    free = compensate(W0, G, mean, keep, "coec", kappa=None, **kw)
    assert free.info["kappa_clamped"] == 0
    # one rescale (max_rounds=0: Alg. 1 lines 3-4 only) moves each value by at most kappa
    kw["max_rounds"] = 0
    sv0 = torch.linalg.svdvals(WK)
    band = torch.linalg.svdvals(compensate(W0, G, mean, keep, "coec", kappa=10.0, **kw).weight)
    free = torch.linalg.svdvals(compensate(W0, G, mean, keep, "coec", kappa=None, **kw).weight)
    rb, rf = band / sv0, free / sv0  # every band ratio lies in [s*/kappa, kappa s*]
    assert float(rb.max() / rb.min()) <= 100.0 + 1e-6
    assert float(rf.max() / rf.min()) > 1000.0


def test_step_cap_triggers():
    W0, G, mean, keep, _ = make_problem(16, 40, 28, 300, seed=1)
    out = compensate(W0, G, mean, keep, "coec", eta=1e8, eta_scale="raw", max_rounds=5, compute_dtype="float64")
    assert out.info["right"]["capped"] > 0 and _finite(out)
    assert _monotone(out.info["objective_history"])
    assert out.info["relerr_after"] < out.info["relerr_before"]


@pytest.mark.parametrize("method", METHODS)
def test_rank_deficient_gram_and_dead_channel(method):
    W0, _, mean, keep, X = make_problem(16, 40, 28, 12, seed=6)  # 12 tokens << d_in
    X = X.clone()
    X[keep[3]] = 0.0  # dead kept channel: all-zero row/column of G
    X[keep[7]] = 0.0
    G = X @ X.mT
    kw = {"max_rounds": 5} if method == "coec" else method_kwargs(method, W0, G, X.mean(1), keep, 12)
    out = compensate(W0, G, X.mean(1), keep, method, **kw)
    assert _finite(out) and math.isfinite(out.info["relerr_after"])
    assert out.info["relerr_after"] <= out.info["relerr_before"] + 1e-6  # with the bias, if any
    if method == "coec":
        assert _monotone(out.info["objective_history"])


def test_zero_gram_is_finite():
    W0, _, mean, keep, _ = make_problem(16, 40, 28, 300)
    G = torch.zeros(40, 40, dtype=W0.dtype)
    for method in METHODS:
        out = compensate(W0, G, mean, keep, method, **method_kwargs(method, W0, G, mean, keep, 300))
        assert _finite(out), method


@pytest.fixture
def hang_first():
    """Make the first call of a torch.linalg solver hang (until the test ends), like a cuSOLVER
    call that never returns; later calls are real. Yields install(name) -> call counter."""
    release = threading.Event()
    patched = []

    def install(name):
        real = getattr(torch.linalg, name)
        calls = {"n": 0}

        def hangs_once(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                release.wait(60)
                raise RuntimeError("released after the test")
            return real(*a, **k)

        patched.append((name, real))
        setattr(torch.linalg, name, hangs_once)
        return calls

    yield install
    for name, real in patched:
        setattr(torch.linalg, name, real)
    release.set()


def test_watchdog_limit_sources(monkeypatch):
    monkeypatch.delenv(watchdog.ENV_VAR, raising=False)
    assert watchdog.timeout_seconds("cpu") is None and watchdog.timeout_seconds("cuda") == 600.0
    monkeypatch.setenv(watchdog.ENV_VAR, "2.5")
    assert watchdog.timeout_seconds("cpu") == 2.5
    with watchdog.solver_timeout(0):
        assert watchdog.timeout_seconds("cuda") is None
        with watchdog.solver_timeout(1):
            assert watchdog.timeout_seconds("cpu") == 1.0
        assert watchdog.timeout_seconds("cpu") is None
    assert watchdog.timeout_seconds("cpu") == 2.5
    monkeypatch.setenv(watchdog.ENV_VAR, "0")
    assert watchdog.timeout_seconds("cuda") is None
    monkeypatch.setenv(watchdog.ENV_VAR, "soon")
    with pytest.raises(ValueError, match=watchdog.ENV_VAR):
        watchdog.timeout_seconds("cpu")
    with pytest.raises(ValueError, match="solver_timeout"):
        with watchdog.solver_timeout(-1):
            pass


def test_watched_call_returns_raises_and_keeps_thread_settings():
    A = torch.randn(7, 5, dtype=torch.float64)
    with watchdog.solver_timeout(30):
        U, S, Vh = watchdog.watched(lambda: torch.linalg.svd(A, full_matrices=False), A.device, "svd")
        assert torch.allclose((U * S) @ Vh, A, atol=1e-12)
        seen = watchdog.watched(lambda: (torch.get_num_threads(), torch.is_grad_enabled()), "cpu", "probe")
        assert seen == (torch.get_num_threads(), torch.is_grad_enabled())
        with torch.no_grad():
            assert watchdog.watched(torch.is_grad_enabled, "cpu", "probe") is False
        with pytest.raises(torch.linalg.LinAlgError):
            watchdog.watched(lambda: torch.linalg.cholesky(-torch.eye(3)), "cpu", "cholesky")


def test_watchdog_turns_a_hanging_svd_into_the_next_entry(hang_first):
    """App. B: a solver that never returns becomes a recoverable failure; the chain goes on."""
    A = torch.randn(30, 12, dtype=torch.float32)
    ref = torch.linalg.svdvals(A.double())
    hang_first("svd")
    rec = []
    t0 = time.perf_counter()
    with watchdog.solver_timeout(0.3):
        U, S, Vh = linalg.svd(A, rec)
    assert time.perf_counter() - t0 < 10.0
    assert rec == ["default:timeout", "cpu_float64"] and S.dtype == torch.float32
    torch.testing.assert_close(S.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((U * S) @ Vh, A, rtol=1e-4, atol=1e-4)


def test_watchdog_on_eigh_paths(hang_first):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(40, 9, generator=g, dtype=torch.float64)
    G = X.mT @ X
    calls = hang_first("eigh")
    rec = []
    with watchdog.solver_timeout(0.3):
        w, E = linalg.eigh(G.float(), rec)
    assert rec == ["eigh:timeout", "eigh->cpu_float64"] and calls["n"] == 2
    torch.testing.assert_close((E * w) @ E.mT, G.float(), rtol=1e-4, atol=1e-3)
    calls["n"] = 0  # the eigh-based polar: the timed-out eigh sends it down the SVD chain
    rec = []
    with watchdog.solver_timeout(0.3):
        P = linalg.polar_eigh(X, rec)
    assert rec == ["eigh:timeout", "polar_eigh->svd"]
    torch.testing.assert_close(P, linalg.polar(X))


def test_coec_with_a_hanging_first_svd_matches_the_reference(hang_first):
    W0, G, mean, keep, _ = make_problem(16, 40, 28, 300)
    ref = compensate(W0, G, mean, keep, "coec", max_rounds=4, compute_dtype="float64")
    hang_first("svd")
    with watchdog.solver_timeout(0.3):
        out = compensate(W0, G, mean, keep, "coec", max_rounds=4, compute_dtype="float64")
    assert out.info["svd_fallbacks"] == ["default:timeout", "cpu_float64"]
    torch.testing.assert_close(out.weight, ref.weight, rtol=0, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
def test_watched_cuda_call_on_a_side_stream_matches_the_plain_call():
    A = torch.randn(512, 384, device="cuda")
    ref = torch.linalg.svdvals(A)
    with watchdog.solver_timeout(120):
        for _ in range(3):  # results are synchronised and usable on the caller's stream
            U, S, Vh = linalg.svd(A * 1.0)
            torch.testing.assert_close(S, ref)
            torch.testing.assert_close((U * S) @ Vh, A, rtol=1e-3, atol=1e-3)
        w, E = linalg.eigh(A.mT @ A)
        torch.testing.assert_close(w.flip(0).sqrt(), ref, rtol=1e-3, atol=1e-2)


def test_hung_side_streams_are_skipped(monkeypatch):
    """Watched calls share one side stream per device; after a hang it is replaced, and torch's
    stream pool (round-robin) handing the hung one back is skipped."""
    handles = iter([7, 7, 8])

    class FakeStream:
        def __init__(self, device):
            self.cuda_stream = next(handles)

    dev = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(watchdog, "_hung_streams", set())
    monkeypatch.setattr(watchdog, "_side_streams", {})
    first = watchdog._side_stream(dev)
    assert first.cuda_stream == 7 and watchdog._side_stream(dev) is first  # shared
    watchdog._abandon(dev, first)
    assert watchdog._side_stream(dev).cuda_stream == 8  # 7 came back from the pool: skipped
    monkeypatch.setattr(watchdog, "_hung_streams", {9})
    monkeypatch.setattr(watchdog, "_side_streams", {})
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: type("S", (), {"cuda_stream": 9})())
    with pytest.raises(watchdog.SolverTimeout, match="every side stream"):
        watchdog._side_stream(dev)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
def test_watchdog_on_a_cuda_kernel_that_does_not_return_in_time(monkeypatch):
    """A real busy kernel (``torch.cuda._sleep``, ~4 s) ahead of the SVD on its stream stands in
    for a hung cuSOLVER call: the chain moves on to gesvd within the limit, and the caller's
    stream stays usable while the abandoned stream is still busy."""
    A = torch.randn(256, 128, device="cuda")
    real = torch.linalg.svd
    calls = {"n": 0}
    # cycles for ~4 s at the GPU's clock (clock_rate in kHz where torch exposes it)
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 2_000_000) or 2_000_000
    cycles = int(4.0 * khz * 1e3)

    def stalls_once(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            torch.cuda._sleep(cycles)  # queued on the watched call's side stream
        return real(*a, **k)

    monkeypatch.setattr(torch.linalg, "svd", stalls_once)
    rec = []
    t0 = time.perf_counter()
    with watchdog.solver_timeout(0.5):
        U, S, Vh = linalg.svd(A, rec)
    t_svd = time.perf_counter() - t0
    t1 = time.perf_counter()
    B = (A @ A.mT).sum()
    torch.cuda.current_stream().synchronize()
    t_main = time.perf_counter() - t1
    torch.cuda.synchronize()  # let the stalled stream finish before the next test
    assert rec == ["default:timeout", "gesvd"]
    assert t_svd < 3.0 and t_main < 1.0 and bool(torch.isfinite(B))
    torch.testing.assert_close((U * S) @ Vh, A, rtol=1e-3, atol=1e-3)
