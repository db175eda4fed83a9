"""The KL divergence of a cell's next-token distribution to the dense model's, over the perplexity
windows (docs/kl.md).

The dense reference keeps, for every position perplexity scores (position t of a window predicts
token t + 1: ``seqlen - 1`` per window), the dense model's ``k`` most probable tokens with their
log-probabilities, the log of the probability left outside them, ``P_rest``, and ``m`` tokens
drawn from that rest in proportion to their probability (systematic sampling: one uniform offset
per position, ``m`` evenly spaced points on the rest's cumulative distribution), with their
log-probabilities. The KL of a cell at a position is then

    sum_{v in top-k} p_v (log p_v - log q_v) + P_rest * mean_j (log p_{s_j} - log q_{s_j})

the top-k part exact, the rest's part an unbiased estimate of ``sum_{v in rest} p_v (log p_v -
log q_v)`` (each drawn token is distributed as p restricted to the rest). With ``m = 0`` the rest
is one bucket, ``P_rest (log P_rest - log Q_rest)``: a lower bound of the KL (merging outcomes
never increases a divergence). When ``k`` covers the vocabulary there is no rest and the KL is
exact; a model scored against its own reference gets 0 exactly (the same float32 log-softmax).
Every log-softmax runs in float32 on the logits' device, over chunks of positions (memory bounded
whatever the vocabulary); the sums are float64; no loop runs per token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

#: Positions per chunk: a chunk holds ``2 x KL_CHUNK_TOKENS x vocab x 4`` bytes (its float32
#: log-probabilities, and the upcast of 16-bit logits): 0.5 GiB at a 128k vocabulary; the
#: reference's rest samples add the float64 cumulative distribution (``8 x`` instead of ``4 x``).
KL_CHUNK_TOKENS = 512
#: The seed of the rest's samples (the reference records it).
TAIL_SEED = 0


def windows_sha256(windows: torch.Tensor) -> str:
    """sha256 of (n, seqlen) token windows: their shape and their ids as little-endian int64, so a
    shift by one token, another window count or length, or another tokenizer gives another digest."""
    ids = np.ascontiguousarray(windows.detach().cpu().numpy().astype("<i8"))
    h = hashlib.sha256(f"{ids.shape[0]}x{ids.shape[1]}:".encode())
    h.update(ids.tobytes())
    return h.hexdigest()


def _chunks(T: int, chunk_tokens: int) -> range:
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    return range(0, T - 1, chunk_tokens)


def _log_probs(x: torch.Tensor) -> torch.Tensor:
    """float32 log-softmax over the vocabulary of a chunk of logits (a 16-bit chunk upcast first)."""
    return F.log_softmax(x if x.dtype == torch.float64 else x.float(), dim=-1)


def _rest(lp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log of the probability outside ``ids`` of log-probabilities ``lp`` (positions, V); ``lp`` is
    overwritten (-inf at ``ids``). -inf where ``ids`` cover the vocabulary."""
    return lp.scatter_(-1, ids, float("-inf")).logsumexp(-1)


def _tail_samples(lp: torch.Tensor, ids: torch.Tensor, m: int, gen: torch.Generator) -> torch.Tensor:
    """(positions, m) tokens outside ``ids``, each distributed as the probability of ``lp``
    restricted to them: systematic sampling of the rest's cumulative distribution (float64)."""
    cdf = lp.double().exp_().scatter_(-1, ids, 0.0).cumsum_(-1)  # float64: a rare token keeps its width
    u = torch.arange(m, device=lp.device) + torch.rand(
        lp.shape[0], 1, generator=gen, device=lp.device, dtype=torch.float64
    )
    u /= m
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=lp.shape[-1] - 1)


