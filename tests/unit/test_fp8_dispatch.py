"""FP8 dispatch: finding and probing sites, the plan (threshold, order, speed filter, JSON),
applying it, a tiny model training through FP8 sites, and `lattice fp8 plan`."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lattice.fp8.dispatch import (CPU_SPEED_FILTER, all_reduce_probes, apply_plan, attach_probes, find_sites,
                                  load_probe_state, make_plan, plan_table, probe_state)
from lattice.fp8.gemm import fp8_linear, fp8_mm

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ["e4m3_tensor", "e4m3_row", "mx_block32"]


pytestmark = pytest.mark.usefixtures("one_thread")


class FakeLinear(nn.Module):
    """The smallest weight site: nn.Linear's maths with the site attributes."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, k) / k**0.5)  # (N, K)
        self.bias = nn.Parameter(torch.zeros(n))
        self.recipe, self.backward, self.probe, self.site_name = None, "e5m2", None, ""

    def weight_matrix(self) -> torch.Tensor:
        return self.weight

    def gemm_shape(self) -> tuple[int, int]:
        return self.weight.shape[1], self.weight.shape[0]

    def flops_per_row(self) -> int:
        k, n = self.gemm_shape()
        return 2 * k * n

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        if self.probe is not None and self.training:
            self.probe.observe(x.reshape(-1, x.shape[-1]).detach())
        if self.recipe is None:
            return F.linear(x, self.weight, self.bias)
        return fp8_linear(x, self.weight, self.bias, self.recipe, self.backward)


