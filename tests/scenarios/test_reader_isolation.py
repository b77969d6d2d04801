"""One run's log never blinds the other runs' guards (issue 32): beside a run whose pattern backtracks
catastrophically in Python's `re` and a run that floods its stdout faster than babysit reads it, a
run that stalls after 5 records is stopped within its stall limit plus one guard interval, the
flooding run's reader says it is behind (nothing dropped), and `babysit up` stops at once on SIGTERM
while that run is still being read.

Before: the bad pattern's 40 `a`s took 314 s in one run's check; every guard round meanwhile was
skipped and the stalled neighbour was stopped 57 s after its last record instead of ~5 s."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from babysit.db.store import Store
from tests.scenarios.conftest import PY, Daemon
from tests.support import register, run_toml, stdout_source, wait_for

STALL_MINUTES = 5  # 5 s under --accelerated
GUARD_SECONDS = 0.5  # the default 30 s guard interval, accelerated
# ~300 MB in a few seconds, begun once the other checks are done (the gate): the reader-behind incident comes
# ~2 s in and the SIGTERM at once, far before babysit has read it all on 2 cores quiet or loaded (begun with
# the daemon, 1.5 M and then 3 M lines were all read by the SIGTERM ~8 s in, on a quiet box)
FLOOD_LINES = 3_000_000

STALLS = """
import time
for i in range(1, 6):
    print(f"iter {i}: loss {1 / i:.4f}", flush=True)
    time.sleep(0.1)
time.sleep(600)
"""
BACKTRACKS = """
import time
for i in range(120):  # log-unreadable needs 100 lines and 5 declared minutes
    print("a" * 40 + "b", flush=True)  # (a|aa)+$ tries every split of the a's in re: ~1.6^40 paths
time.sleep(600)
"""
FLOODS = f"""
import os, sys, time
print("iter 0: loss 3.0000, waiting for the gate", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
w = sys.stdout.write
for i in range(1, {FLOOD_LINES} + 1):
    w(f"iter {{i}}: loss {{3 + (i % 1000) / 1000:.4f}}, time 1.00ms, mfu 1.20%, tokens/s 123456.7, lr 3e-4\\n")
sys.stdout.flush()
time.sleep(600)
"""


def register_printer(root: Path, name: str, program: str, regex: str, stall_minutes: int, *args: str) -> None:
    register(root, run_toml(name, [PY, "-c", program, *args], source=stdout_source(regex), poll=(1, 1),
                            guards={"min_free_host_ram_gib": 0.1, "stall_minutes": stall_minutes,
                                    "stop_grace_seconds": 5}))


def test_a_pathological_pattern_and_a_flooding_run_leave_a_stalled_neighbour_stopped_on_time(
        workspace: Path) -> None:
    register_printer(workspace, "backtracks", BACKTRACKS, "^(?P<step>(a|aa)+)$", stall_minutes=60)
    gate = workspace / "flood.go"
    register_printer(workspace, "floods", FLOODS, r"iter (?P<step>\d+): loss (?P<loss>[-+.\w]+)", 60, str(gate))
    register_printer(workspace, "stalls", STALLS, r"iter (?P<step>\d+): loss (?P<loss>[-+.\w]+)", stall_minutes=STALL_MINUTES)
    daemon = Daemon(workspace, "--no-view", "--gpu-probe", "none")
    store = Store.in_dir(workspace / ".babysit")
    try:
        stalled = wait_for("the stall", lambda: [i for i in store.incidents("stalls") if i.kind == "stalled"], 90)[0]
        last_record = max(json.loads(line)["ts"] for line in
                          (workspace / ".babysit" / "runs" / "stalls" / "records.jsonl").read_text().splitlines())
        late = stalled.at - last_record
        # its limit plus one guard interval, plus the reading interval and a second of a loaded 2-core box
        assert late <= STALL_MINUTES + GUARD_SECONDS + 1.5, late
        unreadable = wait_for("the bad pattern's incident",
                              lambda: [i for i in store.incidents("backtracks") if i.kind == "log-unreadable"], 60)[0]
        assert unreadable.body["records_parsed"] == 0 and unreadable.body["lines_seen"] >= 100
        gate.touch()  # the flood now
        behind = wait_for("the flooding run's reader-behind incident",
                          lambda: [i for i in store.incidents("floods") if i.kind == "reader-behind"], 60)[0]
        assert behind.body["unread_bytes"] > 0 and behind.body["unread_lines"] > 0, behind.body
        assert behind.body["behind_seconds"] >= 2 and behind.body["source"]["kind"] == "stdout", behind.body
        read = store.run_state("floods")[1]["source"]["lines"]
        assert read < FLOOD_LINES, read  # still reading the flood: SIGTERM now
        t0 = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, daemon.output()
        took = time.monotonic() - t0
        assert took < 15, (took, daemon.output()[0][-3000:])  # the chunk in hand and a round, never the flood
    finally:
        if daemon.proc.poll() is None:
            daemon.kill9()
        store.close()
