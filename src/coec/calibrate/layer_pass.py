"""One layer-by-layer pass over the dense model accumulating second moments.

For every decoder layer and for the inputs of ``o_proj`` and ``down_proj`` it accumulates

    G = Σ_t x_t x_tᵀ  (d_in × d_in),   sum = Σ_t x_t  (d_in),   n = number of tokens,

without ever holding all tokens: each batch's Gram is formed with float32 accumulation (float64
for float64 models; 16-bit GEMMs with a float32 output for 16-bit models on CUDA) and added to
a float64 total. G is symmetric, so only its upper block triangle is formed per batch (one GEMM
per block row, about half the FLOPs of x^T x) and mirrored once when read. Layers are processed
one at a time with the hidden states of all calibration sequences cached between layers, so only
one layer (and one layer's Grams) is on the device at once.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch

from coec.io import artifacts, atomic
from coec.io.artifacts import all_finite
from coec.io.progress import bar as progress_bar
from coec.model.arch import MODULES, adapter_for
from coec.model.load import decoder_layers, torch_dtype

log = logging.getLogger(__name__)


class NonFiniteActivations(FloatingPointError):
    """NaN or Inf in the calibration activations of a named layer/module."""


#: Columns per block row of a symmetric Gram product, per device type (``gram_block_edges``).
#: CPU: 256 measured fastest (0.60-0.78x the time of the full GEMM for d = 576-8192 on 2 cores,
#: benchmarks/results/gram_blocks_cpu.txt); CUDA: 1024, so each block GEMM stays large enough
#: for the tensor cores (54-62 % of the full GEMM's FLOPs at d = 4096-14336).
GRAM_BLOCK = {"cpu": 256, "cuda": 1024}


def gram_block(device: torch.device | str) -> int:
    """``GRAM_BLOCK`` of a device's type (the CUDA value for other accelerators)."""
    return GRAM_BLOCK.get(torch.device(device).type, GRAM_BLOCK["cuda"])


def gram_block_edges(d: int, block: int) -> list[int]:
    """Edges ``0 = e_0 < ... < e_B = d`` of ``B = ceil(d / block)`` near-equal column blocks."""
    n = max(1, math.ceil(d / max(1, block)))
    return [round(i * d / n) for i in range(n + 1)]


def gram_upper_add_(G: torch.Tensor, x: torch.Tensor, edges: list[int]) -> torch.Tensor:
    """Add the upper block triangle of ``x^T x`` to G (d, d) in place: for every block row i,
    ``G[e_i:e_(i+1), e_i:] += x[:, e_i:e_(i+1)]^T x[:, e_i:]`` (one GEMM per block row). x (t, d).

    Each block product is float32 (float64 for float64 x). 16-bit activations on CUDA use a 16-bit
    tensor-core GEMM with a float32 output (``torch.mm(..., out_dtype=torch.float32)``): products
    of 16-bit numbers are exact in float32 and the accumulation is float32, so it equals the
    float32-upcast GEMM up to summation order, at the 16-bit GEMM rate and without a float32 copy
    of the batch. Elsewhere (CPU, which has no such kernel, or 32/64-bit activations) the batch is
    upcast once and multiplied. The strictly lower blocks are neither computed nor touched: about
    (B + 1) / 2B of the full GEMM's 2 t d^2 FLOPs; ``symmetrize_upper_`` fills them. Returns G.
    """
    tensor_core = x.dtype in (torch.bfloat16, torch.float16) and x.device.type == "cuda"
    if not tensor_core:
        x = x.to(_accumulation_dtype(x))
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        a, b = x[:, lo:hi], x[:, lo:]
        G[lo:hi, lo:].add_(torch.mm(a.mT, b, out_dtype=torch.float32) if tensor_core else a.mT @ b)
    return G


def symmetrize_upper_(G: torch.Tensor, edges: list[int]) -> torch.Tensor:
    """Make G symmetric in place from its upper triangle (the part ``gram_upper_add_`` forms):
    each strictly lower block is the transpose of its mirror block, and each diagonal block's
    lower triangle the transpose of its upper one. Temporaries are block-sized. Returns G."""
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        D = G[lo:hi, lo:hi]
        D.copy_(torch.triu(D) + torch.triu(D, 1).mT)
        for lo2, hi2 in zip(edges[i + 1 : -1], edges[i + 2 :], strict=True):
            G[lo2:hi2, lo:hi] = G[lo:hi, lo2:hi2].mT
    return G