class FakePair(nn.Module):
    """An activation x activation site: a (M, K) @ b (N, K)^T."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.k, self.n = k, n
        self.recipe, self.backward, self.probe, self.site_name = None, "e5m2", None, ""

    def weight_matrix(self) -> None:
        return None

    def gemm_shape(self) -> tuple[int, int]:
        return self.k, self.n

    def flops_per_row(self) -> int:
        return 2 * self.k * self.n

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.probe is not None and self.training:
            self.probe.observe(a.detach(), b.detach())
        return a @ b.t() if self.recipe is None else fp8_mm(a, b, self.recipe, self.backward)


class Net(nn.Module):
    """Three sites: an ordinary layer, one fed activations with a large shared offset and a
    weight that cancels it (FP8 cannot do it), and a pair site."""

    def __init__(self):
        super().__init__()
        self.inp = FakeLinear(16, 32)
        self.offset = FakeLinear(32, 8)
        with torch.no_grad():
            self.offset.weight -= self.offset.weight.mean(1, keepdim=True)  # rows sum to 0
        self.pair = FakePair(8, 4)
        self.keys = nn.Parameter(torch.randn(4, 8))
        self.out = nn.Linear(4, 1)  # not a site

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 16) -> (B,)
        h = torch.relu(self.inp(x))  # (B, 32)
        h = self.offset(20.0 + 0.01 * h)  # (B, 8): offset 20, spread 0.01
        return self.out(self.pair(h, self.keys)).squeeze(-1)


def _fp8_config(**kw):
    base = dict(recipes=RECIPES, backward="e5m2", max_relative_error=0.05, min_speedup=1.05)
    return SimpleNamespace(**{**base, **kw})


def _probed_net(seed: int = 0, steps: int = 3) -> Net:
    torch.manual_seed(seed)
    net = Net()
    attach_probes(net, every=1)
    net.train()
    for _ in range(steps):
        net(torch.randn(256, 16))
    return net


def test_find_sites_names_every_site_in_module_order() -> None:
    net = Net()
    sites = find_sites(net)
    assert list(sites) == ["inp", "offset", "pair"]
    assert [s.site_name for s in sites.values()] == ["inp", "offset", "pair"]


def test_probes_learn_while_training_only_and_roundtrip_through_a_checkpoint() -> None:
    net = _probed_net(steps=2)
    net.eval()
    net(torch.randn(64, 16))  # eval: no statistics
    assert net.inp.probe.a.count == 512 and net.pair.probe.b.count == 8
    all_reduce_probes(net)  # no process group: a no-op
    buf = io.BytesIO()
    torch.save(probe_state(net), buf)
    fresh = Net()
    fresh.load_state_dict(net.state_dict())
    load_probe_state(fresh, torch.load(io.BytesIO(buf.getvalue())))
    assert make_plan(fresh, _fp8_config()) == make_plan(net, _fp8_config())
    with pytest.raises(KeyError, match="lacks.*'nope'"):
        load_probe_state(fresh, {"nope": probe_state(net)["inp"]})


def _expected_choice(row: dict, recipes: list[str], thr: float) -> str:
    return next((r for r in recipes if row["mere"][r]["learned"] < thr), "fp32")


@pytest.mark.parametrize("thr", [1e-4, 0.03, 0.05, 0.2, 10.0])
def test_plan_takes_the_first_recipe_below_the_threshold_and_never_one_above(thr) -> None:
    net = _probed_net()
    plan = make_plan(net, _fp8_config(max_relative_error=thr))
    json.loads(json.dumps(plan))  # JSON-able
    assert plan["version"] == 1 and plan["speed_filter"] == CPU_SPEED_FILTER
    for row in plan["sites"]:
        assert row["choice"] == _expected_choice(row, RECIPES, thr), row
        if row["choice"] != "fp32":
            assert row["mere"][row["choice"]]["learned"] < thr
    shares = {r["site"]: r["flops_share"] for r in plan["sites"]}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert plan["fp8_flops_share"] == pytest.approx(sum(shares[r["site"]] for r in plan["sites"] if r["choice"] != "fp32"))


def test_learned_statistics_expose_the_offset_site_random_inputs_do_not() -> None:
    plan = make_plan(_probed_net(), _fp8_config())
    rows = {r["site"]: r for r in plan["sites"]}
    off = rows["offset"]["mere"]
    assert all(off[r]["learned"] > 0.5 and off[r]["random"] < 0.06 for r in RECIPES), off
    assert rows["offset"]["choice"] == "fp32" and rows["inp"]["choice"] == "e4m3_tensor"
    assert rows["inp"]["backward_mere"] is not None and 0 < rows["inp"]["backward_mere"] < 0.15
    table = plan_table(plan)
    assert "offset" in table and "fp32" in table and "learned/random" in table


def test_recipe_order_is_the_configs() -> None:
    plan = make_plan(_probed_net(), _fp8_config(recipes=["mx_block32", "e4m3_tensor"]))
    assert {r["site"]: r["choice"] for r in plan["sites"]}["inp"] == "mx_block32"


def test_cuda_plan_needs_the_speedup_too() -> None:
    net = _probed_net()
    plan = make_plan(net, _fp8_config(max_relative_error=0.2), speedups={"inp": 1.01, "pair": 2.0}, device="cuda")
    choice = {r["site"]: r["choice"] for r in plan["sites"]}
    assert choice["inp"] == "fp32" and choice["pair"] != "fp32" and choice["offset"] == "fp32"
    assert "speed-up 1.01" in {r["site"]: r["reason"] for r in plan["sites"]}["inp"]
    # per recipe: the speed-up of the recipe the site would take is the one that counts
    plan = make_plan(net, _fp8_config(max_relative_error=0.2), speedups={"inp": {"e4m3_tensor": 3.0, "e4m3_row": 1.0}},
                     device="cuda")
    assert {r["site"]: r["choice"] for r in plan["sites"]}["inp"] == "e4m3_tensor"


def test_apply_plan_sets_sites_and_rejects_a_plan_for_another_model() -> None:
    plan = make_plan(_probed_net(), _fp8_config(backward="bf16"))
    net = Net()
    assert apply_plan(net, plan) == {r["site"]: r["choice"] for r in plan["sites"]}
    assert net.inp.recipe == "e4m3_tensor" and net.inp.backward == "bf16" and net.offset.recipe is None
    bad = json.loads(json.dumps(plan))
    bad["sites"].append({**bad["sites"][0], "site": "decoder.fc"})
    with pytest.raises(KeyError, match="lacks.*decoder.fc"):
        apply_plan(net, bad)
    bad = json.loads(json.dumps(plan))
    bad["sites"][0]["shape"] = [99, 3]
    with pytest.raises(ValueError, match="shape"):
        apply_plan(net, bad)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_tiny_model_trains_through_fp8_sites(recipe) -> None:
    """Classification through two FP8 linear sites (e5m2 backward): the loss falls to under a
    fifth, close to the FP32 run's from the same start, and the FP8 run really differs from it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).float()  # (256,)

    def run(r: str | None) -> tuple[list[float], nn.Module]:
        torch.manual_seed(1)
        model = nn.Sequential(FakeLinear(16, 32), nn.ReLU(), FakeLinear(32, 1))
        for m in find_sites(model).values():
            m.recipe = r
        opt = torch.optim.Adam(model.parameters(), lr=2e-2)
        losses = []
        for _ in range(60):
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    fp8, m8 = run(recipe)
    fp32, m32 = run(None)
    assert fp8[-1] < fp8[0] / 5
    assert fp8[-1] < 1.5 * fp32[-1] + 0.02
    assert not torch.equal(m8[0].weight, m32[0].weight)


def test_cli_plan_writes_the_json_and_explains_missing_statistics(tmp_path, monkeypatch, capsys) -> None:
    import lattice.models.saved as saved_mod
    from lattice.cli import main

    net = _probed_net()
    blob = {"fp8_probe": probe_state(net)}
    model_dir = tmp_path / "models" / "teacher"
    model_dir.mkdir(parents=True)

    def fake_load_saved(path):
        assert Path(path) == model_dir
        fresh = Net()
        fresh.load_state_dict(net.state_dict())
        return SimpleNamespace(model=fresh, blob=blob, path=model_dir / "model.pt")

    monkeypatch.setattr(saved_mod, "load_saved", fake_load_saved)
    cfg = str(ROOT / "configs" / "demo.yaml")
    assert main(["fp8", "plan", cfg, "--model", "teacher", "--workdir", str(tmp_path)]) == 0
    plan = json.loads((model_dir / "fp8_plan.json").read_text())
    assert [r["site"] for r in plan["sites"]] == ["inp", "offset", "pair"]
    assert "offset" in capsys.readouterr().out
    blob.clear()
    assert main(["fp8", "plan", cfg, "--model", "teacher", "--workdir", str(tmp_path)]) == 1
    assert "fp8.enabled=true" in capsys.readouterr().err
