"""`babysit demo`: babysit real CPU training runs to their verdict, on the console channel; `babysit demo
--fleet`: two boxes on one PostgreSQL (babysit/demo/fleet.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from babysit.channels.notify import ConsoleChannel
from babysit.commands import adhoc, campaign, register, status
from babysit.commands import amend as amend_command
from babysit.commands.args import parse
from babysit.core.errors import BabysitError, BadInput
from babysit.demo import fleet, runner
from babysit.probes.gpu import open_gpu_probe
from babysit.runtime import logs, registry
from babysit.service.daemon import Daemon
from babysit.verdict import reading
from babysit.view.watch import Watcher, open_view

# Banked deltas over steps 500 -> 1000 of the bundled recipes on CPU (seed 0), and the read of the
# bundled fixture log: see docs/demo.md for the runs that produced them.
REFERENCES = {"DRIFT_REF": 0.0205, "HEALTHY_REF": -0.0078, "FIXTURE_DELTA": -0.0078}


def run(args: argparse.Namespace) -> int:
    if getattr(args, "fleet", False):
        if args.only is not None or args.dir is not None:
            raise BadInput("babysit demo --fleet: --only and --dir do not apply (the fleet demo makes its boxes in a "
                           "temporary directory and removes them)", hint="run `babysit demo --fleet` alone")
        return fleet.main()  # two boxes on one PostgreSQL (docs/fleet.md)
    root = runner.make_workspace(args.dir)
    drift, retry_toml, stdout_toml, amendment = runner.write_runs(root, REFERENCES)
    reg = root / "babysit.toml"
    print(f"babysit demo — workspace {root}\n")
    wanted = [("drift", drift), ("retry", retry_toml), ("stdout", stdout_toml)]
    for key, spec in wanted:
        if args.only in (None, key) or (args.only == "campaign" and key == "drift"):
            print(f"$ babysit register {spec.relative_to(root)} --accelerated")
            code = register.run(parse(["register", str(spec), "--accelerated", "--registry", str(reg)]))
            if code:
                return code
    if args.only in (None, "campaign"):  # drift_disc's single-delta child (docs/campaigns.md)
        print(f"$ babysit campaign register {(root / 'runs' / 'campaign.toml').relative_to(root)} --accelerated")
        code = campaign.run_register(parse(["campaign", "register", str(root / "runs" / "campaign.toml"),
                                            "--accelerated", "--registry", str(reg)]))
        if code:
            return code
    print("\n$ babysit up --accelerated --exit-when-idle   (declared minutes run as seconds)\n")
    state_dir = registry.load(reg).state_dir
    logs.configure(state_dir, console=False)
    # The same view as `babysit up`: the live table on a terminal (messages print above it; it is
    # erased at the end, where the status table follows), a line per change otherwise.
    watcher = Watcher(reg, open_view(sys.stdout, transient=True), interval=1.0 if sys.stdout.isatty() else 10.0,
                      footer="babysit demo · the daemon's view of its runs")
    watcher.start()
    amend = None
    if args.only in (None, "drift", "campaign"):
        log = root / "outputs" / runner.DRIFT_RUN / "train_log.jsonl"

        def declare() -> int:
            print(f"\n$ babysit amend {runner.DRIFT_RUN} {amendment.relative_to(root)}   "
                  f"(the step-{runner.AMEND_AFTER_STEP} eval is in; the baseline is not)")
            try:  # on the amendment's own thread: said here, as `babysit amend` would say it
                return amend_command.run(parse(["amend", runner.DRIFT_RUN, str(amendment), "--registry", str(reg)]))
            except BabysitError as exc:
                print(f"ERROR: {exc.message}" + (f"\nHINT: {exc.hint}" if exc.hint else ""), file=sys.stderr)
                return exc.exit_code

        amend = runner.AmendOnTime(log, declare)
        amend.start()
    started = time.monotonic()
    try:
        daemon = Daemon(reg, gpu_probe=open_gpu_probe("none"), channel=ConsoleChannel(state_dir, watcher.view.out),
                        accelerated=True, exit_when_idle=True)
        daemon.run()
    finally:
        watcher.stop(erase=sys.stdout.isatty())
        if amend is not None:
            amend.done.set()
    print(f"\nall runs over in {time.monotonic() - started:.0f} s.\n")
    if args.only in (None, "run"):  # no run.toml at all: docs/your-trainer.md opens with it
        command = [sys.executable, "-m", "babysit.demo.nanogpt_like", "--iters", "40", "--eval-every", "20",
                   "--sleep", "0.05"]
        print(f"$ babysit run --accelerated --name {runner.ADHOC_RUN} -- python -m babysit.demo.nanogpt_like "
              "--iters 40   (no run.toml, no regex)\n")
        adhoc.run(parse(["run", "--accelerated", "--no-view", "--gpu-probe", "none", "--name", runner.ADHOC_RUN,
                         "--registry", str(reg), "--", *command]))
        # a format no preset knows, read by the general reader: the per-epoch batch counter counted on, and
        # the NaN it prints at step 250 stopping it within a second, not retried with the same command
        shapes = [sys.executable, "-m", "babysit.demo.printed_shapes", "--shape", "epoch-batch", "--steps", "300",
                  "--nan-at", "250", "--sleep", "0.01"]
        print(f"\n$ babysit run --retry-on diverged --name {runner.GENERAL_RUN} -- python -m "
              "babysit.demo.printed_shapes --shape epoch-batch --nan-at 250   (prints `[epoch 1/3][batch 20/100] "
              "loss=…`: no preset knows it)\n")
        adhoc.run(parse(["run", "--no-view", "--gpu-probe", "none", "--name", runner.GENERAL_RUN, "--retry-on",
                         "diverged", "--registry", str(reg), "--", *shapes]))
        print()
    status.run(parse(["status", "--registry", str(reg)]))
    verdict_json = reading.verdict_json_path(reading.final_dir(state_dir), runner.DRIFT_RUN)
    print("\nwhere things are:")
    print(f"  registry        {reg}")
    print(f"  state           {state_dir}  (state.db, channel.jsonl, daemon.log)")
    for name in (runner.DRIFT_RUN, runner.RETRY_RUN):
        log = root / "outputs" / name / "train_log.jsonl"
        if log.exists():
            print(f"  {name} log  {log}")
    records = state_dir / "runs" / runner.STDOUT_RUN / "records.jsonl"
    if records.exists():
        print(f"  {runner.STDOUT_RUN} records  {records}   (read from its stdout by [source] patterns)")
    if verdict_json.exists():
        verdict = json.loads(verdict_json.read_text())
        print(f"  verdict JSON    {verdict_json}   ({verdict['status']}: {verdict['label']}, "
              f"Δ {verdict['delta']:+.4f})")
        print(f"  verdict chart   {verdict_json.with_suffix('.png')}")
        print(f"\nre-derive it yourself:  babysit verdict {runner.DRIFT_RUN} --registry {reg}")
    saga = state_dir / "campaigns" / f"{runner.CAMPAIGN}.png"
    if saga.exists():
        proposals = root / "runs" / "proposals"  # none while the conclusion is pending or suspended
        print(f"\n$ babysit campaign show {runner.CAMPAIGN}   (saga chart: {saga}"
              + (f"; proposals: {proposals})" if proposals.is_dir() else ")"))
        campaign.run_show(parse(["campaign", "show", runner.CAMPAIGN, "--registry", str(reg)]))
    return 0

