"""The web runs page with 1,000 runs in the store: how long `GET /` takes (target ≤ 300 ms).

  python bench/web_page.py                    # 1,000 runs, 600-record logs (~1 min to build here)
  python bench/web_page.py --runs 200 --n 10  # quicker

Builds a workspace the way a daemon leaves one after weeks: N registered runs (every run.toml with a
[prereg]), each with a 600-record log on disk, one or two attempts, polls, incidents, outbox rows and a
verdict read in the store (written through babysit's Store). Then starts the real `babysit web` as a
subprocess and times whole HTTP requests from this process (connect, read, render, transfer): the
first `GET /` (cold: every run.toml parsed, every log tail read) and then --n more (warm), `GET
/metrics`, and one run's page. The naive way beside it: `babysit status --json` (the same rows, one
look by a fresh process).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, emit, fmt_us, log_line, summary, time_calls

RUN_TOML = """[run]
name = "{name}"
workdir = ".."
command = ["python", "-m", "trainer", "--recipe", "tiny", "--steps", "{steps}"]
log = "outputs/{{name}}/train_log.jsonl"
gpus = [0]

[guards]
gpu_hours_cap = 10.0

[prereg]
question = "Does the eval loss climb after step 200?"
metric = "eval_loss"
baseline_step = 200
read_step = 500
[[prereg.bands]]
label = "HEALTHY"
max = 0.0
[prereg.otherwise]
label = "CLIMB"
"""


def build(root: Path, runs: int, records: int) -> Path:
    from babysit.core.snapshot import Snapshot
    from babysit.core.spec.run_toml import load_spec
    from babysit.db.store import Store
    from babysit.runtime import registry

    t0 = time.time() - 86400
    names = [f"run{i:04d}" for i in range(runs)]
    sha = None
    for name in names:
        spec = root / "runs" / f"{name}.toml"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(RUN_TOML.format(name=name, steps=records))
        log = root / "outputs" / name / "train_log.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"".join(log_line(s, t0 + s, eval_every=100) for s in range(1, records + 1)))
        sha = sha or load_spec(spec).prereg.sha256
    reg = registry.Registry(path=root / "babysit.toml", runs=tuple(
        registry.RunEntry(name=n, spec=f"runs/{n}.toml", registered_at="2026-12-01T00:00:00Z", prereg_sha256=sha)
        for n in names))
    (root / "babysit.toml").write_text(registry.dumps(reg))
    store = Store.in_dir(root / ".babysit")
    for i, name in enumerate(names):
        a = store.begin_attempt(name, 1, "default", ["python", "-m", "trainer"], "local", 1, "/tmp/a", t0)
        store.mark_running(a.id, started_at=t0)
        polled = Snapshot.from_dict({"step": 300, "gpus": [{"index": 0, "util_pct": 90.0}]})
        store.record_poll(name, 1, t0 + 300, "poll", polled, None, {"run": name})
        store.add_incident(name, 1, t0 + 400, "input-starvation", {"util_pct": 12})
        if i % 10 == 0:  # a live run
            store.set_run_state(name, "running", t0 + 500, step=records)
            store.save_verdict(name, {"run": name, "status": "PROVISIONAL", "at_step": 300, "label": "HEALTHY",
                                      "delta": -0.01}, t0 + 500, final=False)
        else:
            store.mark_ended(a.id, ended_at=t0 + 3600, outcome="completed", exit_code=0)
            store.set_run_state(name, "finished", t0 + 3600)
            store.save_verdict(name, {"run": name, "status": "FINAL", "at_step": 500, "label": "CLIMB",
                                      "delta": 0.02}, t0 + 3600, final=True)
    store.close()
    return root / "babysit.toml"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--records", type=int, default=600, help="records in each run's log")
    p.add_argument("--n", type=int, default=20, help="warm requests timed per page")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="babysit-bench-web-"))
    t = time.perf_counter()
    registry_path = build(root, args.runs, args.records)
    built = time.perf_counter() - t
    server = subprocess.Popen([sys.executable, "-m", "babysit", "web", "--port", "0", "--registry", str(registry_path)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://\S+/", server.stdout.readline()).group(0)

        def get(path: str) -> bytes:
            with urllib.request.urlopen(url + path, timeout=60) as r:
                return r.read()

        cold = time_calls(lambda: get(""), 1)
        size = len(get(""))
        warm = time_calls(lambda: get(""), args.n)
        scrape = time_calls(lambda: get("metrics"), args.n)
        one = time_calls(lambda: get("run/run0001"), max(3, args.n // 4))
        naive = time_calls(lambda: subprocess.run([sys.executable, "-m", "babysit", "status", "--json", "--registry",
                                                   str(registry_path)], cwd=REPO, capture_output=True, check=True), 3)
    finally:
        server.terminate()
        server.wait(timeout=30)
    s_warm, s_scrape, s_one, s_naive = summary(warm), summary(scrape), summary(one), summary(naive)
    rows = [
        ["`GET /` first (cold: every run.toml and log tail read)", fmt_us(cold[0] * 1e6), "—"],
        [f"**`GET /` warm** (median of {args.n}; p90)", f"**{fmt_us(s_warm['median_us'])}** "
                                                        f"({fmt_us(s_warm['p90_us'])})",
         fmt_us(s_naive["median_us"]) + " (`babysit status --json`, a fresh process)"],
        [f"`GET /metrics` (median of {args.n})", fmt_us(s_scrape["median_us"]), "—"],
        ["`GET /run/NAME` (median)", fmt_us(s_one["median_us"]), "—"],
    ]
    emit(f"web runs page, {args.runs} runs", ["request", "ours", "naive"], rows,
         {"runs": args.runs, "records": args.records, "build_s": built, "page_bytes": size, "cold_s": cold[0],
          "warm": s_warm, "metrics": s_scrape, "run_page": s_one, "naive_status_json": s_naive},
         args.json, notes=[f"workspace built in {built:.0f} s; the page is {size / 1024:.0f} KiB; target: warm "
                           "`GET /` ≤ 300 ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
