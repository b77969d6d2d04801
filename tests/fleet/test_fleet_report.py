"""A box's GPU report never holds up its lease (docs/fleet.md): a real daemon on a real PostgreSQL whose
report probe hangs (an NVML call stuck, as its first init may be for up to a minute) keeps renewing its
lease every third of a lease, and publishes the reading once the probe answers. Before, the reading was
taken inside the renewal: a hung probe stopped the renewals and got the box declared lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fleet.helpers import ROOT

SCRIPT = r'''
import json, sys, threading, time
from pathlib import Path
from babysit.core.readings import GpuReading, GpuView
from babysit.service.daemon import Daemon
from babysit.db.postgres import PostgresStore
from babysit.channels.notify import ConsoleChannel
from babysit.probes.gpu import NullGpuProbe

root, url = Path(sys.argv[1]), sys.argv[2]
release = threading.Event()

class Hung:
    def sample(self): pass
    def close_window(self, window): pass
    def close(self): pass
    def read(self, indices, window="guard"):
        release.wait(30)  # stuck, until the test lets it answer
        return GpuView(True, None, (GpuReading(0, "Stuck H100", "GPU-stuck-0", 50.0, 1, 1, 2, (), ()),))

d = Daemon(root / "babysit.toml", gpu_probe=NullGpuProbe(), channel=ConsoleChannel(root / ".babysit", None),
           report_probe=Hung)
d.start()
store = PostgresStore(url, host="watcher")
def host():
    return next(h for h in store.hosts() if h.name == "box-h")
try:
    time.sleep(0.5)
    first = host().renewed_at
    time.sleep(3.0)  # six renewals due, the probe stuck throughout
    stuck = host()
    release.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not host().info.get("gpus"):
        time.sleep(0.1)
    print("RESULT " + json.dumps({"renewed_for_s": stuck.renewed_at - first, "lost": stuck.lost_at,
                      "info_while_stuck": stuck.info, "info_after": host().info}))
finally:
    release.set()
    store.close()
    d.shutdown()
'''


def test_a_hung_gpu_report_never_holds_up_the_lease(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "babysit.toml").write_text(f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-h"\nlease_seconds = 1.5\n')
    (tmp_path / "probe.py").write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(tmp_path), pg_url], cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    seen = json.loads(line.removeprefix("RESULT "))
    assert seen["renewed_for_s"] > 2.0, seen  # renewed all along (every 0.5 s); before: stuck in the probe
    assert seen["lost"] is None and "gpus" not in seen["info_while_stuck"], seen
    assert [g["name"] for g in seen["info_after"]["gpus"]["gpus"]] == ["Stuck H100"], seen
