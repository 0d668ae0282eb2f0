"""FP8 on a real FP8 GPU (sm89+): does the platform's CPU emulation of an FP8 GEMM give what the
tensor cores give, and where is FP8 faster than bf16 at the platform's own GEMM shapes?

The FP8 probe and dispatcher (lattice.fp8) score a site's error with the emulation on CPU
(dequantise the float8 operands, multiply in fp32) and run `torch._scaled_mm` on CUDA for the
per-tensor recipe. This script checks, per shape: max |emulated - tensor cores| against the fp32
product's scale (both sides use the same float8 operands, so only the accumulation order may
differ), each side's error against the unquantised fp32 product, and the median time of fp32,
bf16 and FP8 GEMMs (CUDA events, 50 runs after warm-up). It needs only torch and lattice.fp8
(no torchrec), so it runs on a bare GPU image: `python3 bench/device_fp8_check.py`.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lattice.fp8.gemm import qmm  # noqa: E402
from lattice.fp8.recipes import quantize  # noqa: E402

# (M, K, N): the demo teacher's dense / interaction GEMMs at batch 512 and 4096, and large ones
SHAPES = [(512, 64, 256), (512, 256, 256), (512, 512, 128), (4096, 256, 256), (4096, 1024, 1024),
          (8192, 4096, 4096), (16384, 8192, 8192)]


def _time(fn, runs: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def check(m: int, k: int, n: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g) * torch.rand(m, 1, device="cuda", generator=g) * 4
    w = torch.randn(n, k, device="cuda", generator=g) / k**0.5
    ref = x @ w.t()
    x8, sx = quantize(x, "e4m3_tensor")
    w8, sw = quantize(w, "e4m3_tensor")
    tc = qmm(x8, sx, w8, sw, "e4m3_tensor", use_scaled_mm=True)
    emu = qmm(x8, sx, w8, sw, "e4m3_tensor", use_scaled_mm=False)
    scale = ref.abs().max().item()
    xb, wb = x.bfloat16(), w.bfloat16()
    return {
        "shape": [m, k, n],
        "emulated_vs_tensor_cores_max_rel": (emu - tc).abs().max().item() / scale,
        "tensor_cores_vs_fp32_max_rel": (tc - ref).abs().max().item() / scale,
        "emulated_vs_fp32_max_rel": (emu - ref).abs().max().item() / scale,
        "ms_fp32": _time(lambda: x @ w.t()),
        "ms_bf16": _time(lambda: xb @ wb.t()),
        "ms_fp8_scaled_mm": _time(lambda: qmm(x8, sx, w8, sw, "e4m3_tensor", use_scaled_mm=True)),
        "ms_fp8_with_quantize": _time(lambda: qmm(*quantize(x, "e4m3_tensor"), w8, sw, "e4m3_tensor", use_scaled_mm=True)),
    }


def main() -> None:
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on an FP8 GPU")
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    rows = [check(*s) for s in SHAPES]
    info = {"device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
            "torch": torch.__version__, "rows": rows}
    print(f"{info['device']} sm{info['capability']} torch {info['torch']}")
    print(f"{'M x K x N':>20} {'emu-vs-TC':>10} {'TC err':>9} {'emu err':>9} {'fp32 ms':>8} {'bf16 ms':>8} "
          f"{'fp8 ms':>8} {'fp8+q ms':>9} {'bf16/fp8':>8}")
    for r in rows:
        m, k, n = r["shape"]
        print(f"{f'{m}x{k}x{n}':>20} {r['emulated_vs_tensor_cores_max_rel']:>10.2e} {r['tensor_cores_vs_fp32_max_rel']:>9.2e} "
              f"{r['emulated_vs_fp32_max_rel']:>9.2e} {r['ms_fp32']:>8.4f} {r['ms_bf16']:>8.4f} {r['ms_fp8_scaled_mm']:>8.4f} "
              f"{r['ms_fp8_with_quantize']:>9.4f} {r['ms_bf16'] / r['ms_fp8_scaled_mm']:>8.2f}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "fp8_device.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
