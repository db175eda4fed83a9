"""Write a random model of a published architecture, shard by shard, never whole in memory.

    python benchmarks/write_random_model.py --arch Llama-3.1-8B --dtype float32 \
        --out /work/bigmodel --tokenizer resources/models/smollm2-135m [--layers 32] [--shard-gb 2]

The tensor names and shapes come from the family's own class built on the meta device
(``coec.model.arch.published.PUBLISHED_ARCHS`` numbers); each shard's tensors are drawn (normal, std
0.02; norms 1) from a seeded generator, written with ``safetensors`` and freed before the next
shard, with ``model.safetensors.index.json`` last. The tokenizer is copied from a model folder
whose vocabulary fits (token ids below the architecture's ``vocab_size``). Prints the size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch


def shapes_of(arch: dict, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every stored tensor of the architecture's causal LM, in module order."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return [(n, tuple(t.shape)) for n, t in model.state_dict().items()], cfg


def write_model(arch: dict, out: Path, dtype: torch.dtype, shard_bytes: int, seed: int = 0) -> int:
    """Write the shards, the index and config.json into ``out``; returns the bytes written."""
    from safetensors.torch import save_file

    tensors, cfg = shapes_of(arch, dtype)
    out.mkdir(parents=True, exist_ok=True)
    cfg.dtype = dtype
    cfg.save_pretrained(out)
    size = torch.empty((), dtype=dtype).element_size()
    groups, cur, used = [], [], 0
    for name, shape in tensors:
        n = size * int(torch.tensor(shape).prod())
        if cur and used + n > shard_bytes:
            groups.append(cur)
            cur, used = [], 0
        cur.append((name, shape))
        used += n
    groups.append(cur)
    gen = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {}
        for name, shape in group:
            if name.endswith("norm.weight"):
                shard[name] = torch.ones(shape, dtype=dtype)
            else:
                shard[name] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
            weight_map[name] = fname
            total += shard[name].numel() * size
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        del shard
        print(f"  {fname}: {len(group)} tensors", flush=True)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return total


def main() -> None:
    from coec.model.arch.published import PUBLISHED_ARCHS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="Llama-3.1-8B", choices=sorted(PUBLISHED_ARCHS))
    p.add_argument("--layers", type=int, default=None, help="default: the architecture's")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", required=True, help="a model folder whose tokenizer files are copied")
    p.add_argument("--shard-gb", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    arch = dict(PUBLISHED_ARCHS[a.arch])
    if a.layers:
        arch["num_hidden_layers"] = a.layers
    arch["max_position_embeddings"] = 8192
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty")
    t0 = time.time()
    total = write_model(arch, out, getattr(torch, a.dtype), int(a.shard_gb * 2**30), a.seed)
    for f in Path(a.tokenizer).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")) or f.suffix == ".model":
            shutil.copy(f, out / f.name)
    print(
        f"{a.arch} ({arch['num_hidden_layers']} layers, {a.dtype}): {total / 2**30:.2f} GiB "
        f"({total / 1e9:.2f} GB) in {time.time() - t0:.0f} s -> {out}"
    )


if __name__ == "__main__":
    main()
