"""Every command's arguments, help line and description: what `babysit --help` and `babysit CMD --help` show.

The parsers live here, apart from the commands, so that building them imports nothing but argparse:
`babysit --help` and `babysit status` answer at once. Each subparser names its implementation with
`set_defaults(handler=(MODULE, FUNCTION))`, `babysit/commands/MODULE.py`'s FUNCTION(args), which
`babysit/cli.py` imports only for the command that runs; the command modules import what they use
at their top, as any module does.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol

REGISTRY_HELP = "the registry file (default: $BABYSIT_REGISTRY or ./babysit.toml); before or after the command"
SMOKE_TIMEOUT_S = 1800.0  # `babysit smoke --timeout-s`: per profile


class Subcommands(Protocol):
    """What `ArgumentParser.add_subparsers()` returns, as the functions below use it (argparse names its
    class only privately)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def build_parser() -> argparse.ArgumentParser:
    """`babysit`'s parser: the global options and every command's."""
    parser = argparse.ArgumentParser(
        prog="babysit",
        description="Babysit GPU training runs: guards, retries, pre-registered verdicts, Slack chat-ops.",
        epilog="Start with `babysit demo`. Docs: README.md and docs/.",
    )
    parser.add_argument("--version", action=_Version, help="print babysit's version and exit")
    # Global options go before or after the command (`babysit --registry X status` as git and kubectl
    # users type it). A command's own copy defaults to SUPPRESS, so it never overwrites the global value.
    parser.add_argument("--registry", metavar="PATH", default=None, help=REGISTRY_HELP)
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return parser