def _accumulation_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for float64 activations, float32 otherwise."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class GramAccumulator:
    """Running Σ x xᵀ, Σ x and token count for one module input (hook target).

    Each batch adds only the upper block triangle of its Gram (``gram_upper_add_``: about half
    the FLOPs of the full product); ``gram`` is the full symmetric total, mirrored in place when
    read after an update.
    """

    def __init__(
        self, dim: int, device: torch.device, total_dtype: Any = torch.float64, block: int | None = None
    ) -> None:
        self.edges = gram_block_edges(dim, block or gram_block(device))
        self._gram = torch.zeros(dim, dim, dtype=total_dtype, device=device)
        self._mirrored = True
        self.sum = torch.zeros(dim, dtype=total_dtype, device=device)
        self.abssum = torch.zeros(dim, dtype=total_dtype, device=device)  # Σ|x| (E|x| scores)
        self.count = 0

    @property
    def gram(self) -> torch.Tensor:
        """Σ x xᵀ (d, d), symmetric."""
        if not self._mirrored:
            symmetrize_upper_(self._gram, self.edges)
            self._mirrored = True
        return self._gram

    @property
    def sumsq(self) -> torch.Tensor:
        """Σ x² per channel (d,): the Gram's diagonal, in the total's dtype (float64). The
        diagonal blocks are formed whole by every update, so no mirroring is needed to read it."""
        return self._gram.diagonal()

    def update(self, x: torch.Tensor) -> None:
        """Add a batch of inputs ``x`` (..., d) to the statistics."""
        x = x.reshape(-1, x.shape[-1])
        gram_upper_add_(self._gram, x, self.edges)  # in place, promoted to the total's dtype
        self._mirrored = False
        self.sum.add_(x.sum(0, dtype=_accumulation_dtype(x)))
        self.abssum.add_(x.abs().sum(0, dtype=_accumulation_dtype(x)))
        self.count += x.shape[0]


def layer_masks(model: Any, hidden: torch.Tensor, position_ids: torch.Tensor) -> list[Any]:
    """Per-layer attention masks for full-length causal sequences without padding, built the
    way the model's own forward builds them (full or sliding-window per ``layer_types``; every
    layer sliding for families that always slide, e.g. Mistral, when a window is set)."""
    from transformers.masking_utils import (  # deferred: transformers (+1-4 s), only a pass over a model needs it
        create_causal_mask,
        create_sliding_window_causal_mask,
    )

    cfg = model.config
    # built for one sequence, so that a materialised (1, 1, T, T) mask broadcasts over any batch
    kw = dict(config=cfg, inputs_embeds=hidden[:1], attention_mask=None, position_ids=position_ids)
    # the cache argument was renamed (past_key_values -> cache) in transformers 5.2x
    params = inspect.signature(create_causal_mask).parameters
    kw["cache" if "cache" in params else "past_key_values"] = None
    if "cache_position" in params:
        kw["cache_position"] = torch.arange(hidden.shape[1], device=hidden.device)
    full = create_causal_mask(**kw)
    types = getattr(cfg, "layer_types", None)
    if not types:  # Mistral: one sliding window in every layer whenever the config sets one
        slide = adapter_for(cfg).always_sliding and getattr(cfg, "sliding_window", None) is not None
        types = ["sliding_attention" if slide else "full_attention"] * cfg.num_hidden_layers
    sliding = create_sliding_window_causal_mask(**kw) if "sliding_attention" in types else None
    return [sliding if t == "sliding_attention" else full for t in types]


def layer_call(layer: Any, hidden: Any, mask: Any, position_ids: Any, position_embeddings: Any) -> torch.Tensor:
    """One decoder layer on a batch of hidden states (B, T, d) -> (B, T, d)."""
    out = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
    h: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return h


@torch.no_grad()
def embed_batches(
    model: Any, input_ids: torch.Tensor, batch_size: int, device: torch.device, store_device: torch.device
) -> list[torch.Tensor]:
    """Token embeddings of the calibration sequences, in batches kept on ``store_device``."""
    adapter = adapter_for(model.config)
    emb = adapter.embedding(model)
    scale = adapter.embed_scale(model.config)  # a factor the model's forward applies, or None
    emb_dev = cast(torch.Tensor, emb.weight).device
    emb.to(device)
    hidden = []
    for i in range(0, input_ids.shape[0], batch_size):
        h = emb(input_ids[i : i + batch_size].to(device))
        hidden.append((h if scale is None else h * scale).to(store_device))
    emb.to(emb_dev)
    return hidden


