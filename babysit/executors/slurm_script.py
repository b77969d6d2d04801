"""The batch script babysit submits for a Slurm attempt. Pure: a frozen request in, the script text out.

The script is the ONLY place a shell meets the run's argv and env, and every word that came from the
user passes through `shlex.quote`. What it does, in order:

1. `#SBATCH` lines from `[slurm]`: job name (with the submit token `find` searches by), stdout/stderr
   into the attempt directory, partition, account, qos, nodes, gres, time, cpus, mem, then the
   user's `sbatch_options` verbatim.
2. `cd` to the run's workdir and `export` the run's env.
3. Start the trainer in the background (directly, or `srun` + torchrun for several GPUs per node or
   several nodes) and remember its pid; start the probe sidecar beside it.
4. Wait for the trainer, never dying of a stop signal itself: the shell must outlive the trainer's
   checkpoint, or Slurm would reap the trainer with the shell. How the stop reaches the trainer
   (`stop_scope`): a trainer the shell started itself is its leader, so babysit signals the shell
   alone (`scancel --batch`) and the shell passes the signal to the trainer alone — its DataLoader
   workers never get it, and die only when the trainer, done checkpointing, stops them. Under
   `srun` the leaders (one torchrun agent per node) are not the shell's to signal: `scancel --full`
   delivers it to every process of the job, as before.
5. Stop the sidecar, write `exit.json` (exit code, start and end) into the attempt directory — the
   record of the end that survives slurmctld forgetting the job — and exit with the trainer's code.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from babysit.core.spec.run_toml import STOP_SIGNALS
from babysit.core.spec.slurm import SlurmSpec
from babysit.executors.slurm_state import gpus_from_gres

DEFAULT_RDZV_PORT = 29500
# Slurm's warning that the time limit is near (`--signal=B:URG@SECONDS`): URG, whose default is to be
# ignored and which no trainer uses, so it is never mistaken for a stop. The batch shell's trap writes
# `timelimit.json` and passes the run's stop signal to the trainer, which checkpoints and exits; babysit
# continues the run in a new job (classify: time-limit; retry: chained, resumed).
TIME_LIMIT_SIGNAL = "URG"
TIME_LIMIT_FILE = "timelimit.json"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


@dataclass(frozen=True)
class BatchRequest:
    run: str
    attempt: int
    token: str  # unique per submission; part of the job name so `find` can search for it
    attempt_dir: str
    workdir: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # exported by the script (the run's own variables)
    slurm: SlurmSpec
    n_gpus: int  # len(run.gpus): the default GPUs per node
    probe_argv: tuple[str, ...] = ()  # the sidecar (`python -m babysit probe`); () = no sidecar
    probe_interval: float = 10.0
    exclude: tuple[str, ...] = ()  # nodes an earlier attempt lost: `--exclude`
    stop_signal: str = "SIGTERM"  # the run's stop signal: what the time-limit warning becomes for the trainer
    # What the script runs when Slurm reruns it after a requeue ($SLURM_RESTART_COUNT > 0): the argv with
    # the run's resume args, so the requeued job goes on from its checkpoint; () = the argv again.
    restart_argv: tuple[str, ...] = ()


def job_name(run: str, attempt: int, token: str) -> str:
    return f"babysit-{run}-{attempt}-{token}"


def gpus_per_node(slurm: SlurmSpec, n_gpus: int) -> int:
    return n_gpus if slurm.gpus_per_node is None else slurm.gpus_per_node


def gres(slurm: SlurmSpec, n_gpus: int) -> str | None:
    """`[slurm].gres` as written (an empty string asks for none), else `gpu:<gpus per node>`, else none."""
    if slurm.gres is not None:
        return slurm.gres.strip() or None
    g = gpus_per_node(slurm, n_gpus)
    return f"gpu:{g}" if g > 0 else None


def requested_gpus(slurm: SlurmSpec, n_gpus: int) -> int:
    """GPUs the job asks for in all: nodes × per-node count (from gres when it names one)."""

    per_node = gpus_from_gres(slurm.gres) if slurm.gres is not None else gpus_per_node(slurm, n_gpus)
    return slurm.nodes * (per_node or 0)


def uses_torchrun(slurm: SlurmSpec, n_gpus: int) -> bool:
    if slurm.torchrun is not None:
        return slurm.torchrun
    return gpus_per_node(slurm, n_gpus) > 1 or slurm.nodes > 1


RANK_LOG_ENV = "BABYSIT_RANK_LOG"  # where each rank writes a line a step (a trainer that wants per-node rows)
RANK_ARGV_ENV = "BABYSIT_RANK_ARGV"  # the run's argv, shell-quoted, for each torchrun worker to exec
RANK_EXEC = ("bash", "-c", f'eval "exec ${RANK_ARGV_ENV}"')


def torchrun_argv(argv: Sequence[str], nodes: int, per_node: int) -> list[str]:
    """The run's argv as a torchrun launch: `python -m torch.distributed.run <opts> --no-python bash -c
    'eval "exec $BABYSIT_RANK_ARGV"'`, each worker exec-ing the run's own argv from the environment.

    torchrun never sees the run's words: its argparse takes a trainer's `--log` for an abbreviation of its
    own `--log-dir`/`--logs-specs` and refuses to start. torchrun is run by the run's interpreter when the
    command starts with `python` (so the job's venv is the one used), else by `torchrun` on PATH.
    """
    opts = ["--nnodes", str(nodes), "--nproc-per-node", str(max(per_node, 1)),
            "--rdzv-id", _Expand("$SLURM_JOB_ID"), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", _Expand("$BABYSIT_RDZV")]
    prog = argv[0].rsplit("/", 1)[-1]
    launcher = [argv[0], "-m", "torch.distributed.run"] if _PYTHON.fullmatch(prog) else ["torchrun"]
    return [*launcher, *opts, "--no-python", *RANK_EXEC]


def stop_scope(slurm: SlurmSpec, n_gpus: int) -> str:
    """How babysit's stop reaches the trainer: "batch" (the shell forwards it to the trainer alone) or
    "full" (`scancel --full`: every process of the job, for the srun/torchrun launch)."""
    return "full" if uses_torchrun(slurm, n_gpus) else "batch"


def directives(req: BatchRequest) -> list[str]:
    """The `#SBATCH` options, in a fixed order, user extras last (Slurm: the last one wins)."""
    s = req.slurm
    adir = req.attempt_dir.rstrip("/")
    opts = [f"--job-name={job_name(req.run, req.attempt, req.token)}",
            f"--output={adir}/stdout.log", f"--error={adir}/stderr.log"]
    for flag, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos)):
        if value:
            opts.append(f"--{flag}={value}")
    opts.append(f"--nodes={s.nodes}")
    if req.exclude:
        opts.append(f"--exclude={','.join(req.exclude)}")
    if uses_torchrun(s, req.n_gpus):
        opts.append("--ntasks-per-node=1")  # one torchrun agent per node; it starts a worker per GPU
    g = gres(s, req.n_gpus)
    if g:
        opts.append(f"--gres={g}")
    if s.time_limit:
        opts.append(f"--time={s.time_limit}")
        opts.append(f"--signal=B:{TIME_LIMIT_SIGNAL}@{s.warning_seconds()}")  # the batch shell's
    if s.cpus_per_task:
        opts.append(f"--cpus-per-task={s.cpus_per_task}")
    if s.mem:
        opts.append(f"--mem={s.mem}")
    opts.extend(s.sbatch_options)
    for opt in opts:
        if "\n" in opt or "\r" in opt:
            raise ValueError(f"an sbatch option holds a line break: {opt!r}")
    return opts


