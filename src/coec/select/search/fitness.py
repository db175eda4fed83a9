"""The fitness of a width search (docs/search.md): the mean per-token KL(p_dense || p_candidate)
of the next-token distributions on the first n held-out tokens, lower is better.

A candidate allocation is the dense-shaped model with each layer's o_proj / down_proj replaced by
its candidate's refit scattered into the kept columns (zeros elsewhere): the pruned heads' and
channels' q/k/v and gate/up rows still run but reach nothing, so the function is the pruned
model's without any surgery; switching a unit's level rewrites one weight. The dense reference
(the log-probabilities of the same model with every unit at its full level, the dense layers)
is computed once per window and token count, with the same shapes as every candidate's pass, so
the dense allocation's fitness is exactly 0 and every evaluation is reproducible.

Windows run one at a time (a batch of one: the shapes of a window's pass never change); n tokens
are the first n // seqlen windows and the first n % seqlen tokens of the next one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
from torch import nn

from coec.model.arch import AttnShape, adapter_for, o_proj_columns
from coec.select.search.candidates import MODULE_OF, LayerCandidateFile

log = logging.getLogger(__name__)

#: rows of the vocabulary-wide log-softmax formed at once
KL_CHUNK = 1024
#: evaluations between two progress lines of the log
LOG_EVERY = 25


def token_kl(ref_logp: torch.Tensor, logits: torch.Tensor, chunk: int = KL_CHUNK) -> torch.Tensor:
    """KL(p || q) of each row, (n,) float64: ``ref_logp`` (n, V) the reference log-probabilities
    (log p), ``logits`` (n, V) the candidate's (q = softmax); log_softmax in float32 (float64 when
    either is), ``chunk`` rows at a time, each row's sum in float64."""
    if ref_logp.shape != logits.shape:
        raise ValueError(f"reference {tuple(ref_logp.shape)} and logits {tuple(logits.shape)} differ in shape")
    dtype = torch.float64 if torch.float64 in (ref_logp.dtype, logits.dtype) else torch.float32
    out = []
    for s in range(0, logits.shape[0], chunk):
        lp = ref_logp[s : s + chunk].to(dtype)
        lq = torch.log_softmax(logits[s : s + chunk].to(dtype), dim=-1)
        out.append((lp.exp() * (lp - lq)).sum(-1, dtype=torch.float64))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def mean_kl(ref_logp: torch.Tensor, logits: torch.Tensor, chunk: int = KL_CHUNK) -> float:
    """The mean of :func:`token_kl` over the rows."""
    return float(token_kl(ref_logp, logits, chunk).mean())


def log_probs(logits: torch.Tensor, chunk: int = KL_CHUNK) -> torch.Tensor:
    """log_softmax of each row in float32, ``chunk`` rows at a time (a reference to keep)."""
    return torch.cat([torch.log_softmax(logits[s : s + chunk].float(), dim=-1) for s in range(0, len(logits), chunk)])