@dataclass(frozen=True)
class KlRows:
    """The dense reference's rows for (n, seqlen) windows (positions 0..seqlen-2 of each), over a
    vocabulary of ``vocab`` tokens: ``ids`` / ``lps`` (n, seqlen-1, k) int32 / float32 the top-k
    tokens and log-probabilities, largest first; ``rest`` (n, seqlen-1) float32 the log of the
    probability outside them; ``tail_ids`` / ``tail_lps`` (n, seqlen-1, m) the rest's samples."""

    ids: torch.Tensor
    lps: torch.Tensor
    rest: torch.Tensor
    tail_ids: torch.Tensor
    tail_lps: torch.Tensor
    vocab: int

    @property
    def top_k(self) -> int:
        return int(self.ids.shape[-1])

    @property
    def tail_samples(self) -> int:
        return int(self.tail_ids.shape[-1])

    def batch(self, start: int, b: int) -> KlRows:
        """The rows of windows ``start .. start + b - 1``."""
        sl = slice(start, start + b)
        return KlRows(self.ids[sl], self.lps[sl], self.rest[sl], self.tail_ids[sl], self.tail_lps[sl], self.vocab)

    @staticmethod
    def cat(parts: list[KlRows]) -> KlRows:
        def cat(field: str) -> torch.Tensor:
            return torch.cat([getattr(p, field) for p in parts])

        return KlRows(cat("ids"), cat("lps"), cat("rest"), cat("tail_ids"), cat("tail_lps"), parts[0].vocab)


@torch.no_grad()
def reference_rows(
    logits: torch.Tensor,
    top_k: int,
    tail_samples: int,
    gen: torch.Generator | None = None,
    chunk_tokens: int = KL_CHUNK_TOKENS,
) -> KlRows:
    """The reference rows (on the host) of a batch of dense logits (b, T, V): ``k = min(top_k,
    V)`` top tokens, and ``tail_samples`` samples of the rest (none when k covers V), drawn with
    ``gen`` (a generator on the logits' device; None: one seeded with :data:`TAIL_SEED`)."""
    b, T, V = logits.shape
    k = min(top_k, V)
    m = tail_samples if k < V else 0
    if gen is None:
        gen = torch.Generator(logits.device).manual_seed(TAIL_SEED)
    out = KlRows(
        torch.empty((b, T - 1, k), dtype=torch.int32),
        torch.empty((b, T - 1, k), dtype=torch.float32),
        torch.empty((b, T - 1), dtype=torch.float32),
        torch.empty((b, T - 1, m), dtype=torch.int32),
        torch.empty((b, T - 1, m), dtype=torch.float32),
        V,
    )
    for i in range(b):
        for s in _chunks(T, chunk_tokens):
            e = min(s + chunk_tokens, T - 1)
            lp = _log_probs(logits[i, s:e])
            vals, idx = lp.topk(k, dim=-1)
            out.ids[i, s:e], out.lps[i, s:e] = idx.to(torch.int32).cpu(), vals.float().cpu()
            if m:
                tail = _tail_samples(lp, idx, m, gen)
                out.tail_ids[i, s:e], out.tail_lps[i, s:e] = (
                    tail.to(torch.int32).cpu(),
                    lp.gather(-1, tail).float().cpu(),
                )
            out.rest[i, s:e] = _rest(lp, idx).float().cpu()
    return out


@torch.no_grad()
def summed_kl(logits: torch.Tensor, rows: KlRows, chunk_tokens: int = KL_CHUNK_TOKENS) -> torch.Tensor:
    """Summed KL estimate (module docstring; float64 scalar tensor on the logits' device) over
    positions 0..T-2 of a batch: ``q`` the softmax of ``logits`` (b, T, V), ``p`` the reference
    ``rows`` of the same b windows."""
    b, T, _ = logits.shape
    dev = logits.device
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for i in range(b):
        for s in _chunks(T, chunk_tokens):
            e = min(s + chunk_tokens, T - 1)
            lq = _log_probs(logits[i, s:e])
            idx = rows.ids[i, s:e].to(dev, torch.int64)
            lp = rows.lps[i, s:e].to(dev, torch.float64)
            top = (lp.exp() * (lp - lq.gather(-1, idx).double())).sum(-1)
            p_rest = rows.rest[i, s:e].to(dev, torch.float64)
            if rows.tail_samples:
                tail_lp = rows.tail_lps[i, s:e].to(dev, torch.float64)
                tail_lq = lq.gather(-1, rows.tail_ids[i, s:e].to(dev, torch.int64)).double()
                inside = (tail_lp - tail_lq).mean(-1)
            else:  # the rest as one bucket
                inside = p_rest - _rest(lq, idx).double()
            total += (top + torch.where(p_rest > float("-inf"), p_rest.exp() * inside, 0.0)).sum()
    return total


