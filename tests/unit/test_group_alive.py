"""A component started in its own session is gone once its group is gone, including when this
process started it and never waited for it (the exited leader would otherwise stay a zombie member
of its group, and every stop waited out its whole timeout)."""

from __future__ import annotations

import signal
import subprocess
import time

from lattice.orchestration.airflow_env import group_alive


def test_an_exited_leader_we_started_is_not_alive() -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    pid = proc.pid
    assert group_alive(pid)
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(pid)


def test_a_group_whose_leader_exited_is_alive_while_a_member_runs() -> None:
    # the leader starts a member in its group and exits: the group lives on in the member
    proc = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!"], start_new_session=True, stdout=subprocess.PIPE, text=True)
    member = int(proc.stdout.readline())
    proc.wait(timeout=10)
    try:
        assert group_alive(proc.pid)
    finally:
        subprocess.run(["kill", str(member)], check=False)
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(proc.pid)