class CandidateModel:
    """The dense model whose o_proj / down_proj take the candidates' refits per unit level
    (module docstring). ``levels``: kept counts per unit, layer by layer, KV groups then
    channels (``SearchSpace.values``)."""

    def __init__(self, model: nn.Module, geom: AttnShape, candidates: Sequence[LayerCandidateFile]):
        self.model, self.geom, self.candidates = model, geom, list(candidates)
        adapter = adapter_for(model.config)
        layers = adapter.decoder_layers(model)
        if len(layers) != len(self.candidates):
            raise ValueError(f"{len(self.candidates)} candidate files for a model of {len(layers)} layers")
        self.linears: list[dict[str, nn.Linear]] = []
        self.base_bias: list[dict[str, torch.Tensor]] = []
        for layer in layers:
            lin, bias = {}, {}
            for module in MODULE_OF.values():
                parent, attr = adapter.output_parent(layer, module)
                old: nn.Linear = getattr(parent, attr)
                new = nn.Linear(old.in_features, old.out_features, bias=True, device=old.weight.device,
                                dtype=old.weight.dtype)  # fmt: skip
                new.weight.data.copy_(old.weight.data)
                base = old.bias.data.clone() if old.bias is not None else torch.zeros_like(new.bias.data)
                new.bias.data.copy_(base)
                setattr(parent, attr, new)
                lin[module], bias[module] = new, base
            self.linears.append(lin)
            self.base_bias.append(bias)
        self.current: dict[tuple[int, str], int] = {}
        self.dense = tuple(c.levels[kind][-1] for c in self.candidates for kind in MODULE_OF)

    def columns(self, kind: str, kept: list[int]) -> torch.Tensor:
        """The input columns of the unit's module that ``kept`` units hold."""
        return o_proj_columns(kept, self.geom) if kind == "kv_groups" else torch.tensor(kept, dtype=torch.long)

    @torch.no_grad()
    def set_unit(self, layer: int, kind: str, level: int) -> None:
        """Install the candidate of ``kind`` at ``level`` in ``layer`` (nothing when it is there)."""
        if self.current.get((layer, kind)) == level:
            return
        cand = self.candidates[layer]
        if level not in cand.kept[kind]:
            raise ValueError(f"layer {layer} {kind}: no candidate at level {level} (levels {cand.levels[kind]})")
        module = MODULE_OF[kind]
        lin, base = self.linears[layer][module], self.base_bias[layer][module]
        weight, bias = cand.tensors(kind, level)
        cols = self.columns(kind, cand.kept[kind][level]).to(lin.weight.device)
        lin.weight.data.zero_()
        lin.weight.data.index_copy_(1, cols, weight.to(lin.weight))
        lin.bias.data.copy_(base if bias is None else base + bias.to(base))
        self.current[(layer, kind)] = level

    def set_levels(self, levels: Sequence[int]) -> None:
        """Install an allocation (kept counts per unit, ``SearchSpace.values`` order)."""
        kinds = list(MODULE_OF)
        if len(levels) != len(kinds) * len(self.candidates):
            raise ValueError(f"expected {len(kinds) * len(self.candidates)} levels, got {len(levels)}")
        for u, level in enumerate(levels):
            self.set_unit(u // len(kinds), kinds[u % len(kinds)], int(level))

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(n, V) logits of one token sequence (n,)."""
        device = next(self.model.parameters()).device
        out: torch.Tensor = self.model(ids[None].to(device)).logits[0]
        return out


class KLFitness:
    """``fitness(levels, n_tokens)`` of ``coec.select.search.evolve.evolve``: the mean token KL of the
    allocation ``levels`` to the dense allocation on the first ``n_tokens`` of ``windows``
    (module docstring); the references are formed when a token count is first asked for."""

    def __init__(self, model: CandidateModel, windows: torch.Tensor):
        self.model, self.windows = model, windows
        self.refs: dict[tuple[int, int], torch.Tensor] = {}
        self.evaluations = 0  # candidates evaluated, and their tokens (the log's)
        self.tokens = 0
        self.started = time.time()

    def pieces(self, n_tokens: int) -> list[tuple[int, int]]:
        """(window, length) of the first ``n_tokens`` tokens."""
        n, seqlen = self.windows.shape
        if not 0 < n_tokens <= n * seqlen:
            raise ValueError(f"{n_tokens} fitness tokens asked of {n} windows of {seqlen}")
        full, rest = divmod(n_tokens, seqlen)
        return [(w, seqlen) for w in range(full)] + ([(full, rest)] if rest else [])

    def references(self, n_tokens: int) -> None:
        """The dense log-probabilities of every piece of ``n_tokens`` not formed yet."""
        todo = [p for p in self.pieces(n_tokens) if p not in self.refs]
        if not todo:
            return
        t0 = time.time()
        self.model.set_levels(self.model.dense)
        for w, length in todo:
            self.refs[(w, length)] = log_probs(self.model.logits(self.windows[w, :length]))
        log.info("dense references of %d pieces (%d tokens) in %.1fs", len(todo), sum(n for _, n in todo),
                 time.time() - t0)  # fmt: skip

    def __call__(self, levels: Sequence[int], n_tokens: int) -> float:
        self.references(n_tokens)
        self.model.set_levels(levels)
        total = 0.0
        for w, length in self.pieces(n_tokens):
            logits = self.model.logits(self.windows[w, :length])
            total += float(token_kl(self.refs[(w, length)].to(logits.device), logits).sum())
        self.evaluations += 1
        self.tokens += n_tokens
        if self.evaluations % LOG_EVERY == 0:
            seconds = time.time() - self.started
            log.info("%d evaluations, %d tokens in %.0fs (%.0f tokens/s)", self.evaluations, self.tokens, seconds,
                     self.tokens / max(seconds, 1e-9))  # fmt: skip
        return total / n_tokens