def render(req: BatchRequest) -> str:
    """The whole batch script. Raises ValueError for what cannot be expressed safely (see below)."""
    for key, _ in req.env:
        if not _ENV_NAME.fullmatch(key):
            raise ValueError(f"run.env: {key!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
    q = shlex.quote
    adir = req.attempt_dir.rstrip("/")
    s = req.slurm
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {_directive(opt)}" for opt in directives(req)]
    lines += [
        f"# Written by babysit for run {req.run}, attempt {req.attempt} (token {req.token}).",
        "",
        "babysit_started=$(date +%s.%N)",
        f"babysit_dir={q(adir)}",
        f"cd {q(req.workdir)} || {{ echo \"babysit: cannot cd to the run's workdir\" >&2; exit 111; }}",
    ]
    lines += [f"export {key}={q(value)}" for key, value in req.env]
    restart = req.restart_argv if req.restart_argv and req.restart_argv != req.argv else ()
    rerun = '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]'  # Slurm requeued the job and runs this script again
    lines += ["# a rerun after a requeue: the earlier run's end is not this one's",
              f'{rerun} && rm -f "$babysit_dir/exit.json" "$babysit_dir/{TIME_LIMIT_FILE}"']
    per_node = gpus_per_node(s, req.n_gpus)
    if uses_torchrun(s, req.n_gpus):
        port = f"${{BABYSIT_RDZV_PORT:-{DEFAULT_RDZV_PORT}}}"
        lines += [
            'babysit_head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "# the head node's address as Slurm reaches it (NodeAddr: its host name unless the cluster names one)",
            'babysit_addr=$(scontrol show node -o "$babysit_head" 2>/dev/null '
            '| sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\')',
            f'export BABYSIT_RDZV="${{babysit_addr:-$babysit_head}}:{port}"',
        ]
        words = torchrun_argv(req.argv, s.nodes, per_node)
        lines.append(f"export {RANK_ARGV_ENV}={q(' '.join(q(w) for w in req.argv))}")
        if restart:
            lines.append(f"{rerun} && export {RANK_ARGV_ENV}={q(' '.join(q(w) for w in restart))}")
        lines.append(f'export {RANK_LOG_ENV}="$babysit_dir/rank-{{rank}}.jsonl"  # every rank\'s step beats')
        command = "srun --kill-on-bad-exit=1 " + " ".join(_word(w) for w in words)
    else:
        command = " ".join(q(w) for w in req.argv)
    stops = [name.removeprefix("SIG") for name in STOP_SIGNALS]
    if stop_scope(s, req.n_gpus) == "batch":
        lines += [
            "",
            "# babysit stops the run with `scancel --batch --signal=SIG`, which reaches this shell alone; the shell",
            "# passes it on to the trainer alone, once (its DataLoader workers are the trainer's to stop). After",
            "# the grace period: `scancel`.",
            "babysit_child=",
            "babysit_stopping=",
            'babysit_stop() { [ -n "$babysit_stopping" ] && return; babysit_stopping=$1; '
            '[ -n "$babysit_child" ] && kill -s "$1" "$babysit_child" 2>/dev/null; }',
            *(f"trap 'babysit_stop {sig}' {sig}" for sig in stops),
            "# a script's background job ignores SIGINT and SIGQUIT unless it resets them: the trainer may stop on INT",
            *([f"if {rerun}; then ( trap - INT QUIT; exec {' '.join(q(w) for w in restart)} ) &",
               f"else ( trap - INT QUIT; exec {command} ) & fi"] if restart
              else [f"( trap - INT QUIT; exec {command} ) &"]),
            "babysit_child=$!",
            '[ -n "$babysit_stopping" ] && kill -s "$babysit_stopping" "$babysit_child" 2>/dev/null',
        ]
    else:
        lines += [
            "",
            "# babysit stops the run with `scancel --full --signal=SIG` (every process of the job), then `scancel`",
            "# after the grace period: the signal is for the trainer, this shell only waits.",
            f"trap ':' {' '.join(stops)}",
            f"{command} &",
            "babysit_child=$!",
        ]
    if s.time_limit:
        stop = req.stop_signal.removeprefix("SIG")
        lines += [
            "# the time limit is near (--signal): say so, then stop the trainer as babysit would; it checkpoints",
            f'babysit_timelimit() {{ printf \'{{"at": %s, "signal": "{stop}"}}\\n\' "$(date +%s.%N)" '
            f'> "$babysit_dir/{TIME_LIMIT_FILE}"; kill -s {stop} "$babysit_child" 2>/dev/null; }}',
            f"trap babysit_timelimit {TIME_LIMIT_SIGNAL}",
        ]
    if req.probe_argv:
        probe = " ".join(q(w) for w in req.probe_argv)
        interval = q(f"{req.probe_interval:g}")
        if s.nodes > 1:
            # --mem=0: the trainer's step holds the job's memory; an overlapping step asks for none of its own
            lines.append(f"srun --overlap --mem=0 --ntasks-per-node=1 --nodes={s.nodes} {probe} "
                         f"--out \"$babysit_dir/probe-{{host}}.jsonl\" --interval {interval} "
                         f"--job-id \"$SLURM_JOB_ID\" >>\"$babysit_dir/probe.log\" 2>&1 &")
        else:
            lines.append(f"{probe} --out \"$babysit_dir/probe-{{host}}.jsonl\" --interval {interval} "
                         f"--pid \"$babysit_child\" --job-id \"$SLURM_JOB_ID\" >>\"$babysit_dir/probe.log\" 2>&1 &")
        lines.append("babysit_probe=$!")
    else:
        lines.append("babysit_probe=")
    lines += [
        "",
        "# wait returns early (>128) when a trapped signal arrives; wait again until the trainer is gone,",
        "# then once more for its real status if the last wait was interrupted.",
        'wait "$babysit_child"; babysit_rc=$?',
        'while kill -0 "$babysit_child" 2>/dev/null; do wait "$babysit_child"; babysit_rc=$?; done',
        'if [ "$babysit_rc" -gt 128 ]; then wait "$babysit_child" 2>/dev/null; babysit_w=$?; '
        '[ "$babysit_w" -ne 127 ] && babysit_rc=$babysit_w; fi',
        'if [ -n "$babysit_probe" ]; then',
        '  # USR1, which srun passes on to every node\'s sidecar (a TERM makes srun SIGKILL them): each writes a',
        '  # last record, which holds an Xid that killed the trainer, and exits; TERM if one has not in 20 s',
        '  kill -USR1 "$babysit_probe" 2>/dev/null',
        '  ( sleep 20; kill -TERM "$babysit_probe" 2>/dev/null ) & babysit_probe_timer=$!',
        '  wait "$babysit_probe" 2>/dev/null; kill "$babysit_probe_timer" 2>/dev/null',
        'fi',
        'printf \'{"exit_code": %d, "started_at": %s, "ended_at": %s, "job_id": "%s"}\\n\' '
        '"$babysit_rc" "$babysit_started" "$(date +%s.%N)" "${SLURM_JOB_ID:-}" > "$babysit_dir/exit.json.tmp" '
        '&& mv -f "$babysit_dir/exit.json.tmp" "$babysit_dir/exit.json"',
        'exit "$babysit_rc"',
        "",
    ]
    return "\n".join(lines)


def _directive(opt: str) -> str:
    """sbatch reads `#SBATCH` lines with its own splitter: a value with whitespace goes in double quotes."""
    if not any(c.isspace() for c in opt):
        return opt
    if '"' in opt:
        raise ValueError(f"an sbatch option holds both whitespace and a double quote: {opt!r}")
    flag, sep, value = opt.partition("=")
    return f'{flag}="{value}"' if sep else f'"{opt}"'


class _Expand(str):
    """A word babysit itself puts in (`$SLURM_JOB_ID`): the shell must expand it. User words never are one."""


def _word(word: str) -> str:
    """Quote every word, except babysit's own `_Expand` words, which go in double quotes to be expanded."""
    if isinstance(word, _Expand):
        return f'"{word}"'
    return shlex.quote(word)
