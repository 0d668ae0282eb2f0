"""How `train` starts its ranks under torchrun, and what it says when one of them dies.

Embedded profile: one `torchrun --nnodes=1 --master_addr=127.0.0.1` on this machine, as always.
Scale-out profile: `services(config).torchrun` gives nnodes, ranks per node and the c10d
rendezvous endpoint; each node runs `torchrun --nnodes N --node-rank i --rdzv-backend c10d ...`.
With `local_nodes` every node's launcher starts here (loopback "nodes", for tests and trials);
otherwise `lattice train CONFIG --node-rank i` starts node i on the machine it runs on.

torchrun ends its other ranks when one dies (`--max-restarts 0`). A rank that raises writes
torchelastic's error file (the worker's entry point is wrapped in `errors.record`) under the run's
`--log-dir`: `rank_errors` reads those files, so the error names the exception and the line that
raised it. A rank killed by a signal writes none; for it the launcher's "Root Cause" summary
(global rank, local rank, exit code) is read back by `failure_from`. Either way the message names
the rank, its node and the command that resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from lattice.relay import ENV, _kill_tree, _pump, is_terminal

# after the first node launcher fails, the others get this long to notice and exit on their own
# (a killed peer closes its sockets, so gloo fails them within seconds) before they are killed
NODE_GRACE_S = 30.0

# stderr lines kept for the failure summary: torchrun prints the other failures (a SIGKILLed rank)
# before the root cause, whose traceback from a peer's broken collective can run to a hundred
# lines; a 40-line tail once lost the killed rank that way (CI, stop 55)
SUMMARY_TAIL_LINES = 2000
_ROOT = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Launch:
    """The torchrun layout of one run."""

    nnodes: int
    nproc_per_node: int
    rdzv_endpoint: str | None  # None: embedded (master on a free loopback port)
    local_nodes: bool
    run_id: str

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc_per_node

    def command(self, spec_path: Path, node_rank: int = 0) -> list[str]:
        """Node `node_rank`'s command for the training worker of `spec_path`; its ranks' error
        files go under `error_dir(spec_path, node_rank)`."""
        return self.torchrun(node_rank, error_dir(spec_path, node_rank)) + ["-m", "lattice.training.worker", str(spec_path)]

    def torchrun(self, node_rank: int = 0, log_dir: Path | None = None) -> list[str]:
        """Node `node_rank`'s torchrun launcher and its options, without the script it runs
        (the benchmarks start their own script with the same layout)."""
        head = [sys.executable, "-m", "torch.distributed.run"]
        if log_dir is not None:
            head += ["--log-dir", str(log_dir)]
        if self.rdzv_endpoint is None:  # the embedded command of every release so far
            return head + [f"--nproc_per_node={self.nproc_per_node}", "--nnodes=1", "--master_addr=127.0.0.1",
                           f"--master_port={free_port()}"]
        opts = ["--nnodes", str(self.nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", self.rdzv_endpoint, "--rdzv-id", self.run_id,
                "--nproc-per-node", str(self.nproc_per_node), "--max-restarts", "0"]
        if self.local_nodes:
            # node 0 hosts the rendezvous store (not whichever launcher binds first) and every
            # node's workers bind to loopback
            opts += ["--rdzv-conf", f"is_host={int(node_rank == 0)}", "--local-addr", "127.0.0.1"]
        return head + opts


def auto_nproc(config) -> int:
    """`training.nproc: 0`: one rank per GPU when the run trains on CUDA, else one process (the
    ranks of a CPU machine would share its cores; see the config reference)."""
    import torch

    from lattice.training.distributed import choose_device

    if choose_device(config.training.device).type == "cuda":
        return max(1, torch.cuda.device_count())
    return 1


def layout(config, nproc: int | None, run_id: str) -> Launch:
    """The run's layout from the deployment profile; `nproc` (--nproc) sets the ranks per node
    (None or 0: the profile's, then `training.nproc`, then `auto_nproc`)."""
    from lattice.deploy.profile import ProfileError, services

    tr = services(config).torchrun
    if not services(config).scale_out:
        return Launch(1, nproc or config.training.nproc or auto_nproc(config), None, False, run_id)
    per_node = nproc or tr.nproc_per_node or config.training.nproc or auto_nproc(config)
    endpoint = tr.rdzv_endpoint or (f"127.0.0.1:{free_port()}" if tr.local_nodes or tr.nnodes == 1 else None)
    if endpoint is None:
        raise ProfileError("the scale-out profile's torchrun.rdzv_endpoint is empty: a multi-node run needs the "
                         "host:port of its c10d rendezvous (one of the nodes, reachable from all)")
    return Launch(tr.nnodes, per_node, endpoint, tr.local_nodes, run_id)


@dataclass(frozen=True)
class Failure:
    rank: int
    local_rank: int
    exitcode: int
    node: int | None

    def describe(self, per_node: int) -> str:
        node = self.node if self.node is not None else self.rank // max(per_node, 1)
        how = f"killed by signal {-self.exitcode}" if self.exitcode < 0 else f"exit code {self.exitcode}"
        return f"rank {self.rank} (node {node}, local rank {self.local_rank}) died: {how}"


ERRORS_DIR = "rank_errors"


def error_dir(spec_path: Path, node_rank: int) -> Path:
    """Where node `node_rank`'s torchrun keeps its ranks' error files for the run of `spec_path`."""
    return spec_path.parent / ERRORS_DIR / f"node{node_rank}"


@dataclass(frozen=True)
class RankError:
    """One rank's exception, from torchelastic's error file."""

    node: int
    local_rank: int
    message: str  # "ValueError: ..."
    traceback: str
    timestamp: int

    def describe(self) -> str:
        where = next((ln.strip() for ln in reversed(self.traceback.splitlines()) if ln.strip().startswith("File ")), "")
        return f"node {self.node}, local rank {self.local_rank} raised {self.message}" + (f" ({where})" if where else "")


def rank_errors(folder: Path, node: int) -> list[RankError]:
    """The error files torchrun's ranks wrote under `folder` (its --log-dir), first failure first:
    `<run>/attempt_<n>/<local rank>/error.json`."""
    found = []
    for f in sorted(Path(folder).glob("*/attempt_*/*/error.json")):
        try:
            data = json.loads(f.read_text())["message"]
            extra = data.get("extraInfo", {})
            found.append(RankError(node, int(f.parent.name), str(data["message"]), str(extra.get("py_callstack", "")),
                                   int(extra.get("timestamp", 0) or 0)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a file cut short by the kill that followed; the launcher's summary still names the rank
    return sorted(found, key=lambda e: e.timestamp)


def failure_from(tail: list[str], node: int | None = None) -> Failure | None:
    """The root-cause rank of torchrun's failure summary in `tail` (its stderr's last lines)."""
    found = [Failure(int(m[1]), int(m[2]), int(m[3]), node) for m in _ROOT.finditer("\n".join(tail))]
    return next((f for f in found if _killed_from_outside(f)), found[-1]) if found else None


def _killed_from_outside(f: Failure) -> bool:
    """Killed by a signal torchrun does not send: it SIGTERMs the survivors once one rank dies,
    and may then list a survivor as the root cause; an OOM kill or a SIGKILL died first."""
    return f.exitcode < 0 and -f.exitcode != signal.SIGTERM


def pick(failures: list[Failure]) -> Failure | None:
    """The rank that died first in spirit: one killed by a signal over one that failed because a
    peer vanished (which exits with 1 from the broken collective)."""
    return next((f for f in failures if _killed_from_outside(f)),
                next((f for f in failures if f.exitcode < 0), failures[0] if failures else None))


class RankFailed(RuntimeError):
    """A torchrun rank died; the message names it and how to resume."""

    def __init__(self, model: str, launch: Launch, failure: Failure | None, code: int, resume: str, detail: str = "",
                 error: RankError | None = None):
        self.model, self.launch, self.failure, self.code, self.resume = model, launch, failure, code, resume
        self.error = error
        killed = failure is not None and failure.exitcode < 0
        # the rank's own exception, from its error file; a rank killed by a signal wrote none, and
        # the exceptions of its peers (a broken collective) follow from it, so it is named instead
        if error is not None and not killed:
            who = error.describe()
        else:
            who = failure.describe(launch.nproc_per_node) if failure else "a rank failed (see the rank logs above)"
        super().__init__(f"torchrun training of {model!r} on {launch.world} ranks ({launch.nnodes} node(s)) failed "
                         f"(exit {code}): {who}. Resume from the last checkpoint with: {resume}{detail}")


def resume_command(config, model: str, nproc: int | None, epochs: int | None, workdir: Path | None) -> str:
    """`lattice train CONFIG --model M --resume [...]` for this run (the CLI passes its own argv
    instead, so `--set` overrides carry over)."""
    cmd = ["lattice", "train", config.source_file or "CONFIG", "--model", model, "--resume"]
    if nproc:
        cmd += ["--nproc", str(nproc)]
    if epochs:
        cmd += ["--epochs", str(epochs)]
    if workdir is not None:
        cmd += ["--workdir", str(workdir)]
    return shlex.join(cmd)


def _tee(stream, tail: deque[str]) -> None:
    for line in stream:
        sys.stderr.write(line)
        tail.append(line.rstrip("\n"))


def run_nodes(cmds: list[list[str]], env: dict[str, str], log: logging.Logger,
              tail_lines: int = SUMMARY_TAIL_LINES) -> list[tuple[int, list[str]]]:
    """Run every node's launcher here at once; returns (exit code, stderr tail) per node. When
    one fails the others get NODE_GRACE_S to exit, then their process trees are killed, so no
    rank is left behind."""
    relayed = not is_terminal(sys.stderr)
    procs, tails, pumps = [], [], []
    for i, cmd in enumerate(cmds):
        tail: deque[str] = deque(maxlen=tail_lines)
        if relayed:  # as lattice.relay.run_child: each line through logging at its own level
            p = subprocess.Popen(cmd, env={**env, ENV: "1", "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
            node_log = log.getChild(f"node{i}")
            pumps += [threading.Thread(target=_pump, args=(p.stdout, node_log, logging.INFO, None), daemon=True),
                      threading.Thread(target=_pump, args=(p.stderr, node_log, logging.WARNING, tail), daemon=True)]
        else:  # a terminal sees the ranks as they write; stderr is copied for the failure summary
            p = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
            pumps.append(threading.Thread(target=_tee, args=(p.stderr, tail), daemon=True))
        procs.append(p)
        tails.append(tail)
    for t in pumps:
        t.start()
    deadline = None
    try:
        while any(p.poll() is None for p in procs):
            if deadline is None and any(p.returncode not in (None, 0) for p in procs):
                deadline = time.monotonic() + NODE_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        _kill_tree(p)
            time.sleep(0.2)
    except BaseException:
        for p in procs:
            _kill_tree(p)
        raise
    for t in pumps:
        t.join(timeout=5)
    return [(p.returncode, list(t)) for p, t in zip(procs, tails)]
