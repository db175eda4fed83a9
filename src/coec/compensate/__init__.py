"""Post-pruning compensation of one module through the registered methods: none, bias (FLAP),
lstsq (ridge), rcpu, coec (the paper's Algorithm 1), blend (beyond the paper), and any method
a config's ``plugins`` register (docs/adding-a-method.md).

    from coec.compensate import compensate
    out = compensate(W0, gram, mean, keep, "coec", alpha=0.9, align_lambda=50.0,
                     inputs={"value_proj": V}, n_tokens=N)
    out.weight, out.bias, out.info

W0 (d_out, d_in) original o_proj/down_proj weight (any float dtype/device); gram (d_in, d_in)
``sum_t x_t x_t^T`` or its mean (results do not depend on which: the Gram is normalised to unit
mean diagonal first); mean (d_in,) channel means (needed by bias and blend); keep (k,) sorted,
unique kept column indices; n_tokens the tokens gram sums over (needed by the methods that
return a bias, whose error needs the Gram's scale); inputs the method's extra data
(``Method.inputs``: blend's ``base_weight``/``base_bias``/``holdout_*``, coec's ``value_proj``);
the solve runs on W0's device; check, for any method: the calibration's
``GramCheck`` of the module (App. B's verdict and the output energy, formed once per calibration;
without it they are formed here). Options: the method's dataclass
(``coec.compensate.methods.<name>``; docs/compensation-options.md), by name, or the method
already resolved (``options.Resolved``, as the compensate stage passes it).

Reported errors (``info``): ``relerr_before`` of the pruned weight W0[:, K], ``relerr_after`` of
the module as the method returns it (with its bias, if any; then ``relerr_after_weight_only``
too), in float64 on the PSD-checked metric from the residual (``errors.residual_errors``: one
``W0 G`` product and the pruned block ``G[P, P]``; a weight other than W0[:, K] adds one
product), unless the method reports its own (coec: in its untempered metric).

Solver watchdog (App. B; not an option, since it does not change results): the device entries of
the SVD and eigh fallback chains run with a wall-clock limit, 600 s on CUDA and none on the CPU
by default; ``COEC_SOLVER_TIMEOUT`` (seconds, 0 = off) or ``watchdog.solver_timeout(s)`` set it,
and a timeout appears in ``info["svd_fallbacks"]`` as ``"<entry>:timeout"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coec.compensate.run import compensate

__all__ = ["compensate"]


def __getattr__(name: str) -> Any:
    """``compensate``, imported on first use: the package's modules that the config validation
    and the workflow read (the methods' options and entries) import no torch."""
    if name == "compensate":
        from coec.compensate.run import compensate  # deferred: keeps the job boundary torch-free

        return compensate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
