"""The serving artifact's format: TorchScript (what `lattice export` writes) against `torch.export`
(the ExportedProgram run eagerly through `.module()`) and AOTInductor (the same program compiled
to a shared library by `torch._inductor.aoti_compile_and_package`), on the demo's student as
serving runs it (`lattice.export.serving_module`: fused sparse lookup, probabilities out).

For each format: whether it builds, the build time, the forward latency at batch 1 (a single
request) and 256 on one intra-op thread (`lattice serve`'s default), medians of `--runs` rounds of
`--iters` calls each, interleaved so machine noise hits every format alike, and the largest |Δp|
against the eager serving module. Ratios are against TorchScript measured in the same run.
Prints figures; asserts nothing.

    nice .venv/bin/python bench/bench_export_format.py [--runs 5] [--iters 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def inputs(config, batch: int, n_dense: int, seed: int):
    import numpy as np
    import torch

    from lattice.data.batch import kjt_from_ids

    rng = np.random.default_rng(seed)
    names = [f.name for f in config.features.sparse]
    kjt = kjt_from_ids(names, [rng.integers(0, 10_000, batch) for _ in names], [np.ones(batch, bool) for _ in names])
    dense = torch.from_numpy(rng.standard_normal((batch, n_dense)).astype("float32"))
    domain = torch.from_numpy(rng.integers(0, len(config.domains), batch))
    return dense, kjt, domain


def build(kind: str, model, eager, example, workdir: Path):
    """A callable (dense, kjt, domain) -> {objective: p} in `kind`'s format: `model` is the
    trained network, `eager` its serving module."""
    import torch

    from lattice.export.serving_module import script

    if kind == "torchscript":
        return script(model)  # as `lattice export` writes it
    program = torch.export.export(eager, example, strict=False)
    if kind == "export":
        return program.module()
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    package = aoti_compile_and_package(program, package_path=str(workdir / f"student_{example[0].shape[0]}.pt2"))
    return aoti_load_package(package)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--n-dense", type=int, default=6)
    ap.add_argument("--formats", default="torchscript,export,aoti")
    args = ap.parse_args()

    import torch

    from lattice.config import load_config
    from lattice.export.serving_module import serving_module
    from lattice.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    model = build_model(cfg, "student", args.n_dense).eval()
    eager = serving_module(model)
    formats = args.formats.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    print(f"machine: {os.cpu_count()} cores; torch {torch.__version__}; demo student, {args.n_dense} dense inputs; "
          f"1 intra-op thread; {args.runs} rounds x {args.iters} calls")
    built: dict[tuple[str, int], object] = {}
    for batch in (1, 256):
        example = inputs(cfg, batch, args.n_dense, seed=batch)
        for kind in formats:
            t0 = time.perf_counter()
            try:
                fn = build(kind, model, eager, example, work)
            except Exception as exc:  # a format that cannot take this model is a finding, not a crash
                print(f"  {kind:12s} batch {batch:3d}: does not build: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                if os.environ.get("BENCH_TRACE"):
                    traceback.print_exc()
                continue
            built[(kind, batch)] = fn
            with torch.inference_mode():
                want = eager(*example)
                got = fn(*example)
            diff = max(float((got[k] - want[k]).abs().max()) for k in want)
            print(f"  {kind:12s} batch {batch:3d}: built in {time.perf_counter() - t0:6.1f} s, max |Δp| vs eager {diff:.1e}")

    times: dict[tuple[str, int], list[float]] = {k: [] for k in built}
    with torch.inference_mode():
        for _ in range(args.runs):
            for (kind, batch), fn in built.items():
                example = inputs(cfg, batch, args.n_dense, seed=batch)
                for _ in range(10):
                    fn(*example)
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    fn(*example)
                times[(kind, batch)].append((time.perf_counter() - t0) / args.iters * 1e3)
    print(f"\n{'format':12s} {'batch':>5s} {'median ms':>10s} {'vs TorchScript':>15s}   per round")
    for (kind, batch), ts in times.items():
        base = times.get(("torchscript", batch))
        ratio = statistics.median(ts) / statistics.median(base) if base else float("nan")
        print(f"{kind:12s} {batch:5d} {statistics.median(ts):10.3f} {ratio:14.2f}x   " + " ".join(f"{t:.3f}" for t in ts))


if __name__ == "__main__":
    main()
