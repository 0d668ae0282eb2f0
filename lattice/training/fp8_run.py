"""FP8 inside a training run: probe in FP32 for `fp8.warmup_steps`, make the plan once, then train
at the chosen sites in FP8 (lattice.fp8). The plan is static: it is saved in every checkpoint and
in model.pt, so a resumed run, evaluation, distillation scoring and the exported artifact all use
the same sites. With `fp8.enabled: false` (or a model `fp8.models` leaves out) nothing here runs
and the model trains exactly as FP32."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from lattice.config import PlatformConfig


class Fp8Run:
    def __init__(self, config: PlatformConfig, kind: str, model: nn.Module, rank: int, world: int):
        f = config.fp8
        self.config, self.rank, self.world = config, rank, world
        self.enabled = f.enabled and kind in f.models
        self.model = model  # the plain module; DMP keeps its dense submodules, so sites stay the same objects
        self.plan: dict | None = None
        if self.enabled:
            from lattice.fp8.dispatch import attach_probes

            attach_probes(model, f.probe_every)

    def after_step(self, global_step: int) -> bool:
        """Make the plan when the warm-up ends. Returns True when it switched sites to FP8."""
        if not self.enabled or self.plan is not None or global_step < self.config.fp8.warmup_steps:
            return False
        self.make_plan()
        return True

    def make_plan(self) -> None:
        from lattice.fp8.dispatch import all_reduce_probes, apply_plan, make_plan

        all_reduce_probes(self.model)  # every rank's statistics, merged exactly
        plan = make_plan(self.model, self.config.fp8) if self.rank == 0 else None
        if self.world > 1:  # one decision for all ranks: their dense weights are the same under DDP
            box = [plan]
            dist.broadcast_object_list(box, src=0)
            plan = box[0]
        self.plan = plan
        apply_plan(self.model, plan)
        if self.rank == 0:
            chosen = [s for s in plan["sites"] if s["choice"] != "fp32"]
            print(f"[lattice] fp8: {len(chosen)} of {len(plan['sites'])} GEMM sites switched to FP8 "
                  f"({plan['fp8_flops_share']:.0%} of GEMM FLOPs); plan in model.pt and fp8_plan.json", flush=True)

    def finish(self) -> None:
        """A run shorter than the warm-up still ends with a plan, so what is evaluated and served
        is what the plan says (its FP8 sites saw no FP8 training steps: the log says so)."""
        if self.enabled and self.plan is None:
            if self.rank == 0:
                print(f"[lattice] fp8: the run ended before fp8.warmup_steps ({self.config.fp8.warmup_steps}); "
                      "planning now, FP8 sites were trained in FP32", flush=True)
            self.make_plan()

    # ------------------------------------------------------------ checkpoints
    def state(self) -> dict | None:
        if not self.enabled:
            return None
        from lattice.fp8.dispatch import probe_state

        return {"plan": self.plan, "probe": probe_state(self.model)}

    def load(self, state: dict | None) -> None:
        if not self.enabled or not state:
            return
        from lattice.fp8.dispatch import apply_plan, load_probe_state

        load_probe_state(self.model, state["probe"])
        self.plan = state.get("plan")
        if self.plan is not None:
            apply_plan(self.model, self.plan)

    def probe_for_blob(self) -> dict | None:
        """Merged probe statistics for model.pt (what `lattice fp8 plan` re-plans from)."""
        if not self.enabled:
            return None
        from lattice.fp8.dispatch import all_reduce_probes, probe_state

        all_reduce_probes(self.model)
        return probe_state(self.model)
