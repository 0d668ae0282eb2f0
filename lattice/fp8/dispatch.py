"""Static FP8 dispatch: find a model's GEMM sites, attach probes, turn the probes' statistics
into a plan (which recipe, if any, each site runs), and apply a plan to a model.

A site is any module with a `recipe` attribute (None: FP32) and a `weight_matrix()` method
(lattice.models.gemm.GemmSite is the one the networks use); it also has `probe`, `backward`,
`site_name`, `gemm_shape() -> (K, N)` and `flops_per_row()`, optionally `rows_per_example`.
Sites are named by their qualified module path ("(root)" for the model itself).

The plan is JSON (it is saved inside model.pt and as models/<model>/fp8_plan.json):
  {"version": 1, "recipes": [...], "max_relative_error": x, "backward": fmt,
   "sites": [{"site", "shape": [K, N], "flops_share", "mere": {recipe: {"learned", "random"}},
              "backward_mere", "choice": recipe | "fp32", "backward": fmt, "reason"}],
   "fp8_flops_share": x, "speed_filter": "CPU: emulated, quality only" | "measured on ..."}
A site takes the first recipe (config order, cheapest first) whose learned MERE is below
`max_relative_error`, and on CUDA only if its measured speed-up beats `min_speedup`; a site
with no statistics stays FP32.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from lattice.fp8.estimate import backward_errors, site_errors
from lattice.fp8.gemm import fp8_forward
from lattice.fp8.recipes import FORWARD_RECIPES, GRAD_FORMATS
from lattice.fp8.stats import SiteProbe

PLAN_VERSION = 1
CPU_SPEED_FILTER = "CPU: emulated, quality only"
ROOT_NAME = "(root)"


# a site's attributes are set on the fly (recipe, probe), which nn.Module's typing cannot see
Site = Any


def find_sites(model: nn.Module) -> dict[str, Site]:
    """{qualified name: site} in module order; names each site (`site_name`)."""
    out: dict[str, Site] = {}
    for name, m in model.named_modules():
        if hasattr(m, "recipe") and callable(getattr(m, "weight_matrix", None)):
            m.site_name = name or ROOT_NAME
            out[m.site_name] = m
    return out


def _is_pair(site: Site) -> bool:
    """Activation x activation: no weight operand, B is probed too."""
    return site.weight_matrix() is None


def attach_probes(model: nn.Module, every: int = 1) -> dict[str, SiteProbe]:
    """A fresh SiteProbe on every site (updated on every `every`-th training call)."""
    probes = {}
    for name, site in find_sites(model).items():
        k, _ = site.gemm_shape()
        site.probe = probes[name] = SiteProbe(k, every, pair=_is_pair(site))
    return probes


def detach_probes(model: nn.Module) -> None:
    """Remove the probes (training after the plan no longer pays for statistics)."""
    for site in find_sites(model).values():
        site.probe = None


def probe_state(model: nn.Module) -> dict[str, dict]:
    """{site: probe state} of every site with a probe: plain tensors, for the checkpoint."""
    return {name: site.probe.state_dict() for name, site in find_sites(model).items() if site.probe is not None}


def load_probe_state(model: nn.Module, state: dict[str, dict]) -> None:
    """Rebuild the probes `probe_state` saved; every named site must exist with the same K."""
    sites = find_sites(model)
    missing = sorted(set(state) - set(sites))
    if missing:
        raise KeyError(f"FP8 probe state names sites this model lacks: {missing}; its sites are {sorted(sites)}")
    for name, s in state.items():
        sites[name].probe = SiteProbe.from_state_dict(s)
        if sites[name].probe.k != sites[name].gemm_shape()[0]:
            raise ValueError(f"FP8 probe state for site {name!r} has K={sites[name].probe.k}, "
                             f"the site has K={sites[name].gemm_shape()[0]}")


def all_reduce_probes(model: nn.Module, group=None) -> None:
    """Merge every rank's statistics into every rank (a collective: all ranks, same model)."""
    for site in find_sites(model).values():
        if site.probe is not None:
            site.probe.all_reduce(group)


