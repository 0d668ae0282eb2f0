"""The per-rank training loop (the same code for 1 rank in-process and N ranks under torchrun).

Order of work: plan + shard the model, train epochs with a fused in-backward optimizer for the
tables and Adam for the dense part, validate (all-reduced per-cell NE) `training.evals_per_epoch`
times per epoch at the same optimizer steps on every rank, early-stop on patience counted in
validations, restore the best validation's weights, fit the per-cell calibration stage on the validation split, predict the test split,
gather the full weights, write metrics."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

from lattice.data.passthrough import attach as attach_passthrough

from lattice.config import PlatformConfig
from lattice.data.batch import Batch, kjt_from_ids
from lattice.data.loader import BatchLoader, split_rows, table_rows, window_rows
from lattice.data.window import DaySplits
from lattice.data.transforms import DenseStats
from lattice.evaluation.metrics import cell_metrics, ne_from_sums
from lattice.models import build_model, kind_of
from lattice.models.numeric import fit_numeric
from lattice.models.saved import rebuild, saved_blob
from lattice.models.cost import model_cost
from lattice.models.remap import table_capacity_notes
from lattice.progress import progress_bar
from lattice.training import calibration, checkpoint, stopping
from lattice.training import distributed as D
from lattice.training.fp8_run import Fp8Run
from lattice.training.loss import mdmo_loss
from lattice.training.spec import RunSpec

# splits a run reads every epoch: their loaders live for the run and keep their encoded rows
REREAD_SPLITS = ("train", "validation")
SPARSE_OPTIMIZERS = {"adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD, "rowwise_adagrad": RowWiseAdagrad}


@dataclass
class TrainState:
    epoch: int = 0  # epochs finished
    step_in_epoch: int = 0  # batches of the current epoch already consumed (the data position)
    global_step: int = 0
    best_ne: float = math.inf
    best_epoch: int = -1  # the epoch (1-based) in which the best validation fell
    bad_epochs: int = 0  # unused since validations inside epochs (kept: older checkpoints carry it)
    best_step: int = -1  # global step of the best validation, whose weights `Trainer.best` holds
    bad_evals: int = 0  # validations in a row without a better macro NE (early-stopping patience)
    stopped: bool = False  # early-stopped (a resume from the checkpoint then goes straight to finish)
    stop_reason: str = ""  # why training ended and which validation it kept (stopping.reason), once it has
    epoch_steps: int = 0  # steps of a finished epoch (0 before the first ends): spaces the validations
    eval_seconds: float = 0.0  # time spent validating, all epochs
    evals: list = field(default_factory=list)  # one entry per validation: step, epoch, val NE per cell, macro
    epoch_loss: float = 0.0
    epoch_examples: int = 0
    epoch_seconds: float = 0.0
    history: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # [global_step, mean loss] every few steps, for curves


def _collective_device() -> torch.device:
    """Where a collective's tensors must live: nccl reduces GPU tensors only."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _all_have(batch, world: int) -> bool:
    """Ranks may hold a different number of batches; all stop when the first runs dry."""
    if world == 1:
        return batch is not None
    flag = torch.tensor([1 if batch is not None else 0], device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _any_have(batch, world: int) -> bool:
    if world == 1:
        return batch is not None
    flag = torch.tensor([1 if batch is not None else 0], device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _stand_in(config: PlatformConfig, n_dense: int, forest=None) -> Batch:
    """A one-row batch with every feature absent: a rank that has run out of evaluation rows still
    has to join the sharded forward's collectives while the others finish. `forest`: the model's
    LeafForest, whose forests get empty bags too."""
    names = [f.name for f in config.features.sparse]
    if forest is not None:
        from lattice.trees.leaves import leaf_key

        names = names + [leaf_key(o) for o in sorted(forest.boosters)]
    z = torch.zeros(1)
    return Batch(dense=torch.zeros(1, n_dense), sparse=kjt_from_ids(names, [np.zeros(1, np.int64)] * len(names), [np.zeros(1, bool)] * len(names)),
                 domain=torch.zeros(1, dtype=torch.int64), labels={o: z for o in config.objective_names},
                 masks={o: z for o in config.objective_names}, example_ids=np.array(["-"]))


def _sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    if dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.cpu().tolist()


class Trainer:
    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.config: PlatformConfig = spec.platform()
        self.paths = spec.paths()
        self.dir = self.paths.model_dir(spec.model)
        tr = self.config.training
        self.device = D.choose_device(tr.device)
        self.rank, self.world, self.own_group = D.init_process_group(self.device, tr.collective_timeout_s)
        # a resume reads the checkpoint's plan first: the new plan keeps each table's kind
        self.resume_from = checkpoint.latest(self.dir / "checkpoint") if spec.resume else None
        self.resume_meta = checkpoint.read_meta(self.resume_from) if self.resume_from else None
        self.stats = DenseStats.load(self.dir / "dense_stats.json")
        self.n_dense = len(self.stats.columns)
        self.kind = kind_of(spec.model)
        torch.manual_seed(spec.seed)
        from lattice.hashing.store import load_fitted

        self.days = DaySplits.from_json(spec.days)
        self.parent_blob = (torch.load(Path(spec.parent) / "model.pt", map_location="cpu", weights_only=False)
                            if spec.parent else None)
        # a warm start takes the parent's id maps, refitted without moving a known id (lattice.hashing.refit)
        self.grown: set[str] = set()
        if self.parent_blob is not None:
            from lattice.training.warm_start import grown_tables

            parent_maps = self.parent_blob.get("hashing") or {}
            self.fitted = torch.load(spec.fitted, weights_only=False) if spec.fitted else parent_maps
            self.grown = grown_tables(parent_maps, self.fitted)
        else:
            self.fitted = load_fitted(self.config, self.paths)  # feature -> fitted id map (hashing)
        from lattice.trees.leaves import forest_for

        # the tree fit whose leaf ids this model reads (models.leaves), carried into model.pt
        self.forest = forest_for(self.config, self.paths, self.kind, self.parent_blob)
        model = build_model(self.config, self.kind, self.n_dense, fitted=self.fitted,
                            leaves=self.forest.spec() if self.forest is not None else None)
        self.fresh_params: list[str] = []
        if self.parent_blob is not None:
            from lattice.training.warm_start import check_compatible

            self.fresh_params = check_compatible(model, self.parent_blob, self.config, self.kind, self.grown)
        if self.stats.label_rates:
            model.set_output_bias(self.stats.label_rates)
        fit_numeric(model, self.stats)  # the numeric encoders' bin edges (none: a no-op)
        tables = [p for m in model.modules() if isinstance(m, EmbeddingBagCollection) for p in m.parameters()]
        # the table update runs inside backward (fused with the gradient in the sharded kernel)
        apply_optimizer_in_backward(SPARSE_OPTIMIZERS[tr.sparse_optimizer], tables, {"lr": tr.lr_sparse})
        self.fp8 = Fp8Run(self.config, self.kind, model, self.rank, self.world)
        pinned = self.resume_meta["plan"] if self.resume_meta else None
        self.plan = D.make_plan(model, self.world, D.sharding_types(tr.sharding_types, self.device), self.device, pinned)
        self.plan_json = D.plan_to_json(self.plan)
        if self.rank == 0:
            print(f"[lattice] sharding plan ({self.world} rank(s), {self.device.type}):\n{self.plan}", flush=True)
            if self.kind != "student":  # the student's tables are scaled down on purpose (table_scale)
                for note in table_capacity_notes(self.config, self.stats.distinct_ids, self.stats.merged_ids):
                    print(f"[lattice] note: {note}", flush=True)
            (self.dir / "plan.json").write_text(json.dumps(self.plan_json, indent=1))
        self.threads_before, self.threads = torch.get_num_threads(), None  # None: left to torch (CUDA)
        if self.device.type == "cpu":
            self._set_threads(model)
        self.model = D.wrap(model, self.plan, self.device)
        dense = in_backward_optimizer_filter(self.model.named_parameters())
        # group 1: data-parallel tables, whose dense kernel leaves their update to this optimizer;
        # they follow the tables' schedule (lr_sparse_after_first_epoch) on top of the dense one
        groups: list[list] = [[], []]
        for name, p in dense:
            groups[".embedding_bags." in name].append(p)
        # fused: one kernel per step on CPU and GPU; foreach on CPU loops over every tensor per update
        # term (57 tensors, 1.06 against 0.34 ms a step; MIND, Taobao, Avazu +10-15% examples/s)
        self.dense_opt = torch.optim.Adam([{"params": g} for g in groups], lr=tr.lr_dense, fused=True)
        # the run's real train rows plan the steps (and so the rate's decay), whatever the split kind
        if self.days is not None:  # the run's train days (footers; a replayed day counts at its share)
            train_rows = window_rows(Path(spec.table), DaySplits({d: s for d, s in self.days.days.items() if s == "train"}))
            train_rows += window_rows(Path(spec.table), DaySplits({d: "train" for d in self.days.replay})) * self.days.replay_share
            if self.days.matured:  # a matured day's rows that replay did not choose (their newly known labels)
                train_rows += window_rows(Path(spec.table), DaySplits({d: "train" for d in self.days.matured})) * (
                    1 - (self.days.replay_share if self.days.replay else 0.0))
            held = self.days.validation_day()
            if held is not None and self.days.validation_share < 1:
                train_rows += window_rows(Path(spec.table), DaySplits({held: "train"})) * (1 - self.days.validation_share)
        else:  # the stored split column's count; the hash fractions only for a table without one
            train_rows = split_rows(Path(spec.table), "train")
        if train_rows is None:
            train_rows = table_rows(Path(spec.table)) * (1 - tr.validation_fraction - tr.test_fraction)
        self.planned_steps = max(1, math.ceil(spec.epochs * train_rows / tr.batch_size))
        self.estimated_epoch_steps = max(1, math.ceil(train_rows / tr.batch_size))
        self.state = TrainState()
        self.best: dict | None = None
        self._loaders: dict[tuple[str, bool], BatchLoader] = {}

    def _set_threads(self, model: torch.nn.Module) -> None:
        """This rank's intra-op threads (lattice.training.threads), from the model's dense FLOPs."""
        from lattice.training.threads import intra_op_threads

        flops = model_cost(model, self.config, self.n_dense)["dense_flops_per_example"]
        model.train()  # model_cost scores in eval mode
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.threads, why = intra_op_threads(self.config.training.threads, flops,
                                             max(1, self.config.training.batch_size // self.world), per_node)
        torch.set_num_threads(self.threads)
        if self.rank == 0:
            print(f"[lattice] {self.spec.model}: {self.threads} intra-op thread(s) per rank ({why})", flush=True)

    # ------------------------------------------------------------ data
    def loader(self, split: str, with_truth: bool = False) -> BatchLoader:
        """The split's loader. Train and validation keep theirs for the run: they are read every
        epoch, and a loader keeps the encoded rows between passes (training.loader_cache_mb)."""
        key = (split, with_truth)
        if key not in self._loaders:
            made = self._new_loader(split, with_truth)
            if split not in REREAD_SPLITS:
                return made  # test is read once
            self._loaders[key] = made
        return self._loaders[key]

    def _new_loader(self, split: str, with_truth: bool) -> BatchLoader:
        # training.batch_size is the global batch: N ranks take 1/N each, so a config trains with
        # the same number of optimizer steps per epoch on 1 rank or on 8
        per_rank = max(1, self.config.training.batch_size // self.world)
        return BatchLoader(self.config, Path(self.spec.table), self.stats, split, batch_size=per_rank, rank=self.rank,
                           world_size=self.world, seed=self.spec.seed, teacher_scores=self.spec.teacher_scores if split == "train" else None,
                           with_truth=with_truth, cache=split in REREAD_SPLITS, days=self.days,
                           label_cutoff=self._label_cutoff(split), leaves=self.forest,
                           cross_fit=self.kind not in self.config.models.leaves.margin)

    def _label_cutoff(self, split: str):
        """A windowed run learns (train) and stops early (validation) on the labels known when it
        trains: an impression whose attribution window is still open is masked, never a fake
        negative (training.label_delay). The test day is judged later, on matured labels."""
        from lattice.data.label_time import delayed_objectives

        if self.days is None or split == "test" or not delayed_objectives(self.config):
            return None
        return self.days.cutoff()

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, root: Path | None = None) -> Path:
        """Collective. `root`: default the model's checkpoint/."""
        return checkpoint.save(root or self.dir / "checkpoint", self.state.global_step, self.rank, self.world,
                               self.plan_json, model=self.model, dense_opt=self.dense_opt, best=self.best,
                               loop_state=asdict(self.state), fp8_state=self.fp8.state())

    def load_checkpoint(self) -> bool:
        if self.resume_from is None:
            return False
        got = checkpoint.load(self.resume_from, self.resume_meta, self.rank, self.world,
                              model=self.model, dense_opt=self.dense_opt)
        self.best, self.state = got.best, TrainState(**got.loop_state)
        self.fp8.load(got.fp8_state)
        return True

    # ------------------------------------------------------------ epochs
    def train_epoch(self, epoch: int) -> bool:
        """Returns False if training stopped early on `stop_after`."""
        st, spec = self.state, self.spec
        loader = self.loader("train")
        loader.set_epoch(epoch)
        self._set_table_lr()
        it = iter(loader)
        for _ in range(st.step_in_epoch):  # resume: replay the data position
            next(it, None)
        self.model.train()
        bar = progress_bar(desc=f"{spec.model} epoch {epoch + 1}/{spec.epochs}", unit="batch", initial=st.step_in_epoch,
                           enabled=spec.progress and self.rank == 0, leave=False)
        started = time.perf_counter()
        window: list[float] = []
        while True:
            batch = next(it, None)
            if not _all_have(batch, self.world):
                break
            batch = D.to_device(batch, self.device)
            logits = self.model(batch.dense, batch.sparse, batch.domain)
            loss = mdmo_loss(self.config, logits, batch).total
            self.dense_opt.zero_grad()
            loss.backward()
            self._set_dense_lr(st.global_step)
            self.dense_opt.step()
            st.step_in_epoch += 1
            st.global_step += 1
            self.fp8.after_step(st.global_step)
            value = loss.item()
            st.epoch_loss += value * len(batch)
            st.epoch_examples += len(batch)
            window.append(value)
            if len(window) == 10:
                st.steps.append([st.global_step, float(np.mean(window))])
                window = []
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}")
            if st.step_in_epoch in self.eval_points():
                st.epoch_seconds += time.perf_counter() - started
                stop = self.evaluate()
                self.model.train()
                started = time.perf_counter()
                if stop:  # fit records the partial epoch and checkpoints
                    bar.close()
                    return True
            if spec.checkpoint_every and st.global_step % spec.checkpoint_every == 0:
                st.epoch_seconds += time.perf_counter() - started
                started = time.perf_counter()
                self.save_checkpoint()
            if spec.stop_after is not None and st.global_step >= spec.stop_after:
                st.epoch_seconds += time.perf_counter() - started
                self.save_checkpoint()
                bar.close()
                return False
        bar.close()
        st.epoch_seconds += time.perf_counter() - started
        return True

    def eval_points(self) -> set[int]:
        """Steps of the current epoch (counted from 1) after which it validates besides its end:
        evals_per_epoch - 1 points evenly spaced over the epoch's steps (the first epoch's from the
        row count, later ones from the steps the first took). The same on every rank and after a
        resume: a function of the config, the table and the saved state."""
        n = self.config.training.evals_per_epoch
        steps = self.state.epoch_steps or self.estimated_epoch_steps
        return {p for p in (round(k * steps / n) for k in range(1, n)) if 0 < p < steps}

    def evaluate(self) -> bool:
        """Validate now, record it, keep the weights if the macro NE is the best so far; True when
        patience ran out (the caller stops training)."""
        st = self.state
        if st.evals and st.evals[-1]["step"] == st.global_step:  # the epoch ended on an in-epoch point
            return st.bad_evals > self.config.training.early_stopping_patience
        t = time.perf_counter()
        val = self.validate()
        finite = [v for v in val.values() if v == v]
        macro = float(np.mean(finite)) if finite else math.inf
        steps = st.epoch_steps or self.estimated_epoch_steps
        tr = self.config.training
        st.evals.append({"step": st.global_step, "epoch": st.epoch + 1,
                         "validation": sum(1 for e in st.evals if e["epoch"] == st.epoch + 1) + 1,
                         "epochs_done": round(st.epoch + min(1.0, st.step_in_epoch / steps), 4),
                         "val_ne": val, "val_macro_ne": macro})
        verdict = stopping.observe(st.best_ne, st.bad_evals, macro, tr.early_stopping_patience)
        st.bad_evals = verdict.bad_evals
        if verdict.best:
            st.best_ne, st.best_epoch, st.best_step = macro, st.epoch + 1, st.global_step
            self.best = D.clone_state(self.model.state_dict())
        st.eval_seconds += time.perf_counter() - t
        if verdict.stop:
            st.stopped = True
            st.stop_reason = self._stop_reason()
            if self.rank == 0:
                print(f"[lattice] early stop: {st.stop_reason}", flush=True)
        return verdict.stop

    def _stop_reason(self) -> str:
        st, tr = self.state, self.config.training
        return stopping.reason(st.evals, st.best_step, st.stopped, tr.early_stopping_patience, tr.evals_per_epoch,
                               self.spec.epochs)

    def stop_record(self) -> dict:
        """What the run's outputs say about its end: the kept validation and why training stopped."""
        st = self.state
        kept = next((e for e in st.evals if e["step"] == st.best_step), None)
        return {"stopped_early": st.stopped, "stop_reason": st.stop_reason or self._stop_reason(),
                "epochs_run": st.epoch, "epochs_planned": self.spec.epochs,
                "kept": {k: kept[k] for k in ("epoch", "validation", "step", "epochs_done", "val_macro_ne") if k in kept}
                if kept else None}

    def _set_dense_lr(self, step: int) -> None:
        """Linear decay from lr_dense to lr_dense * lr_decay_to over the planned steps; a function
        of the step alone, so a resumed run follows the same schedule."""
        tr = self.config.training
        lr = tr.lr_dense * (1 - (1 - tr.lr_decay_to) * min(1.0, step / self.planned_steps))
        dense, tables = self.dense_opt.param_groups
        dense["lr"] = lr * self._after_first_epoch(tr.lr_dense_after_first_epoch)
        tables["lr"] = lr * self._after_first_epoch(tr.lr_sparse_after_first_epoch)

    def _after_first_epoch(self, factor: float) -> float:
        """A rate's factor in the current epoch: 1 in the first, `factor` after it; a function of
        the epoch alone, so a resumed run follows the same schedule."""
        return 1.0 if self.state.epoch == 0 else factor

    def _set_table_lr(self) -> None:
        """The fused tables' rate for the current epoch: `lr_sparse`, times
        `lr_sparse_after_first_epoch` after the first (data-parallel tables, which the dense
        optimizer updates, take the same factor in `_set_dense_lr`)."""
        tr = self.config.training
        lr = tr.lr_sparse * self._after_first_epoch(tr.lr_sparse_after_first_epoch)
        fused = self.model.fused_optimizer  # the sharded tables' kernels; data-parallel ones: _set_dense_lr
        for group in fused.param_groups:
            group["lr"] = lr
        # TorchRec's fused optimizers hand param_groups' rate to their kernels in zero_grad and step
        # (the update itself runs inside backward, so neither touches a weight)
        fused.zero_grad()

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        self.model.eval()
        cells = self.config.cells()
        dom = {d: i for i, d in enumerate(self.config.domain_names)}
        sums = np.zeros((len(cells), 3))
        it = iter(self.loader("validation"))
        while True:
            batch = next(it, None)
            if not _any_have(batch, self.world):
                break
            if batch is None:
                self.model(*D.to_device(_stand_in(self.config, self.n_dense, self.forest), self.device).inputs())
                continue
            batch = D.to_device(batch, self.device)
            logits = self.model(batch.dense, batch.sparse, batch.domain)
            for i, (d, o) in enumerate(cells):
                sel = (batch.domain == dom[d]) & (batch.masks[o] > 0)
                y = batch.labels[o][sel].double()
                ll = torch.nn.functional.binary_cross_entropy_with_logits(logits[o][sel].double(), y, reduction="sum")
                sums[i] += [float(ll), float(y.sum()), float(sel.sum())]
        total = np.array(_sum(sums.ravel().tolist())).reshape(sums.shape)
        return {f"{d}/{o}": ne_from_sums(*total[i]) for i, (d, o) in enumerate(cells)}

    def fit(self) -> bool:
        st, spec = self.state, self.spec
        while st.epoch < spec.epochs and not st.stopped:
            if not self.train_epoch(st.epoch):
                return False
            stop = st.stopped  # patience ran out at a validation inside the epoch
            if not stop:
                st.epoch_steps = st.epoch_steps or st.step_in_epoch
                stop = self.evaluate()
            val, macro = st.evals[-1]["val_ne"], st.evals[-1]["val_macro_ne"]
            loss_sum, n, secs = _sum([st.epoch_loss, st.epoch_examples, st.epoch_seconds])
            st.history.append({
                "epoch": st.epoch + 1, "train_loss": loss_sum / max(n, 1), "examples": int(n),
                "examples_per_s": n / max(secs / self.world, 1e-9), "val_ne": val, "val_macro_ne": macro,
                "steps": st.step_in_epoch,
            })
            if self.rank == 0 and spec.progress:
                print(f"[lattice] {spec.model} epoch {st.epoch + 1}: train loss {loss_sum / max(n, 1):.4f}, "
                      f"val macro NE {macro:.4f} (best {st.best_ne:.4f} at step {st.best_step}), "
                      f"{n / max(secs / self.world, 1e-9):,.0f} ex/s", flush=True)
            st.epoch += 1
            st.step_in_epoch, st.epoch_loss, st.epoch_examples, st.epoch_seconds = 0, 0.0, 0, 0.0
            self.save_checkpoint()
            if stop:
                break
        if not st.stopped:  # every planned epoch ran (an early stop wrote its reason when it happened)
            st.stop_reason = self._stop_reason()
        return True

    # ------------------------------------------------------------ outputs
    @torch.no_grad()
    def predict_split(self, split: str) -> pd.DataFrame | None:
        """Raw logits z_<objective> with labels and masks (and the generator's truth on test) of
        every row of `split`, gathered on rank 0 (other ranks get None), sorted by example_id."""
        self.model.eval()
        objs = self.config.objective_names
        rows: list[pd.DataFrame] = []
        it = iter(self.loader(split, with_truth=split == "test"))
        while True:
            batch = next(it, None)
            if not _any_have(batch, self.world):
                break
            if batch is None:  # keep joining the collectives until every rank has scored all its rows
                self.model(*D.to_device(_stand_in(self.config, self.n_dense, self.forest), self.device).inputs())
                continue
            logits = self.model(*D.to_device(batch, self.device).inputs())  # batch itself stays on the CPU
            f = {"example_id": batch.example_ids, "domain": np.array(self.config.domain_names)[batch.domain.numpy()]}
            for o in objs:
                f[f"z_{o}"] = logits[o].cpu().numpy()
                f[f"label_{o}"] = batch.labels[o].numpy()
                f[f"mask_{o}"] = batch.masks[o].numpy()
                if batch.truth is not None:
                    f[f"truth_{o}"] = batch.truth[o].numpy()
            rows.append(pd.DataFrame(f))
        part = self.dir / f"_{split}_rank{self.rank}.parquet"
        if not rows:  # a window's test day not in the table yet: an empty frame with every column
            cols = ["example_id", "domain"] + [f"{k}_{o}" for o in objs for k in ("z", "label", "mask")]
            rows = [pd.DataFrame({c: pd.Series(dtype=object if c in ("example_id", "domain") else "float32") for c in cols})]
        pd.concat(rows, ignore_index=True).to_parquet(part, index=False)
        if self.world > 1:
            dist.barrier()
        if self.rank != 0:
            return None
        parts = [self.dir / f"_{split}_rank{r}.parquet" for r in range(self.world)]
        df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
        for p in parts:
            p.unlink()
        return df.sort_values("example_id", kind="stable").reset_index(drop=True)

    def fit_calibration(self, validation: pd.DataFrame) -> dict | None:
        """The calibration stage's maps from the validation rows alone (rank 0)."""
        tr = self.config.training
        if tr.calibration == "none":
            return None
        return calibration.fit_maps(self.config, validation, tr.calibration, tr.calibration_min_positives)

    def _predictions(self, test: pd.DataFrame, stage: torch.nn.Module | None) -> pd.DataFrame:
        """predictions.parquet's columns: p_<o> through the saved model's own calibration stage,
        and raw_p_<o> (the network alone) when there is one."""
        objs = self.config.objective_names
        raw = calibration.calibrated_probabilities(self.config, test, None)
        cal = calibration.calibrated_probabilities(self.config, test, stage) if stage is not None else raw
        out = test[["example_id", "domain"]].copy()
        for o in objs:
            out[f"p_{o}"] = cal[o]
            for k in ("label", "mask", "truth"):
                if f"{k}_{o}" in test:
                    out[f"{k}_{o}"] = test[f"{k}_{o}"].to_numpy()
        if stage is not None:
            for o in objs:
                out[f"raw_p_{o}"] = raw[o]
        return out

    def finish_validation_only(self) -> dict | None:
        """`lattice tune`'s end of a trial: the best validation's figures (history.json and
        val_metrics.json); no test predictions, no model.pt, no metrics.json, so the test split is
        never read and a trial's folder never looks like a trained model to later stages."""
        st = self.state
        if self.rank != 0:
            return None
        best = next((e for e in st.evals if e["step"] == st.best_step), st.evals[-1] if st.evals else None)
        out = {"model": self.spec.model, "kind": self.kind, "split": "validation", "best_epoch": st.best_epoch,
               "best_step": st.best_step, "global_steps": st.global_step, "world_size": self.world,
               "val_macro_ne": st.best_ne, "val_ne": best["val_ne"] if best else {}, **self.stop_record()}
        (self.dir / "val_metrics.json").write_text(json.dumps(out, indent=1))
        (self.dir / "history.json").write_text(json.dumps({"epochs": st.history, "evals": st.evals, "steps": st.steps,
                                                           "stop": self.stop_record()}, indent=1))
        return {**out, "macro": {"val_ne": st.best_ne}, "cost": None}

    def _lineage(self) -> dict | None:
        """The run's lineage, with the identity of the tree fit it read leaf ids from."""
        if self.forest is None:
            return self.spec.lineage
        return {**(self.spec.lineage or {}), "trees": self.forest.fit}

    def finish(self) -> dict | None:
        if self.best is not None:
            D.copy_state(self.model.state_dict(), self.best)
        if self.spec.validation_only:
            return self.finish_validation_only()
        self.fp8.finish()
        fp8_probe = self.fp8.probe_for_blob()
        validation = self.predict_split("validation") if self.config.training.calibration != "none" else None
        test = self.predict_split("test")
        full = D.full_state_dict(self.model)
        if self.rank != 0:
            return None
        maps = self.fit_calibration(validation) if validation is not None else None
        blob = saved_blob(name=self.spec.model, kind=self.kind, n_dense=self.n_dense, stats=self.stats,
                          config=self.spec.config, state_dict=full, fitted=self.fitted, fp8_plan=self.fp8.plan,
                          fp8_probe=fp8_probe, calibration=maps,
                          plan=self.plan_json, world_size=self.world, best_epoch=self.state.best_epoch,
                          lineage=self._lineage(), leaves=self.forest.blob() if self.forest is not None else None)
        plain = rebuild(blob)  # what every later stage will load: checks the blob rebuilds
        blob["cost"] = cost = model_cost(plain, self.config, self.n_dense)
        torch.save(blob, self.dir / "model.pt")
        if self.fp8.plan is not None:
            (self.dir / "fp8_plan.json").write_text(json.dumps(self.fp8.plan, indent=1))
        # the test rows through the very calibration module the saved model runs (rebuilt above)
        stage = plain.calibration if maps is not None else None
        preds = self._predictions(test, stage)
        attach_passthrough(self.config, Path(self.spec.table), preds).to_parquet(self.dir / "predictions.parquet", index=False)
        metrics = cell_metrics(self.config, preds)
        if self.forest is not None:
            metrics["leaves"] = self.forest.fit
        if self._lineage() is not None:
            metrics["lineage"] = self._lineage()
            (self.dir / "lineage.json").write_text(json.dumps(self._lineage(), indent=1))
        metrics.update({"model": self.spec.model, "kind": self.kind, "cost": cost, "best_epoch": self.state.best_epoch,
                        "best_step": self.state.best_step, "global_steps": self.state.global_step,
                        "world_size": self.world, "test_examples": int(len(preds)), "training": self.stop_record()})
        if maps is not None:
            before = calibration.calibrated_probabilities(self.config, validation, None)
            after = calibration.calibrated_probabilities(self.config, validation, stage)
            metrics["calibration"] = calibration.summary(
                maps, calibration.effect(self.config, validation, before, after),
                calibration.effect(self.config, test, {o: preds[f"raw_p_{o}"].to_numpy() for o in self.config.objective_names},
                                   {o: preds[f"p_{o}"].to_numpy() for o in self.config.objective_names}))
        (self.dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
        (self.dir / "history.json").write_text(json.dumps({"epochs": self.state.history, "evals": self.state.evals,
                                                           "steps": self.state.steps, "stop": self.stop_record()}, indent=1))
        return metrics

    def close(self) -> None:
        torch.set_num_threads(self.threads_before)  # an in-process run leaves its caller's threads as they were
        if self.own_group and dist.is_initialized():
            dist.destroy_process_group()


def run(spec: RunSpec) -> dict:
    """Train one model on this rank; rank 0 returns the summary (others an empty dict)."""
    trainer = Trainer(spec)
    try:
        if spec.resume:
            trainer.load_checkpoint()
        elif spec.parent:
            from lattice.training.warm_start import load as warm_load

            taken = warm_load(trainer, Path(spec.parent), trainer.grown)
            if trainer.config.training.warm_dense_stats == "refit":
                fit_numeric(trainer.model, trainer.stats)  # the parent's edges came with its weights: refit them too
            if trainer.rank == 0:
                fresh = f"; fresh (not in the parent): {trainer.fresh_params}" if trainer.fresh_params else ""
                print(f"[lattice] warm start from {spec.parent}: {taken}{fresh}", flush=True)
        if not trainer.fit():
            return {"interrupted": True, "global_step": trainer.state.global_step}
        out = trainer.finish()
        if trainer.rank == 0:
            summary = {"model": spec.model, "world_size": trainer.world, "epochs_run": trainer.state.epoch,
                       "best_epoch": trainer.state.best_epoch, "best_step": trainer.state.best_step,
                       "global_steps": trainer.state.global_step, "eval_seconds": trainer.state.eval_seconds,
                       "macro": out["macro"], "cost": out["cost"], "history": trainer.state.history,
                       "evals": trainer.state.evals, "threads": trainer.threads, **trainer.stop_record()}
            (trainer.dir / "summary.json").write_text(json.dumps(summary, indent=1))
            return summary
        return {}
    finally:
        trainer.close()
