"""The calibration Gram by block rows against the dense x^T x GEMM, per block size, same run.

    python benchmarks/gram_blocks.py [--dims 576,1536,4096,8192] [--tokens 2048]
        [--blocks 128,256,384,512,768,1024,2048] [--dtype float32] [--device cpu] [--repeat 3]

For every width d it times one batch's Gram formed as ``coec.calibrate.layer_pass.gram_upper_add_`` does
it (one GEMM per block row, upper block triangle only; plus the in-place mirror a layer's read
costs, amortised over ``--batches`` batches) and as one dense GEMM, and prints the time ratio
per block size, the FLOP fraction ``(B + 1) / 2B`` it should approach, and the block size
``GRAM_BLOCK`` picks on this device.
"""

from __future__ import annotations

import argparse
import time

import torch
from timing import device_sync

from coec.calibrate.layer_pass import gram_block, gram_block_edges, gram_upper_add_, symmetrize_upper_
from coec.model.load import resolve_device, torch_dtype


def dense_gram_add_(G: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The baseline the block rows replace: ``G += x^T x`` as one dense GEMM, float32 (float64 for
    float64 x; a 16-bit GEMM with a float32 output for 16-bit x on CUDA), added to G in place."""
    if x.dtype in (torch.bfloat16, torch.float16) and x.device.type == "cuda":
        return G.add_(torch.mm(x.mT, x, out_dtype=torch.float32))
    w = x if x.dtype == torch.float64 else x.float()
    return G.add_(w.mT @ w)


def timed(fn, repeat: int, dev) -> float:
    fn()
    device_sync(dev)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        device_sync(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def device_args(ap: argparse.ArgumentParser, repeat: int):
    """The options every micro-benchmark here shares: --dtype, --device, --repeat."""
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=repeat)
    return ap


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="576,1536,4096,8192")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--blocks", default="128,256,384,512,768,1024,2048")
    ap.add_argument("--batches", type=int, default=8, help="batches per mirror (a layer's reads)")
    a = device_args(ap, repeat=3).parse_args()
    dev = resolve_device(a.device)
    dt = torch_dtype(a.dtype)
    blocks = [int(b) for b in a.blocks.split(",")]
    print(
        f"device {dev} dtype {a.dtype} tokens per batch {a.tokens} threads {torch.get_num_threads()} "
        f"(GRAM_BLOCK here: {gram_block(dev)})"
    )
    print("| d | dense GEMM s | " + " | ".join(f"block {b}" for b in blocks) + " |")
    print("|---:|---:|" + "---:|" * len(blocks))
    for d in (int(x) for x in a.dims.split(",")):
        x = torch.randn(a.tokens, d, device=dev).to(dt)
        G = torch.zeros(d, d, dtype=torch.float64, device=dev)

        t_dense = timed(lambda: dense_gram_add_(G, x), a.repeat, dev)
        cells = []
        for b in blocks:
            edges = gram_block_edges(d, b)
            n = len(edges) - 1
            t_blk = timed(lambda: gram_upper_add_(G, x, edges), a.repeat, dev)
            t_sym = timed(lambda: symmetrize_upper_(G, edges), a.repeat, dev)
            t = t_blk + t_sym / a.batches
            cells.append(f"{t / t_dense:.2f} (B={n}, FLOPs {(n + 1) / (2 * n):.2f})")
        print(f"| {d} | {t_dense:.4f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