class _Version(argparse.Action):
    """`--version`, looked up only when asked (the metadata scan costs milliseconds on every call)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"babysit {package_version()}")
        parser.exit()


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("babysit")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the repository)"


def parse(argv: list[str]) -> argparse.Namespace:
    """A command line's arguments as `babysit` parses them, for a command that runs another's function."""
    return build_parser().parse_args(argv)


def add_commands(sub: Subcommands) -> None:
    """Every command, in the order `babysit --help` lists them."""
    for add in (add_run, add_register, add_up, add_status, add_verdict, add_amend, add_prereg, add_abort,
                add_relaunch, add_smoke,
                add_bot, add_slack, add_probe, add_demo, add_web, add_campaign, add_db, add_gpu, add_node):
        add(sub)


def positive_seconds(text: str) -> float:
    """argparse type for an interval flag (--interval, --refresh): a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def step(text: str) -> int:
    """argparse type for `verdict --at-step`: a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a step (a non-negative integer), got {text!r}")
    return value


def add_registry_option(parser: argparse.ArgumentParser) -> None:
    """`--registry PATH` on a command that reads the registry; the global one works too."""
    parser.add_argument("--registry", metavar="PATH", default=argparse.SUPPRESS, help=REGISTRY_HELP)
    parser.set_defaults(reads_registry=True)


def add_gpu_probe_option(parser: argparse.ArgumentParser) -> None:
    """`--gpu-probe`, the same on every command that reads GPUs (up, smoke, probe)."""
    parser.add_argument("--gpu-probe", default=None, metavar="nvml|file:PATH|none",
                        help="where GPU readings come from (default: $BABYSIT_GPU_PROBE or nvml)")


def add_run(sub: Subcommands) -> None:
    p = sub.add_parser("run", help="babysit one command in the foreground: babysit run -- python train.py",
                       description="Write a run.toml for CMD (adhoc/NAME.toml under the state directory), register "
                                   "it and babysit it here: its output passed through, its row live, its printed "
                                   "metrics read by a preset or the general reader (babysit says which within "
                                   "seconds; --pattern for a format neither reads). A running "
                                   "`babysit up` takes it; without one, a daemon runs in this process for it alone. "
                                   "Ctrl-C stops it gracefully (checkpoint); twice: kills it (no `babysit up`) or "
                                   "leaves it to `babysit up`. Exit 0 completed, 1 failed, 2 bad input, 3 diverged, "
                                   "4 stalled, 5 stopped, 6 left to `babysit up` (docs/your-trainer.md).")
    p.add_argument("--name", help="the run's name (default: the script's name and the time)")
    p.add_argument("--gpus", metavar="I,J",
                   help="the GPUs it owns (NVML indices), held exclusively (default: a CPU run)")
    p.add_argument("--retry-on", metavar="CLASSES", help="retry (up to 3 attempts) on these failure classes, e.g. "
                                                          "oom,diverged (default: no retries)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="where it runs (slurm: sbatch; docs/slurm.md)")
    p.add_argument("--accelerated", action="store_true", help="declared minutes become seconds (demos and tests)")
    add_gpu_probe_option(p)
    p.add_argument("--pattern", action="append", metavar="REGEX",
                   help="read its printed lines with this regex (named groups: step and one a metric; repeat for "
                        "more), before the presets and the general reader (docs/your-trainer.md)")
    p.add_argument("--no-view", action="store_true", help="no live row: its output and the messages only")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command, after --")
    add_registry_option(p)
    p.set_defaults(handler=("adhoc", "run"))


def add_register(sub: Subcommands) -> None:
    p = sub.add_parser("register", help="validate a run.toml and record it in the registry",
                       description="Validate RUN.toml, check its verdict instrument on the fixture, freeze the "
                                   "[prereg] hash and record the run in babysit.toml. Launches nothing.")
    p.add_argument("spec", metavar="RUN.toml", help="the run's spec (docs/spec.md)")
    p.add_argument("--accelerated", action="store_true",
                   help="allow poll cadences under 30 minutes (demos and tests; run the daemon accelerated too)")
    add_registry_option(p)
    p.set_defaults(handler=("register", "run"))


def add_up(sub: Subcommands) -> None:
    p = sub.add_parser("up", help="run the daemon: launch registered runs and babysit them",
                       description="Launch every registered run that is not finished and babysit it: polls, "
                                   "guards, retries, verdicts, messages. Ctrl-C stops the daemon, not the runs; "
                                   "a restarted daemon re-adopts them. On a terminal it shows a live table of "
                                   "every run (step, s/step, ETA, GPU, last incident, verdict) with messages and "
                                   "warnings printed above it; otherwise a line per run whenever it changes.")
    p.add_argument("--accelerated", action="store_true",
                   help="declared minutes become seconds (demos and tests)")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="return once no run is running, pending or retrying and every message is delivered")
    p.add_argument("--bot", action="store_true", help="host the Slack bot in-process (Socket Mode or --bot-http)")
    p.add_argument("--bot-http", type=int, metavar="PORT", help="with --bot: serve slash commands over HTTP")
    add_gpu_probe_option(p)
    p.add_argument("--no-view", action="store_true",
                   help="no live table and no progress lines: only messages and warnings")
    p.add_argument("--web", type=int, metavar="PORT",
                   help="also serve the read-only web page and /metrics on PORT (docs/web.md); its failure is "
                        "logged and never stops babysitting")
    p.add_argument("--web-bind", default="127.0.0.1", metavar="ADDR",
                   help="with --web: the address (default 127.0.0.1; another needs BABYSIT_WEB_TOKEN)")
    add_registry_option(p)
    p.set_defaults(handler=("up", "run"))


def add_status(sub: Subcommands) -> None:
    p = sub.add_parser("status", help="runs, attempt, step, s/step, ETA, last poll, last incident (--watch: live)",
                       description="What every registered run is doing (or RUN alone), read from the state "
                                   "database: status, attempt, step, s/step, ETA, GPU-hours, last poll, the last "
                                   "incident (or how a finished run ended) and the latest verdict read. Read-only; "
                                   "works with or without a daemon.")
    p.add_argument("run", nargs="?", metavar="RUN", help="one registered run (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--watch", action="store_true",
                   help="keep the table up, refreshed from the state database (a terminal: redrawn in place; "
                        "otherwise a line per run when it changes); Ctrl-C ends it")
    p.add_argument("--interval", type=positive_seconds, default=2.0, metavar="S",
                   help="with --watch: seconds between looks")
    add_registry_option(p)
    p.set_defaults(handler=("status", "run"))


def add_verdict(sub: Subcommands) -> None:
    p = sub.add_parser("verdict", help="read a run's pre-registered verdict (card or --json) and draw its chart",
                       description="Read the pre-registered verdict of a registered run (NAME) or, offline, of a "
                                   "RUN.toml against a log. Writes the chart PNG and says where.")
    p.add_argument("target", metavar="NAME|RUN.toml", help="a registered run name, or a run.toml for an offline read")
    p.add_argument("--json", action="store_true", help="print the verdict JSON on stdout (docs/verdicts.md)")
    p.add_argument("--at-step", type=step, metavar="N", help="read as of step N (only evals at steps <= N count)")
    p.add_argument("--chart", metavar="PATH", help="where to write the chart PNG (default: the FINAL read's is "
                                                   "<state_dir>/verdicts/<run>.png, any other read's under "
                                                   "<state_dir>/whatif/; offline: next to the log)")
    p.add_argument("--compare", action="append", default=[], metavar="NAME=LOGPATH",
                   help="overlay another run's log on the chart (repeatable)")
    p.add_argument("--fixture", action="store_true",
                   help="check the instrument on [prereg.fixture] instead (exit 1 if it does not reproduce)")
    p.add_argument("--log", metavar="PATH", help="offline: the train log to read (default: the spec's log)")
    p.add_argument("--amendment", action="append", default=[], metavar="FILE",
                   help="a what-if amendment, applied after recorded ones, marked not provenance-checked "
                        "(repeatable)")
    add_registry_option(p)
    p.set_defaults(handler=("verdict", "run"))


def add_amend(sub: Subcommands) -> None:
    p = sub.add_parser("amend", help="append an amendment (e.g. a scale rule) to a run's pre-registration",
                       description="Append FILE (title, rationale, scale, combine) to the run's amendment chain. "
                                   "Nothing in the frozen [prereg] is edited; the amendment adds a rule.")
    p.add_argument("run", metavar="NAME", help="a registered run")
    p.add_argument("file", metavar="FILE", help="the amendment TOML")
    add_registry_option(p)
    p.set_defaults(handler=("amend", "run"))


def add_prereg(sub: Subcommands) -> None:
    p = sub.add_parser("prereg", help="show a run's frozen pre-registration and amendment chain",
                       description="The pre-registration of a registered run, as `register` froze it.")
    add_registry_option(p)
    actions = p.add_subparsers(dest="prereg_action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="the frozen [prereg], its hash, and the verified amendment chain",
                              description="Print the run's [prereg] as canonical JSON, its sha256 and whether the "
                                          "spec still hashes to what `register` froze, and the amendment chain with "
                                          "every record's hash recomputed. Exit 1 when the prereg was edited or the "
                                          "chain is broken.")
    show.add_argument("run", metavar="NAME", help="a registered run")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    add_registry_option(show)
    show.set_defaults(handler=("prereg", "run"))


def add_abort(sub: Subcommands) -> None:
    p = sub.add_parser("abort", help="stop a run gracefully (the trainer checkpoints); no retry follows",
                       description="Ask the daemon to stop RUN gracefully: the run's stop signal ([run].stop_signal, "
                                   "SIGTERM by default), [guards].stop_grace_seconds for the trainer to checkpoint, "
                                   "then SIGKILL. No retry follows. A run that already ended is answered at once "
                                   "from the state database (exit 0).")
    p.add_argument("run", metavar="RUN", help="a registered run")
    p.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                   help="how long to wait for the daemon to take the request (default 10)")
    add_registry_option(p)
    p.set_defaults(handler=("abort", "run"))


def add_relaunch(sub: Subcommands) -> None:
    p = sub.add_parser("relaunch", help="run an ended run again, its run.toml re-read (a fixed command, a raised cap)",
                       description="Run RUN again after it ended (failed, stopped, finished without a FINAL "
                                   "verdict): its run.toml is re-read and checked as `register` checks it, its "
                                   "history and frozen prereg are kept, and the daemon starts a new sequence of "
                                   "attempts (numbers go on; profiles and retry.max_attempts count afresh). The "
                                   "GPU-hour cap covers every attempt, those before the relaunch included. "
                                   "See docs/spec.md, Relaunching.")
    p.add_argument("run", metavar="RUN", help="a registered run that ended")
    p.add_argument("--resume", action="store_true",
                   help="append [retry].resume_args (the trainer resumes from its latest checkpoint); default fresh")
    p.add_argument("--accelerated", action="store_true", help="allow poll cadences under 30 minutes (as register)")
    p.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                   help="how long to wait for the daemon to take the request (default 10)")
    add_registry_option(p)
    p.set_defaults(handler=("relaunch", "run"))


def add_gpu(sub: Subcommands) -> None:
    p = sub.add_parser("gpu", help="list, quarantine or release the GPUs babysit keeps off runs",
                       description="A GPU a machine fault hit (an Xid the catalog blames on the machine, a "
                                   "double-bit ECC error, a lost GPU) is quarantined by UUID: no run launches on "
                                   "it. `release` lifts it once the GPU is reset or replaced (docs/guards.md).")
    p.add_argument("action", choices=("list", "quarantine", "release"),
                   help="list the box's GPUs and the quarantine; quarantine a GPU; release one")
    p.add_argument("target", nargs="?", metavar="UUID|INDEX", help="the GPU: its UUID (GPU-…) or NVML index")
    p.add_argument("--reason", default=None, help="why (quarantine; shown in status and /babysit gpus)")
    add_gpu_probe_option(p)
    add_registry_option(p)
    p.set_defaults(handler=("gpu", "run"))


def add_node(sub: Subcommands) -> None:
    p = sub.add_parser("node", help="list, quarantine or release the Slurm nodes babysit keeps runs off",
                       description="A Slurm node lost under a run's job (NODE_FAIL, BOOT_FAIL) is quarantined: "
                                   "every later submission is made with --exclude of it. `release` lifts it once "
                                   "the node is fixed (docs/slurm.md).")
    p.add_argument("action", choices=("list", "quarantine", "release"),
                   help="list the quarantined nodes; quarantine a node; release one")
    p.add_argument("name", nargs="?", metavar="NODE", help="the node's Slurm name (as `sinfo -N` lists it)")
    p.add_argument("--reason", default=None, help="why (quarantine; shown by `babysit node list`)")
    add_registry_option(p)
    p.set_defaults(handler=("node", "run"))


def add_smoke(sub: Subcommands) -> None:
    p = sub.add_parser("smoke", help="try the run's profiles for N steps; write hardware_profile.json",
                       description="Try the [[attempts]] profiles (or [smoke].candidates) in order, each for N "
                                   "steps with eval off on the run's GPUs, stop at the first that completes, and "
                                   "write hardware_profile.json. A registered run's attempt 1 then uses it.")
    p.add_argument("spec", metavar="RUN.toml", help="the run's spec (docs/spec.md)")
    p.add_argument("--steps", type=int, help="steps per smoke run (default: [smoke].steps, 20)")
    p.add_argument("--out", metavar="PATH", help="default: hardware_profile.json next to RUN.toml")
    p.add_argument("--timeout-s", type=float, default=SMOKE_TIMEOUT_S,
                   help="per profile; past it the smoke run's process group is killed "
                        f"(default {SMOKE_TIMEOUT_S:.0f})")
    p.add_argument("--smoke-dir", metavar="DIR", help="where smoke logs, checkpoints and stderr go (default: a new "
                                                      "temporary directory, kept for inspection)")
    add_gpu_probe_option(p)
    p.add_argument("--rlimit-as-gib", type=float, metavar="GIB",
                   help="TEST/SAFETY KNOB, CPU runs only: start each smoke run under RLIMIT_AS = GIB, so an "
                        "oversized profile fails in the allocator instead of swapping the host")
    add_registry_option(p)
    p.set_defaults(handler=("smoke", "run"))


def add_bot(sub: Subcommands) -> None:
    p = sub.add_parser("bot", help="run the Slack bot (slash commands): Socket Mode, or HTTP with --http PORT",
                       description="Answer /verdict and /babysit from the registry's state. Needs SLACK_BOT_TOKEN, "
                                   "and SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET (HTTP). "
                                   "See docs/slack.md.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--socket", action="store_true", help="Socket Mode (default): outbound websocket only")
    mode.add_argument("--http", type=int, metavar="PORT",
                      help="serve /slack/events on PORT (0: any free port, printed on stdout)")
    p.add_argument("--host", default="0.0.0.0", help="with --http: the address to bind (default 0.0.0.0)")
    p.add_argument("--request-wait", type=float, default=10.0, metavar="SECONDS",
                   help="how long /babysit poll and abort wait for the daemon's answer (default 10)")
    add_registry_option(p)
    p.set_defaults(handler=("bot", "run"))


def add_slack(sub: Subcommands) -> None:
    p = sub.add_parser("slack", help="check the Slack setup: token, scopes, channels, a test post",
                       description="Slack setup (docs/slack.md).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    check = verbs.add_parser("check", help="auth.test, the scopes granted vs needed, each channel, a test post",
                             description="Check SLACK_BOT_TOKEN with Slack itself: auth.test, the scopes granted "
                                         "(x-oauth-scopes) against those babysit needs, each configured channel "
                                         "(the bot a member, not archived) and a test post. Exit 0 when babysit "
                                         "can post, 1 on a problem (each says what to do), 2 without a token.")
    check.add_argument("--channel", action="append", metavar="ID",
                       help="check this channel (repeatable); default: [daemon].channel and the runs' channels")
    check.add_argument("--join", action="store_true", help="join a public channel the bot is not in")
    check.add_argument("--no-post", action="store_true", help="no test post")
    add_registry_option(check)
    check.set_defaults(handler=("slack", "run_check_command"))


def add_probe(sub: Subcommands) -> None:
    p = sub.add_parser("probe", help="sample GPUs and host where a job runs, appending JSONL (Slurm sidecar)",
                       description="Sample NVML and psutil on this node every --interval seconds and append "
                                   "one JSON record per sample to --out. The Slurm executor starts it inside "
                                   "the job; the daemon reads the file.")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the JSONL file to append to; {host} becomes this node's short host name")
    p.add_argument("--interval", type=float, default=10.0, metavar="S", help="seconds between records (default 10)")
    p.add_argument("--pid", type=int, default=None, metavar="PID",
                   help="the trainer's pid: its process tree is the run (RSS, CPU, which GPU holders are its own)")
    p.add_argument("--job-id", default=None, metavar="ID",
                   help="the Slurm job id (default $SLURM_JOB_ID): processes of the job are the run's own")
    p.add_argument("--gpus", default=None, metavar="I,J",
                   help="NVML indices to read (default: the job's, from SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES)")
    add_gpu_probe_option(p)
    p.add_argument("--count", type=int, default=None, metavar="N", help="stop after N records (tests)")
    p.set_defaults(handler=("probe", "run"))


def add_demo(sub: Subcommands) -> None:
    p = sub.add_parser("demo", help="babysit real CPU training runs end to end (a few minutes)",
                       description="Register two runs of the reference trainer and one trainer babysit did not "
                                   "write (nanoGPT-style printed lines) in a fresh workspace and babysit them to "
                                   "the end: polls, a divergence stopped live and retried, an amendment declared "
                                   "on time, and a FINAL pre-registered verdict with its chart.")
    p.add_argument("--dir", type=Path, default=None, help="workspace (default: a fresh temporary directory)")
    p.add_argument("--only", choices=("drift", "retry", "stdout", "campaign", "run"), default=None,
                   help="run just one of the demo runs (campaign: drift_disc and its single-delta run)")
    p.add_argument("--fleet", action="store_true",
                   help="instead: two boxes on one throwaway PostgreSQL of this machine's server binaries, one "
                        "channel (status across boxes, a cross-box abort, a lost box posted once; docs/fleet.md)")
    p.set_defaults(handler=("demo", "run"))


def add_web(sub: Subcommands) -> None:
    p = sub.add_parser("web", help="serve a read-only web page of runs, curves and verdicts, and /metrics",
                       description="Serve the runs table (refreshing itself), a page a run (its curve against the "
                                   "frozen bands, incidents, attempts, verdict, pre-registration) and /metrics for "
                                   "Prometheus, read from the state database. Read-only; works with or without a "
                                   "daemon. Binds 127.0.0.1; any other --bind needs BABYSIT_WEB_TOKEN (docs/web.md).")
    p.add_argument("--port", type=int, default=8765, help="TCP port (default 8765; 0: any free port, printed)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1; another needs BABYSIT_WEB_TOKEN)")
    p.add_argument("--refresh", type=positive_seconds, default=2.0, metavar="S",
                   help="seconds between re-reads of a page a browser is watching (default 2)")
    add_registry_option(p)
    p.set_defaults(handler=("web", "run"))


def add_campaign(sub: Subcommands) -> None:
    p = sub.add_parser("campaign", help="campaigns: suspects, single-delta runs, owner calls (docs/campaigns.md)",
                       description="A campaign is a saga of single-delta runs testing suspects, each with a "
                                   "pre-registered interpretation grid. See docs/campaigns.md.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    reg = verbs.add_parser("register", help="record a campaign.toml and register the runs it lists",
                           description="Record CAMPAIGN.toml (suspects, banked references) in the state, then "
                                       "register the runs it lists, each held to the single-delta rule.")
    reg.add_argument("file", metavar="CAMPAIGN.toml", help="the campaign's file (docs/campaigns.md)")
    reg.add_argument("--accelerated", action="store_true", help="passed on to each run's register (demos, tests)")
    add_registry_option(reg)
    reg.set_defaults(handler=("campaign", "run_register"))
    show = verbs.add_parser("show", help="the suspect table, the runs, the decisions",
                            description="Print campaign NAME: the suspect table, each run with its delta, label "
                                        "and what it changed, the banked references and the decision log.")
    show.add_argument("name", metavar="NAME", help="the campaign's [campaign].name")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--chart", type=Path, default=None, metavar="PNG", help="also draw the saga chart here")
    add_registry_option(show)
    show.set_defaults(handler=("campaign", "run_show"))


def add_db(sub: Subcommands) -> None:
    p = sub.add_parser("db", help="the state database: its schema version, upgrade, copy to PostgreSQL (docs/fleet.md)",
                       description="The state database: SQLite in the state directory, or the PostgreSQL of "
                                   "[store] url / $BABYSIT_STORE_URL. See docs/fleet.md.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    up = verbs.add_parser("upgrade", help="migrate the state database to this babysit's schema",
                          description="Migrate the configured state database to this babysit's schema. Daemons "
                                      "on PostgreSQL refuse to start on another version and name this command.")
    add_registry_option(up)
    up.set_defaults(handler=("db", "run_upgrade"))
    ver = verbs.add_parser("version", help="the schema version of the state database and of this babysit",
                           description="Print which database is configured, its schema version and this babysit's.")
    add_registry_option(ver)
    ver.set_defaults(handler=("db", "run_version"))
    cp = verbs.add_parser("copy", help="copy this box's SQLite history into a PostgreSQL (ids and hashes kept)",
                          description="Copy every row of this box's state.db into an empty PostgreSQL database "
                                      "at the same schema, in one transaction, then compare both sides table by "
                                      "table. The box's registered runs become its own in the fleet.")
    cp.add_argument("--to", required=True, metavar="URL", help="postgresql://… (run `babysit db upgrade` on it first)")
    cp.add_argument("--host", default=None, metavar="NAME",
                    help="the box's name in the fleet (default: $BABYSIT_HOST, [host] name, the hostname)")
    add_registry_option(cp)
    cp.set_defaults(handler=("db", "run_copy"))
