"""Same-session reference for the BF16 GEMM ceiling (GPU machine only; kimirt never needs Python):
torch.matmul (cuBLAS) at 8192^3 and at the shapes kimirt-bench times, with kimirt-bench's method
(warm-up, then the median over samples of 20 back-to-back calls, CUDA events), so that a figure of ours
can be set beside the library's on the same clocks.

usage: python3 scripts/torch_gemm_reference.py [out.json]
"""
import json
import sys

import torch


def time_us(fn, reps=20, samples=15, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / reps)
    times.sort()
    return times[len(times) // 2]


def main():
    torch.manual_seed(0)
    rows = []
    # (M, N, K): activations [M, K] times weights [N, K]^T, as kimirt's Linear.
    for m, n, k in [(8192, 8192, 8192), (4096, 7168, 7168), (4096, 18432, 1536), (4096, 12288, 7168),
                    (4096, 7168, 12288)]:
        x = (torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16)
        w = (torch.rand(n, k, device="cuda") * 0.1 - 0.05).to(torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        t = time_us(lambda: torch.matmul(x, w.t(), out=out))
        tflops = 2.0 * m * n * k / t * 1e-6
        rows.append({"m": m, "n": n, "k": k, "time_us": t, "TFLOPs": tflops})
        print(f"torch bf16 matmul M={m} {n}x{k}: {t:9.1f} us {tflops:7.1f} TFLOP/s", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
