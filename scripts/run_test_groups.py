"""The whole test suite as a few pytest processes at once (``scripts/run-tests.sh``).

Much of the suite waits (JVMs and Spark Connect servers starting, a loopback cluster,
CLI processes starting, processes killed and restarted), so independent groups share
the 2 cores well: the suite took 36 min as one process.

Invariants:

- Every test is in exactly one group, by construction: E2E_DIRS are split by the
  ``cluster`` marker (the cluster half of ``tests/e2e``, and the rest), SERVICE_DIRS
  form one group, and ``main`` is everything else under ``tests/`` (the others
  ignored), so a new test file or folder runs somewhere without being listed here.
- Each group is one ``pytest --durations=25`` process with the stores, ports and temp
  directories the fixtures already make unique per process (PostgreSQL schemas and
  databases named by pid and uuid, free ports, ``tmp_path``).
- Its output is printed as it comes, each line prefixed with ``[group]``, and kept in
  ``LOGDIR/group.log``. At the end: each group's result line with its wall and CPU
  time (CPU near wall: the group computes; far below: it waits, so it can share), the
  25 slowest of all, and one total line ``tests: N passed, M failed`` (errors counted
  as failed).
- The exit status is 0 only when every group exited 0: a failed or erroring test, an
  interrupted run, or a group that ran no test (pytest's 5) fails the run.
- SIGTERM or SIGINT reaches every group as one SIGINT, so fixtures still stop what
  they started (clusters, servers); a group still running 60 s later is killed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

# Four groups of about equal length. Measured as four (wall s / CPU s of the pytest
# process and what it waited for, beside other work on 2 cores): cluster 1505/483, e2e
# 1372/409, services 1686/528 and main 1543/484 with tests/faults among the services,
# so the faults (processes killed, PostgreSQL restarted: mostly waiting) moved to e2e.
E2E_DIRS = ["tests/e2e", "tests/faults"]
SERVICE_DIRS = ["tests/spark", "tests/dagster", "tests/cluster", "tests/persist",
                "tests/landing", "tests/security"]
GROUPS: dict[str, list[str]] = {
    "cluster": [*E2E_DIRS, "-m", "cluster"],
    "e2e": [*E2E_DIRS, "-m", "not cluster"],
    "services": SERVICE_DIRS,
    "main": ["tests", *(f"--ignore={d}" for d in [*E2E_DIRS, *SERVICE_DIRS])],
}
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--durations=25"]
DURATION = re.compile(r"^\d+\.\d+s (call|setup|teardown) ")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")
GRACE_S = 60
EXIT_CODES = {1: "tests failed", 2: "interrupted", 3: "internal error", 4: "usage error",
              5: "no test ran"}

print_lock = threading.Lock()


def _pump(name: str, proc: subprocess.Popen[str], log: Path) -> None:
    assert proc.stdout is not None
    with open(log, "w") as out:
        for line in proc.stdout:
            out.write(line)
            with print_lock:
                sys.stdout.write(f"[{name}] {line}")
                sys.stdout.flush()


def _counts(log: Path) -> dict[str, int]:
    """The counts in pytest's last summary line (``== 3 passed, 1 failed in 2s ==``)."""
    lines = [line for line in log.read_text().splitlines() if line.startswith("=")]
    found: dict[str, int] = {}
    for number, kind in COUNT.findall(lines[-1] if lines else ""):
        found[kind.rstrip("s") if kind.startswith("error") else kind] = int(number)
    return found


def main() -> int:
    logdir = Path(tempfile.mkdtemp(prefix="upsert-tests-"))
    print(f"[tests] {len(GROUPS)} pytest processes at once; logs in {logdir}", flush=True)
    started = time.monotonic()
    procs: dict[str, subprocess.Popen[str]] = {}
    pumps: list[threading.Thread] = []

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        print(f"[tests] signal {signum}: stopping every group", flush=True)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + GRACE_S
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        sys.exit(128 + signum)

    # SUBTLE: installed before the groups start: a signal this process catches is SIG_DFL
    # in its children, so pytest turns SIGINT into KeyboardInterrupt even when this
    # process was started with SIGINT ignored (as ``cmd &`` in a script does).
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    for name, args in GROUPS.items():
        # A process group of its own: a terminal's Ctrl-C reaches the group once, from
        # interrupt() (a second SIGINT would cut pytest's teardown short).
        proc = subprocess.Popen([*PYTEST, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, encoding="utf-8",
                                errors="replace", bufsize=1, process_group=0)
        procs[name] = proc
        pump = threading.Thread(target=_pump, args=(name, proc, logdir / f"{name}.log"))
        pump.start()
        pumps.append(pump)
    finished: dict[str, float] = {}
    cpu: dict[str, float] = {}  # user + system seconds of the group and what it waited for
    while len(finished) < len(procs):
        for name, proc in procs.items():
            if name in finished:
                continue
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                finished[name] = time.monotonic() - started
                cpu[name] = usage.ru_utime + usage.ru_stime
        time.sleep(0.5)
    for pump in pumps:
        pump.join()

    total: dict[str, int] = {}
    durations: list[tuple[float, str]] = []
    print(f"[tests] ===== {len(GROUPS)} groups, logs in {logdir}", flush=True)
    for name, proc in procs.items():
        log = logdir / f"{name}.log"
        counts = _counts(log)
        for kind, number in counts.items():
            total[kind] = total.get(kind, 0) + number
        for line in log.read_text().splitlines():
            if DURATION.match(line):
                durations.append((float(line.split("s", 1)[0]), f"[{name}] {line}"))
        shown = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no result line"
        print(f"[tests] {name}: exit {proc.returncode} after {finished[name]:.0f} s, "
              f"{cpu[name]:.0f} s of CPU ({shown})")
    print("[tests] slowest 25 of all groups:")
    for _, line in sorted(durations, reverse=True)[:25]:
        print(f"[tests]   {line}")
    print(f"[tests] wall time {time.monotonic() - started:.0f} s")
    for name, proc in procs.items():
        if proc.returncode != 0:
            why = EXIT_CODES.get(proc.returncode, "pytest did not finish")
            print(f"[tests] FAILED: group {name} exited {proc.returncode} ({why})")
    print(f"tests: {total.get('passed', 0)} passed, "
          f"{total.get('failed', 0) + total.get('error', 0)} failed", flush=True)
    return next((proc.returncode for proc in procs.values() if proc.returncode != 0), 0)


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parents[1])
    sys.exit(main())
