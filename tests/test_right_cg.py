"""The conjugate-gradient right solve (option right_solver: cg, beyond the paper)."""

import torch
from test_compensate_problems import make_oproj, make_problem

from coec.compensate import compensate
from coec.compensate.stiefel import _conjugate, riemannian_grad, solve_reduced


def _run(problem, **opts):
    W0, G, mean, keep = problem[:4]
    return compensate(W0, G, mean, keep, "coec", alpha=0.9, max_rounds=20, **opts).info


def test_conjugate_direction_is_a_tangent_descent_direction_and_restarts_otherwise():
    g = torch.Generator().manual_seed(0)
    R = torch.linalg.qr(torch.randn(12, 5, generator=g, dtype=torch.float64)).Q.mT  # (5, 12), R R^T = I
    G = riemannian_grad(R, torch.randn(5, 12, generator=g, dtype=torch.float64))
    Gp = riemannian_grad(R, torch.randn(5, 12, generator=g, dtype=torch.float64))
    dirn = {"grad": G, "transport": lambda P: riemannian_grad(R, P)}
    P, restarted = _conjugate(dirn, {"grad": Gp, "dir": Gp})
    sym = P @ R.mT + R @ P.mT
    assert torch.allclose(sym, torch.zeros_like(sym), atol=1e-12)  # tangent at R
    assert float((G * P).sum()) > 0                                # a descent direction (we move along -P)
    assert _conjugate(dirn, None) == (G, True)                      # first step: the gradient
    P, restarted = _conjugate(dirn, {"grad": Gp, "dir": -50.0 * G})  # transported direction points uphill
    assert restarted and torch.equal(P, G)


def test_cg_right_solve_is_monotone_and_ends_below_its_start():
    W0, G, mean, keep, _ = make_problem(d_out=32, d_in=96, k=64, n_tokens=1500)
    Gxx, WG = G[keep][:, keep], W0 @ G
    Gyx, c = WG[:, keep], float((WG * W0).sum())
    U, S, Vt = torch.linalg.svd(W0[:, keep], full_matrices=False)
    res = solve_reduced(U, S, Vt, Gxx, Gyx, c, float(torch.linalg.eigvalsh(Gxx)[-1]), method="cg", track=True,
                        max_steps=60)
    assert all(b <= a for a, b in zip(res.history, res.history[1:]))
    assert res.F_end < res.F_start and res.steps > 1
    assert torch.allclose(res.R @ res.R.mT, torch.eye(res.R.shape[0], dtype=res.R.dtype), atol=1e-10)


def test_cg_at_two_steps_a_round_beats_the_default_and_the_literal_step():
    """Synthetic MLP (polar retraction) and o_proj (Cayley) problems: with at most 2 right-solve
    steps a round, CG ends at a lower objective than the literal step (eta_scale raw) and at most
    that of the default exact-line-search gradient steps (which take 3.8-15 steps a round)."""
    for problem in (make_problem(d_out=48, d_in=160, k=110, n_tokens=2000),
                    make_problem(d_out=64, d_in=200, k=140, n_tokens=3000, seed=1),
                    make_oproj(n_heads=12, n_kv=4, hd=16, d_model=160, prune_groups=1, n_tokens=3000)):
        cg = _run(problem, right_solver="cg", max_inner_steps=2)
        gd, raw = _run(problem), _run(problem, eta_scale="raw")
        assert cg["inner_steps"] <= 2 * cg["rounds"] < gd["inner_steps"]
        assert cg["objective_history"][-1] < raw["objective_history"][-1]
        assert cg["objective_history"][-1] <= gd["objective_history"][-1] * (1 + 1e-4)
        assert all(b <= a for a, b in zip(cg["objective_history"], cg["objective_history"][1:]))


def test_cg_is_deterministic_and_the_default_is_gradient_descent():
    problem = make_problem()
    a, b = _run(problem, right_solver="cg"), _run(problem, right_solver="cg")
    assert a["objective_history"] == b["objective_history"]
    assert "restarts" in a["right"] and "restarts" not in _run(problem)["right"]