def _flops_per_example(site: Site) -> int:
    return int(site.flops_per_row()) * int(getattr(site, "rows_per_example", 1))


def measure_speedup(k: int, n: int, recipe: str, device: str, m: int = 8192, iters: int = 20) -> float:
    """FP32 time / FP8 time of one (m, K) x (K, N) forward GEMM on `device`, quantisation of both
    operands included (what a site pays per call)."""
    a = torch.randn(m, k, device=device)
    b = torch.randn(n, k, device=device)

    def timed(fn) -> float:
        fn()
        if a.is_cuda:
            torch.cuda.synchronize(a.device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if a.is_cuda:
            torch.cuda.synchronize(a.device)
        return (time.perf_counter() - t0) / iters

    return timed(lambda: a @ b.t()) / max(timed(lambda: fp8_forward(a, b, recipe)), 1e-12)


def make_plan(model: nn.Module, fp8_config: Any, speedups: dict[str, Any] | None = None, device: str = "cpu",
              n_samples: int = 1024, seed: int = 0) -> dict:
    """The plan (module docstring) from the probes attached to `model`'s sites. `fp8_config`:
    the config's `fp8` section (recipes, backward, max_relative_error, min_speedup). On a CUDA
    `device` a site also needs a speed-up (FP32 time / FP8 time of its GEMM shape) above
    `min_speedup`: `speedups` gives it per site (a float, or {recipe: float}); when None it is
    measured here for the recipe the site would take."""
    recipes = [r for r in fp8_config.recipes]
    bad = [r for r in recipes if r not in FORWARD_RECIPES]
    if bad:
        raise ValueError(f"unknown FP8 recipes {bad}; use {FORWARD_RECIPES}")
    thr = float(fp8_config.max_relative_error)
    backward = fp8_config.backward
    on_cuda = str(device).startswith("cuda")
    sites = find_sites(model)
    total = sum(_flops_per_example(s) for s in sites.values()) or 1
    if not on_cuda:
        speed_filter = CPU_SPEED_FILTER
    elif speedups is None:
        speed_filter = f"measured on {torch.cuda.get_device_name(torch.device(device))}"
    else:
        speed_filter = "measured (given)"
    measured: dict[tuple[int, int, str], float] = {}

    def speedup(name: str, recipe: str) -> float:
        if speedups is not None:
            v = speedups.get(name, 0.0)
            return float(v.get(recipe, 0.0) if isinstance(v, dict) else v)
        k, n = sites[name].gemm_shape()
        if (k, n, recipe) not in measured:  # sites of one shape share the measurement
            measured[(k, n, recipe)] = measure_speedup(k, n, recipe, device)
        return measured[(k, n, recipe)]

    rows, fp8_share = [], 0.0
    for i, (name, site) in enumerate(sites.items()):
        k, n = site.gemm_shape()
        share = _flops_per_example(site) / total
        row: dict[str, Any] = {"site": name, "shape": [int(k), int(n)], "flops_share": share, "mere": {},
                               "backward_mere": None, "choice": "fp32", "backward": backward, "reason": ""}
        probe = site.probe
        if probe is None or probe.a.count == 0:
            row["reason"] = "no probe statistics"
            rows.append(row)
            continue
        weight = site.weight_matrix()
        errs = site_errors(probe, weight, recipes, n_samples=n_samples, seed=seed + i, n_rows_b=int(n))
        row["mere"] = errs
        passing = [r for r in recipes if errs[r]["learned"] < thr]
        scored = recipes[0] if not passing else passing[0]
        bw = backward_errors(probe, weight, scored, backward, n_samples=n_samples, seed=seed + i, n_rows_b=int(n))
        row["backward_mere"] = max(bw.values())
        if not passing:
            best = min(recipes, key=lambda r: errs[r]["learned"])
            row["reason"] = f"every recipe's learned MERE >= {thr:g} (best {best} {errs[best]['learned']:.4f})"
        elif on_cuda and not speedup(name, passing[0]) > float(fp8_config.min_speedup):
            row["reason"] = (f"{passing[0]} is accurate enough ({errs[passing[0]]['learned']:.4f}) but its speed-up "
                             f"{speedup(name, passing[0]):.2f} <= {float(fp8_config.min_speedup):g}")
        else:
            row["choice"] = passing[0]
            row["reason"] = f"learned MERE {errs[passing[0]]['learned']:.4f} < {thr:g}"
            if on_cuda:
                row["reason"] += f", speed-up {speedup(name, passing[0]):.2f}"
            fp8_share += share
        rows.append(row)
    return {"version": PLAN_VERSION, "recipes": recipes, "max_relative_error": thr, "backward": backward,
            "sites": rows, "fp8_flops_share": fp8_share, "speed_filter": speed_filter}


def apply_plan(model: nn.Module, plan: dict) -> dict[str, str]:
    """Set `recipe` and `backward` on every site the plan names (sites it does not name run
    FP32). Raises if the plan names a site the model lacks or one of another shape (a plan made
    for another model). Returns {site: choice}."""
    if int(plan.get("version", 0)) != PLAN_VERSION:
        raise ValueError(f"FP8 plan version {plan.get('version')!r}; this code reads version {PLAN_VERSION}")
    sites = find_sites(model)
    named = {row["site"]: row for row in plan["sites"]}
    missing = sorted(set(named) - set(sites))
    if missing:
        raise KeyError(f"FP8 plan names sites this model lacks: {missing}; its sites are {sorted(sites)}")
    out = {}
    for name, site in sites.items():
        row = named.get(name)
        if row is None:
            site.recipe = None
            continue
        if "shape" in row and list(row["shape"]) != [int(x) for x in site.gemm_shape()]:
            raise ValueError(f"FP8 plan site {name!r} has shape {row['shape']}, the model's is {list(site.gemm_shape())}")
        choice = row["choice"]
        if choice != "fp32" and choice not in FORWARD_RECIPES:
            raise ValueError(f"FP8 plan site {name!r}: unknown choice {choice!r}")
        bw = row.get("backward", plan.get("backward", "e5m2"))
        if bw not in GRAD_FORMATS:
            raise ValueError(f"FP8 plan site {name!r}: unknown backward format {bw!r}")
        site.recipe = None if choice == "fp32" else choice
        site.backward = bw
        out[name] = choice
    return out


def plan_table(plan: dict) -> str:
    """A readable per-site table of a plan."""
    recipes = plan["recipes"]
    head = f"{'site':<40} {'K x N':>11} {'flops':>6}  " + "  ".join(f"{r:>17}" for r in recipes) + f"  {'bwd':>6}  choice"
    lines = [f"FP8 plan: threshold {plan['max_relative_error']:g} on learned MERE; backward {plan['backward']}; "
             f"speed: {plan['speed_filter']}", f"{'':<40} {'':>11} {'':>6}  "
             + "  ".join(f"{'learned/random':>17}" for _ in recipes), head, "-" * len(head)]
    for row in plan["sites"]:
        cells = []
        for r in recipes:
            e = row["mere"].get(r)
            cells.append(f"{e['learned']:>8.4f}/{e['random']:<8.4f}" if e else f"{'-':>17}")
        bwd = f"{row['backward_mere']:.4f}" if row["backward_mere"] is not None else "-"
        k, n = row["shape"]
        lines.append(f"{row['site']:<40} {f'{k}x{n}':>11} {row['flops_share']:>6.1%}  " + "  ".join(cells)
                     + f"  {bwd:>6}  {row['choice']}  ({row['reason']})")
    lines.append(f"FP8 share of site FLOPs: {plan['fp8_flops_share']:.1%}")
    return "\n".join(lines)
