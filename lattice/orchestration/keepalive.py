"""`python -m lattice.orchestration.keepalive CMD...`: run CMD and start it again whenever it exits.

Airflow's scheduler, dag-processor and triggerer exit when their metadata database goes away
(a PostgreSQL restart); on a cluster a service manager brings them back. On loopback this small
loop does: it restarts the command after a short back-off and stops when it gets SIGTERM or
SIGINT, passing the signal on first. The command inherits this process's environment (secrets
stay off the command line).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

BACKOFF_S = (2, 5, 10, 20)


def main(cmd: list[str]) -> int:
    stopping = False
    child: subprocess.Popen | None = None

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    restarts = 0
    while True:
        started = time.monotonic()
        child = subprocess.Popen(cmd)
        code = child.wait()
        if stopping:
            return code
        if time.monotonic() - started > 120:
            restarts = 0  # it ran fine for a while: this is a new outage, not a crash loop
        delay = BACKOFF_S[min(restarts, len(BACKOFF_S) - 1)]
        print(f"keepalive: {cmd[1] if len(cmd) > 1 else cmd[0]} exited with {code}; restarting in {delay} s",
              file=sys.stderr, flush=True)
        restarts += 1
        time.sleep(delay)
        if stopping:
            return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
