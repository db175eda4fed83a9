"""Checks of a compensation problem's data, each raising ``ValueError`` with one line naming the
argument and the problem (shapes, dtypes, NaN/Inf, the kept indices)."""

from __future__ import annotations

from typing import Any, NoReturn, cast

import torch

from coec.compensate.methods.base import Method


def _fail(msg: str) -> NoReturn:
    raise ValueError(msg)


def check_tensor(name: str, t: Any, ndim: int) -> None:
    """``t`` is a finite floating-point tensor of ``ndim`` dimensions."""
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        _fail(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        _fail(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        _fail(f"{name} contains NaN or Inf")


def check_keep(keep: Any, d_in: int) -> torch.Tensor:
    """``keep`` as a long tensor of sorted, unique column indices in ``[0, d_in)``."""
    if not isinstance(keep, torch.Tensor):
        try:
            keep = torch.as_tensor(keep)
        except Exception as exc:  # noqa: BLE001
            _fail(f"keep must be a 1-D integer tensor: {exc}")
    if keep.ndim != 1:
        _fail(f"keep must be 1-D, got shape {tuple(keep.shape)}")
    if keep.numel() == 0:
        _fail("keep is empty: at least one column must be kept")
    if keep.dtype.is_floating_point or keep.dtype == torch.bool or keep.is_complex():
        _fail(f"keep must hold integer indices, got dtype {keep.dtype}")
    keep = keep.to(torch.long)
    lo, hi = int(keep.min()), int(keep.max())
    if lo < 0 or hi >= d_in:
        _fail(f"keep index out of range [0, {d_in}): min {lo}, max {hi}")
    d = keep[1:] - keep[:-1]
    if bool((d == 0).any()):
        _fail("keep has duplicate indices")
    if bool((d < 0).any()):
        _fail("keep must be sorted ascending")
    return cast(torch.Tensor, keep)


def check_problem(W0: Any, gram: Any, mean: Any, keep: Any, m: Method, n_tokens: Any) -> torch.Tensor:
    """The arguments of ``compensate`` for method ``m`` (its ``needs_mean`` / ``needs_n_tokens``);
    returns ``keep`` as a long tensor."""
    check_tensor("W0", W0, 2)
    check_tensor("gram", gram, 2)
    d_out, d_in = W0.shape
    if tuple(gram.shape) != (d_in, d_in):
        _fail(f"gram shape {tuple(gram.shape)} does not match W0 shape {tuple(W0.shape)}: expected ({d_in}, {d_in})")
    if mean is not None:
        check_tensor("mean", mean, 1)
        if mean.shape[0] != d_in:
            _fail(f"mean has {mean.shape[0]} entries, expected d_in = {d_in}")
    elif m.needs_mean:
        _fail(f"method {m.name!r} requires mean (d_in,) channel means")
    if m.needs_n_tokens and n_tokens is None:
        _fail(f"method {m.name!r} requires n_tokens (the Gram's token count) for the error of its bias")
    if n_tokens is not None and not (
        isinstance(n_tokens, (int, float)) and not isinstance(n_tokens, bool) and n_tokens > 0
    ):
        _fail(f"n_tokens must be a positive number, got {n_tokens!r}")
    return check_keep(keep, d_in)
