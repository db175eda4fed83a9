#!/usr/bin/env bash
# The prepared GPU check: every figure docs/benchmarks.md's GPU rows need, in one command (about 9.5 min on
# one H200 when warm). Needs torch (CUDA), transformers, safetensors, tqdm, pytest; runs from the
# repository root on the source tree (no install).
#
#   OUT=benchmarks/results/gpu bash benchmarks/gpu_check.sh
#
# The step time limits add up to 23 min (the expected total is about 9.5 before the deployment
# step, which is last and not yet timed on a GPU: estimated 2-3 min): give the device command 600 s,
# or run the deployment step alone (its command below) where the first run was cut. Each step writes its output as it goes, so a step cut short leaves the earlier
# files. The steps run in the order the goals need them (the tests, calibration against its FLOP
# bound, seconds per 8B layer first), so a slow run loses only the optional ones. Writes to $OUT:
#   gpu.txt            device, versions
#   tests.txt          the CUDA-only tests
#   foundation.txt     calibration against its FLOP bound, perplexity overhead (Llama-3.1-8B
#                      shape, 4 layers, bf16)
#   compensate_8b.{txt,json}  RCPU and COEC per 8B module at the paper's 50 rounds, and per
#                      layer (o_proj + down_proj)
#   real_steps_8b.txt  COEC per 8B module with as many right-solve steps a round as the embedded
#                      model's real layers take (the synthetic problems take fewer)
#   breakdown.txt      seconds per COEC block at 8B shapes, 5 rounds
#   left_polar.txt     SVD / eigh left polar timed on the 8B left-rotation matrices
#   rg_product_8b.txt  down_proj with rg_update: product, against the CUDA default carry
#   gram_blocks.txt    the calibration Gram by block rows against one dense GEMM, per block size
#   watchdog.txt       SVD / eigh with the solver watchdog on and off
#   cayley_solve.txt   o_proj with the LU Cayley inverse
#   deploy_speed.{txt,json}  dense and pruned (10/20/30 %) Llama-3.1-8B shapes in transformers, bf16:
#                      prefill and decode tokens/s beside their FLOP and byte bounds (the GPU half
#                      of results/table4_measured.csv; llama.cpp only where built with GPU offload)
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

step() { echo; echo "== $1 ($(date +%T))"; }

step "device"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"

step "CUDA-only tests"
timeout 60 $py -m pytest -q -p no:cacheprovider tests/integration/test_calibrate_foundation.py tests/unit/test_compensate_methods.py \
    tests/unit/test_compensate_safeguards.py -k "gram_product or cuda" 2>&1 | tail -5 | tee "$OUT/tests.txt"

step "calibration and perplexity (8B shape, 4 layers, bf16)"
timeout 150 $py benchmarks/bench_foundation.py --random-arch Llama-3.1-8B --layers 4 --dtype bfloat16 \
    --device cuda --nseq 16 --seqlen 2048 --batch 8 2>&1 | grep -v "it/s" | tee "$OUT/foundation.txt"

step "RCPU and COEC per 8B module (50 rounds)"
timeout 180 $py benchmarks/bench_compensate.py --device cuda --shapes 8b --methods rcpu,coec \
    --json "$OUT/compensate_8b.json" 2>&1 | tee "$OUT/compensate_8b.txt"

step "COEC per 8B module at the embedded model's real step counts (4 right-solve steps a round for down_proj, 6 for o_proj; 50 rounds)"
{ timeout 75 $py benchmarks/bench_compensate.py --device cuda --shapes 8b --modules down_proj --methods coec \
    --test-tokens 0 --coec-opts '{"delta": 1e-12, "max_inner_steps": 4}'
  timeout 75 $py benchmarks/bench_compensate.py --device cuda --shapes 8b --modules o_proj --methods coec \
    --test-tokens 0 --coec-opts '{"delta": 1e-12, "max_inner_steps": 6}'
} 2>&1 | tee "$OUT/real_steps_8b.txt"

step "COEC per-block breakdown (8B shapes, 5 rounds; watchdog off, so the solver kernels are attributed)"
COEC_SOLVER_TIMEOUT=0 timeout 120 $py benchmarks/bench_compensate.py --device cuda --shapes 8b --methods coec --max-rounds 5 \
    --breakdown --test-tokens 0 2>&1 | tee "$OUT/breakdown.txt"

step "left polar methods on the 8B left-rotation matrices"
timeout 90 $py benchmarks/left_polar.py --device cuda --shapes 8b --max-rounds 1 --time 3 \
    2>&1 | tee "$OUT/left_polar.txt"

step "down_proj with R Gxx by a product per trial (rg_update: product, 50 rounds): what the carried product saves"
timeout 60 $py benchmarks/bench_compensate.py --device cuda --shapes 8b --modules down_proj --methods coec \
    --test-tokens 0 --coec-opts '{"rg_update": "product"}' 2>&1 | tee "$OUT/rg_product_8b.txt"

step "calibration Gram by block rows against the dense GEMM (bf16, 8B and 70B widths)"
timeout 60 $py benchmarks/gram_blocks.py --device cuda --dtype bfloat16 --dims 4096,14336,28672 \
    --tokens 16384 --blocks 512,1024,2048,4096 2>&1 | tee "$OUT/gram_blocks.txt"

step "solver watchdog overhead (CUDA default: on)"
timeout 60 $py benchmarks/watchdog_overhead.py --device cuda --sizes 1024,4096 --repeat 3 \
    2>&1 | tee "$OUT/watchdog.txt"

step "o_proj with the LU Cayley inverse (50 rounds)"
timeout 90 $py benchmarks/bench_compensate.py --device cuda --shapes 8b --modules o_proj --methods coec \
    --test-tokens 0 --coec-opts '{"cayley_inverse": "solve"}' 2>&1 | tee "$OUT/cayley_solve.txt"

step "deployment speed: dense and pruned 8B shapes, transformers bf16 on CUDA, batch 1 (docs/deploy.md)"
timeout 180 $py benchmarks/deploy_speed.py --random-arch Llama-3.1-8B --dtype bfloat16 --device cuda \
    --ratios 0.1,0.2,0.3 --prompt 512 --new-tokens 128 --repeat 5 --json "$OUT/deploy_speed.json" \
    2>&1 | tee "$OUT/deploy_speed.txt"

step "done"