class LayerPass:
    """The calibration sequences walked through the decoder one layer at a time.

    Holds the hidden states of all sequences between layers (batches (B, T, d) cached on the
    device that held the model: CPU offload for large models), the position ids, the rotary
    embeddings and every layer's attention mask, all set up once from the token embeddings.
    ``run(i, layer)`` calls decoder layer ``i`` (on ``device``) on every batch. Used as a context
    manager: the rotary module returns to its device on exit.
    """

    def __init__(self, model: Any, input_ids: torch.Tensor, batch_size: int, device: Any = None) -> None:
        self.store = next(model.parameters()).device
        self.device = torch.device(device) if device is not None else self.store
        self.hidden = embed_batches(model, input_ids, batch_size, self.device, self.store)
        self.pos = torch.arange(input_ids.shape[1], device=self.device).unsqueeze(0)
        self.rotary = adapter_for(model.config).rotary(model)
        self.rotary_home = next(self.rotary.buffers()).device
        self.rotary.to(self.device)
        self.pe = self.rotary(self.hidden[0].to(self.device), self.pos)
        self.masks = layer_masks(model, self.hidden[0].to(self.device), self.pos)

    def __enter__(self) -> LayerPass:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.rotary.to(self.rotary_home)

    @torch.no_grad()
    def run(self, i: int, layer: Any, keep_outputs: bool = True) -> None:
        """Every batch through ``layer`` (layer ``i``, already on ``device``); its outputs become
        the inputs of layer i+1 unless ``keep_outputs`` is False (a statistics-only forward)."""
        for b, h in enumerate(self.hidden):
            out = layer_call(layer, h.to(self.device), self.masks[i], self.pos, self.pe)
            if keep_outputs:
                self.hidden[b] = out.to(self.store)


@torch.no_grad()
def layer_statistics(lp: Any, i: int, layer: Any, modules: tuple[str, ...] = MODULES) -> dict[str, GramAccumulator]:
    """:class:`GramAccumulator` statistics of the named module inputs of decoder layer ``i``
    (on ``lp.device``) over every batch of a layer pass ``lp`` (``lp.run(i, layer)``, whose
    outputs become the next layer's inputs); NaN/Inf raises :class:`NonFiniteActivations`."""
    adapter = adapter_for(layer)
    stats, handles = {}, []
    for name in modules:
        mod = adapter.output_module(layer, name)
        acc = stats[name] = GramAccumulator(mod.in_features, lp.device)
        handles.append(mod.register_forward_pre_hook(lambda _m, args, acc=acc: acc.update(args[0])))
    try:
        lp.run(i, layer)
    finally:
        for hd in handles:
            hd.remove()
    for name, acc in stats.items():
        if not (all_finite(acc.gram) and torch.isfinite(acc.sum).all()):  # row blocks: no Gram-sized temporaries
            raise NonFiniteActivations(
                f"NaN/Inf in calibration activations of layer {i} {name} input (check the model dtype and the data)"
            )
    return stats


@dataclass(frozen=True)
class LayerRun:
    """How :func:`run_layerwise` runs: ``batch_size`` sequences at a time on ``device`` (None: the
    model's), with a progress bar or not, gathering the inputs of ``modules``; ``before_layer(i,
    layer)`` may modify a layer in place before its statistics are taken (iterative calibration
    prunes here)."""

    batch_size: int = 8
    device: Any = None
    progress: bool = True
    modules: tuple[str, ...] = MODULES
    before_layer: Callable[[int, torch.nn.Module], None] | None = None


@torch.no_grad()
def run_layerwise(
    model: Any,
    input_ids: torch.Tensor,
    on_layer: Callable[[int, dict[str, GramAccumulator]], None] | None = None,
    run: LayerRun = LayerRun(),
) -> None:
    """Run the calibration sequences through the decoder layer by layer (:class:`LayerPass`),
    accumulating :class:`GramAccumulator` statistics of the named module inputs;
    ``on_layer(i, stats)`` is called after layer ``i`` (e.g. to write its file).

    input_ids: (n_seq, seqlen). Hidden states of all sequences are cached between layers on
    the device that held the model (CPU offload for large models).
    """
    adapter = adapter_for(model.config)
    layers = adapter.decoder_layers(model)
    with LayerPass(model, input_ids, run.batch_size, run.device) as lp:
        bar = progress_bar(range(len(layers)), desc="calibrate", unit="layer", disable=not run.progress)
        for i in bar:
            layer = layers[i]
            home = next(layer.parameters()).device
            layer.to(lp.device)
            if run.before_layer is not None:
                run.before_layer(i, layer)
            stats = layer_statistics(lp, i, layer, run.modules)
            layer.to(home)
            if on_layer is not None:
                on_layer(i, stats)


def channel_sumsq(stats: Any) -> torch.Tensor:
    """Σ x² per channel of a statistics object or dict: its ``sumsq``, else the Gram's diagonal
    (a 1-D ``gram`` is the diagonal itself)."""
    get: Callable[[str], Any] = stats.get if isinstance(stats, dict) else (lambda k: getattr(stats, k, None))
    sq: torch.Tensor | None = get("sumsq")
    if sq is None:
        g: torch.Tensor = get("gram")
        sq = g if g.dim() == 1 else g.diagonal()
    return sq


