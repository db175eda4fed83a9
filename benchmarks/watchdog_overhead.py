"""What the solver watchdog costs per call: the same SVD / eigh with and without it, same run.

    python benchmarks/watchdog_overhead.py [--device cpu] [--sizes 64,256,1024] [--repeat 20]

The watchdog (``coec.compensate.watchdog``, paper App. B) runs each device solver call in a
thread (and, on CUDA, on a side stream that is synchronised before the result is returned). This
prints, per size, the best time of ``linalg.svd`` and ``linalg.eigh`` as the compensation calls
them with the watchdog off and on, and the ratio. On CUDA the watchdog is on by default; on the
CPU it is off unless ``COEC_SOLVER_TIMEOUT`` is set.
"""

from __future__ import annotations

import argparse

import torch
from gram_blocks import device_args, timed

from coec.compensate import linalg
from coec.compensate.watchdog import solver_timeout
from coec.model.load import resolve_device, torch_dtype


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,256,1024")
    a = device_args(ap, repeat=20).parse_args()
    dev = resolve_device(a.device)
    dt = torch_dtype(a.dtype)
    print(f"device {dev} dtype {a.dtype} threads {torch.get_num_threads()} (best of {a.repeat})")
    print(f"{'call':<6} {'n':>6} {'off (ms)':>10} {'on (ms)':>10} {'on/off':>7}")
    g = torch.Generator().manual_seed(0)
    for n in (int(s) for s in a.sizes.split(",")):
        A = torch.randn(n, n, generator=g).to(dev, dt)
        G = A.mT @ A
        for name, fn in (("svd", lambda: linalg.svd(A)), ("eigh", lambda: linalg.eigh(G))):
            with solver_timeout(None):
                off = timed(fn, a.repeat, dev)
            with solver_timeout(3600):
                on = timed(fn, a.repeat, dev)
            print(f"{name:<6} {n:>6} {1e3 * off:>10.3f} {1e3 * on:>10.3f} {on / off:>7.3f}")


if __name__ == "__main__":
    main()