@torch.no_grad()
def exact_summed_kl(
    p_logits: torch.Tensor, q_logits: torch.Tensor, chunk_tokens: int = KL_CHUNK_TOKENS
) -> torch.Tensor:
    """Summed full-vocabulary KL(p || q) (float64 scalar) over positions 0..T-2 of two batches of
    logits (b, T, V): the quantity :func:`summed_kl` estimates (benchmarks, tests)."""
    b, T, _ = p_logits.shape
    total = torch.zeros((), dtype=torch.float64, device=p_logits.device)
    for i in range(b):
        for s in _chunks(T, chunk_tokens):
            e = min(s + chunk_tokens, T - 1)
            lp, lq = _log_probs(p_logits[i, s:e]).double(), _log_probs(q_logits[i, s:e]).double()
            total += (lp.exp() * (lp - lq.to(lp.device))).sum()
    return total


class KlMeter:
    """The mean KL of a perplexity pass to the dense reference ``rows``: called with each batch's
    first window index, its token ids (b, T) and its logits (b, T, V), in any order (the
    ``on_logits`` of ``evaluate.ppl.window_nll``)."""

    def __init__(self, rows: KlRows, chunk_tokens: int = KL_CHUNK_TOKENS) -> None:
        self.rows = rows
        self.chunk_tokens = chunk_tokens
        self.total = 0.0
        self.count = 0

    def __call__(self, start: int, ids: torch.Tensor, logits: torch.Tensor) -> None:
        b, T, V = logits.shape
        n, t1, _ = self.rows.ids.shape
        if V != self.rows.vocab:
            raise ValueError(f"the logits have {V} entries, the KL reference's vocabulary {self.rows.vocab}")
        if T - 1 != t1 or start + b > n:
            raise ValueError(
                f"windows {start}..{start + b - 1} of {T} tokens are not in the KL reference ({n} x {t1 + 1})"
            )
        kl = float(summed_kl(logits, self.rows.batch(start, b), self.chunk_tokens))
        if not np.isfinite(kl):
            raise FloatingPointError(f"non-finite KL in the batch starting at window {start}")
        self.total += kl
        self.count += b * (T - 1)

    def mean(self) -> float:
        """The mean over every position of the reference, each scored once (nats per token)."""
        n, t1, _ = self.rows.ids.shape
        if self.count != n * t1:
            raise ValueError(f"{self.count} positions were scored against the KL reference's {n * t1}")
        return self.total / self.count


class RowsBuilder:
    """Collects :class:`KlRows` over a perplexity pass of the dense model (``on_logits``, as
    :class:`KlMeter`) of ``n`` windows, the rest's samples drawn from one seeded generator."""

    def __init__(self, n: int, top_k: int, tail_samples: int, chunk_tokens: int = KL_CHUNK_TOKENS) -> None:
        self.n, self.top_k, self.tail_samples, self.chunk_tokens = n, top_k, tail_samples, chunk_tokens
        self.parts: dict[int, KlRows] = {}
        self.gen: torch.Generator | None = None

    def __call__(self, start: int, ids: torch.Tensor, logits: torch.Tensor) -> None:
        if self.gen is None:
            self.gen = torch.Generator(logits.device).manual_seed(TAIL_SEED)
        self.parts[start] = reference_rows(logits, self.top_k, self.tail_samples, self.gen, self.chunk_tokens)

    def rows(self) -> KlRows:
        parts = [self.parts[s] for s in sorted(self.parts)]
        if sum(p.ids.shape[0] for p in parts) != self.n:
            raise ValueError(f"the dense pass did not score all {self.n} windows")
        return KlRows.cat(parts)


def kl_record(kl: float, rows: KlRows, reference: dict[str, Any]) -> dict[str, Any]:
    """The keys a ppl.json gains: ``kl`` (the mean over the reference's positions, nats per token)
    and ``kl_reference`` (``reference``: the file read; its top-k, rest samples and vocabulary,
    ``exact`` when the top-k covers the vocabulary)."""
    ref = dict(reference, top_k=rows.top_k, tail_samples=rows.tail_samples, vocab=rows.vocab,
               exact=rows.top_k >= rows.vocab)  # fmt: skip
    return {"kl": kl, "kl_reference": ref}