def gram_tensors(stats: dict[str, Any], dtype: Any = torch.float32) -> dict[str, torch.Tensor]:
    """Flatten layer statistics into safetensors entries ``<module>.gram|sum|sumsq|abssum|count``.

    ``stats``: module -> a :class:`GramAccumulator`, or a dict with the same keys (``gram``,
    ``sum``, ``count``, optional ``sumsq`` and ``abssum``). The Gram is stored in ``dtype``; Σx
    and Σx² (the Gram's diagonal) in float64, because the channel variance
    ``(Σx² - n m²) / (n - 1)`` cancels when m² >> Var: from a float32 Σx² its relative error is
    ~6e-8 · (1 + m²/Var)."""
    out = {}
    for name, acc in stats.items():
        if isinstance(acc, dict):
            acc = SimpleNamespace(**acc)
        out[f"{name}.gram"] = acc.gram.to(dtype).cpu().contiguous()
        out[f"{name}.sum"] = acc.sum.to(torch.float64).cpu().contiguous()
        out[f"{name}.sumsq"] = channel_sumsq(acc).to(torch.float64).cpu().contiguous()
        if getattr(acc, "abssum", None) is not None:  # Σ|x| per channel (optional key)
            out[f"{name}.abssum"] = acc.abssum.to(torch.float64).cpu().contiguous()
        out[f"{name}.count"] = torch.tensor([acc.count], dtype=torch.int64)
    return out


def write_gram_dir(
    out_dir: str | Path, gram_dtype: str, fill: Callable[[Callable[[int, dict[str, Any]], None]], dict[str, Any]]
) -> dict[str, Any]:
    """A Gram folder, atomically (``atomic.atomic_dir``): ``fill(write)`` produces the
    statistics, calling ``write(i, stats)`` once per layer (``layer{i}.safetensors``,
    :func:`gram_tensors` with the Gram in ``gram_dtype``), and returns ``meta.json``'s dict."""
    dt = torch_dtype(gram_dtype)
    with atomic.atomic_dir(out_dir) as tmp:
        meta = fill(lambda i, stats: artifacts.write_gram_layer(artifacts.gram_path(tmp, i), gram_tensors(stats, dt)))
        artifacts.write_json(tmp / "meta.json", meta, "gram-meta")
    return meta


def gram_meta(
    n_layers: int, input_ids: torch.Tensor, gram_dtype: str, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``meta.json`` of a calibration pass over ``input_ids`` (n_seq, seqlen), then ``meta``."""
    return {
        "n_layers": n_layers,
        "n_sequences": int(input_ids.shape[0]),
        "seqlen": int(input_ids.shape[1]),
        "tokens": int(input_ids.numel()),
        "gram_dtype": gram_dtype,
        **(meta or {}),
    }


@dataclass(frozen=True)
class PassOptions:
    """How a calibration pass runs: ``batch_size`` sequences at a time, Grams stored in
    ``gram_dtype``; a streamed pass (``streaming.calibrate``) also keeps at most ``budget_bytes`` of
    hidden states in memory (the rest in files) and checkpoints after the first layer that ends
    ``checkpoint_seconds`` after the last checkpoint."""

    batch_size: int = 8
    gram_dtype: str = "float32"
    budget_bytes: float = float("inf")
    checkpoint_seconds: float = 600.0
    progress: bool = True


#: The defaults of :class:`PassOptions` (a module-level instance: argument defaults call nothing).
PASS_DEFAULTS = PassOptions()


def calibrate_to_dir(
    model: Any,
    input_ids: torch.Tensor,
    out_dir: str | Path,
    options: PassOptions = PASS_DEFAULTS,
    meta: dict[str, Any] | None = None,
    device: Any = None,
) -> dict[str, Any]:
    """Write ``layer{i}.safetensors`` (Grams, sums, counts of o_proj and down_proj inputs) for
    every layer plus ``meta.json`` into ``out_dir`` (:func:`write_gram_dir`), the hidden states
    cached on ``device`` (``options``: batch size and Gram dtype). The returned info also holds
    ``seconds``, which is logged, not written."""
    t0 = time.time()
    gram_dtype = options.gram_dtype

    def fill(write: Any) -> Any:
        run_layerwise(
            model,
            input_ids,
            on_layer=write,
            run=LayerRun(batch_size=options.batch_size, device=device, progress=options.progress),
        )
        return gram_meta(len(decoder_layers(model)), input_ids, gram_dtype, meta)

    info = write_gram_dir(out_dir, gram_dtype, fill)
    info["seconds"] = round(time.time() - t0, 3)
    log.info("calibrated %d layers on %d tokens in %.1fs", info["n_layers"], info["tokens"], info["seconds"])
    return info
