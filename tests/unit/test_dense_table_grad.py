"""A data-parallel table (fbgemm's dense CPU kernel, the plan's choice for small tables) gets the
same gradient as a plain nn.EmbeddingBag: PyTorch warns that the op has no Autograd kernel, and
lattice.training.distributed silences that warning on the strength of this check."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from lattice.training import distributed as D

    torch.manual_seed(0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = EmbeddingBagCollection(device=torch.device("meta"), tables=[
                EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=6, feature_names=["f"])])
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, kjt):
            return (self.lin(self.ebc(kjt)["f"]).squeeze(1) * torch.tensor([1.0, -2.0, 3.0])).sum()

    net = Net()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints={"t": ParameterConstraints(sharding_types=["data_parallel"])}
                                    ).collective_plan(net, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)
    assert plan.plan["ebc"]["t"].sharding_type == "data_parallel", plan
    model = D.wrap(net, plan)
    params = dict(model.named_parameters())
    table = params["ebc.embedding_bags.t.weight"]
    lin_w, lin_b = params["lin.weight"], params["lin.bias"]

    # bags: [1, 3], [], [3, 5, 5]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=torch.tensor([1, 3, 3, 5, 5]), lengths=torch.tensor([2, 0, 3]))
    model(kjt).backward()

    ref_table = table.detach().clone().requires_grad_(True)
    bag = torch.nn.functional.embedding_bag(torch.tensor([1, 3, 3, 5, 5]), ref_table, torch.tensor([0, 2, 2]), mode="sum")
    ((bag @ lin_w.detach().t() + lin_b.detach()).squeeze(1) * torch.tensor([1.0, -2.0, 3.0])).sum().backward()

    assert table.grad is not None, "no gradient reached the data-parallel table"
    torch.testing.assert_close(table.grad, ref_table.grad)
    assert table.grad[[0, 2, 4]].abs().sum() == 0 and table.grad[5].abs().sum() > 0
    print("ok")
    """
)


def test_data_parallel_table_gets_the_plain_embedding_bag_gradient():
    # A separate process: the test process must not hold a process group of its own.
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-4000:]
    assert "an autograd kernel was not registered" not in out.stderr, "the benign fbgemm warning is shown again"
