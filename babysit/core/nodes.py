"""A job across nodes, one row a node: what each node's probe sidecar and each rank's beats say.

Pure: the newest sidecar record of each node (`probe-<node>.jsonl`: free RAM, GPU util) and each rank's recent
beats (`rank-<r>.jsonl`, written by the trainer every step: step, time, node) in; frozen rows out.
A node's pace is its own ranks' (steps between their first and last recent beat over the time between),
so a node that falls behind shows it; a node no beat or record speaks for says "not measured" (None),
never a number borrowed from another node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from babysit.core.fmt import MISSING, fmt_duration, fmt_gib


@dataclass(frozen=True)
class NodeRow:
    node: str
    ranks: tuple[int, ...] = ()  # the ranks whose beats name this node
    step: int | None = None  # the last step every rank of the node finished (its slowest rank's)
    seconds_per_step: float | None = None  # the node's own pace over its ranks' recent beats
    quiet_seconds: float | None = None  # since the node's slowest rank last finished a step
    available_ram_bytes: int | None = None  # from the node's probe sidecar
    total_ram_bytes: int | None = None
    ready_seconds: float | None = None  # a step's time before the node's slowest rank joined the all-reduce
    gpus: int = 0  # the job's GPUs the node's sidecar lists (0: a CPU job, or no sidecar reading)
    gpu_util_pct: float | None = None  # their mean utilization over the sidecar's interval; None: not measured

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "ranks": list(self.ranks), "step": self.step,
                "seconds_per_step": self.seconds_per_step, "quiet_seconds": self.quiet_seconds,
                "available_ram_bytes": self.available_ram_bytes, "total_ram_bytes": self.total_ram_bytes,
                "ready_seconds": self.ready_seconds,
                **({"gpus": self.gpus, "gpu_util_pct": self.gpu_util_pct} if self.gpus else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeRow:
        return cls(node=str(d.get("node") or "?"), ranks=tuple(int(r) for r in d.get("ranks") or ()),
                   step=d.get("step"), seconds_per_step=d.get("seconds_per_step"),
                   quiet_seconds=d.get("quiet_seconds"), available_ram_bytes=d.get("available_ram_bytes"),
                   total_ram_bytes=d.get("total_ram_bytes"), ready_seconds=d.get("ready_seconds"),
                   gpus=int(d.get("gpus") or 0), gpu_util_pct=d.get("gpu_util_pct"))


def node_rows(probe_records: Sequence[Mapping[str, Any]], beats: Mapping[int, Sequence[Mapping[str, Any]]],
              now: float) -> tuple[NodeRow, ...]:
    """One row per node named by a sidecar record or a rank's beat, in node-name order.

    `beats` maps a rank to its recent beats, oldest first (each {"step", "ts", "node"}).
    """
    ram = {str(r.get("host")): r.get("host_mem") or {} for r in probe_records if r.get("host")}
    gpus = {str(r.get("host")): (r.get("gpu") or {}).get("gpus") or [] for r in probe_records if r.get("host")}
    by_node: dict[str, list[Sequence[Mapping[str, Any]]]] = {}
    ranks: dict[str, list[int]] = {}
    for rank, seq in beats.items():
        if not seq:
            continue
        node = str(seq[-1].get("node") or "?")
        by_node.setdefault(node, []).append(seq)
        ranks.setdefault(node, []).append(rank)
    rows = []
    for node in sorted(set(ram) | set(by_node)):
        seqs = by_node.get(node, [])
        lasts = [s[-1] for s in seqs]
        mem = ram.get(node, {})
        rows.append(NodeRow(
            node=node, ranks=tuple(sorted(ranks.get(node, []))),
            step=min(int(b["step"]) for b in lasts) if lasts else None,
            seconds_per_step=_pace(seqs),
            quiet_seconds=max(0.0, now - min(float(b["ts"]) for b in lasts)) if lasts else None,
            available_ram_bytes=mem.get("available_ram_bytes"), total_ram_bytes=mem.get("total_ram_bytes"),
            ready_seconds=_ready(seqs), gpus=len(gpus.get(node, [])), gpu_util_pct=_util(gpus.get(node, []))))
    return tuple(rows)


def _util(gpus: Sequence[Mapping[str, Any]]) -> float | None:
    """The mean utilization of a node's GPUs whose utilization was measured; None when none was."""
    utils = [float(g["util_pct"]) for g in gpus if isinstance(g.get("util_pct"), (int, float))]
    return sum(utils) / len(utils) if utils else None


_HOSTLIST_ITEM = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)")


def hostnames(nodelist: str | None) -> tuple[str, ...]:
    """Slurm's compressed node list as names: "n[1-3,5]" → n1 n2 n3 n5, "gpu[08-09],cpu1" → gpu08 gpu09
    cpu1 (a range keeps its digits' width). () for None, and for a list this cannot read (several brackets
    in one name): the caller then knows no node list, never a wrong one."""
    out: list[str] = []
    text = (nodelist or "").strip()
    pos = 0
    while pos < len(text):
        m = _HOSTLIST_ITEM.match(text, pos)
        if m is None or (m.end() < len(text) and text[m.end()] != ","):
            return ()
        head, ranges, tail = m.groups()
        if ranges is None:
            out.append(head + tail)
        else:
            for part in ranges.split(","):
                lo, _, hi = part.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    return ()
                out += [f"{head}{n:0{len(lo)}d}{tail}" for n in range(int(lo), int(hi or lo) + 1)]
        pos = m.end() + 1
    return tuple(out)


def lowest_ram(rows: Sequence[NodeRow]) -> tuple[int | None, str | None]:
    """The lowest free RAM of the job's nodes and that node: what the host-memory floor reads for a job the
    daemon's host cannot see; (None, None) when no node's sidecar has said."""
    known = [r for r in rows if r.available_ram_bytes is not None]
    if not known:
        return None, None
    low = min(known, key=lambda r: r.available_ram_bytes or 0)
    return low.available_ram_bytes, low.node


def _ready(seqs: Sequence[Sequence[Mapping[str, Any]]]) -> float | None:
    """The node's slowest rank's mean `ready_s` over its recent beats; None where no beat carries it."""
    means = []
    for seq in seqs:
        values = [float(b["ready_s"]) for b in seq if isinstance(b.get("ready_s"), (int, float))]
        if values:
            means.append(sum(values) / len(values))
    return max(means) if means else None


STRAGGLER_RATIO = 3.0  # a node this many times slower to join the all-reduce than every other node …
STRAGGLER_SHARE = 0.25  # … by at least this share of a step: the others wait for it
STRAGGLER_BEATS = 10  # and over at least this many recent beats


def straggler(rows: Sequence[NodeRow], beats_seen: int) -> str | None:
    """The sentence naming a node that holds the others back, or None. Every step of a synchronous job
    takes the same wall time on every rank; a straggler shows in the time before it joins the step's
    all-reduce (`ready_seconds`), which the fast nodes spend waiting for it."""
    timed = [r for r in rows if r.ready_seconds is not None]
    if len(timed) < 2 or beats_seen < STRAGGLER_BEATS:
        return None
    slow = max(timed, key=lambda r: r.ready_seconds or 0.0)
    others = max(r.ready_seconds or 0.0 for r in timed if r is not slow)
    pace = slow.seconds_per_step
    gap = (slow.ready_seconds or 0.0) - others
    if pace is None or (slow.ready_seconds or 0.0) < STRAGGLER_RATIO * others or gap < STRAGGLER_SHARE * pace:
        return None
    return (f"straggler: node {slow.node} takes {slow.ready_seconds:.3g} s a step before it joins the all-reduce, "
            f"the other nodes {others:.3g} s: they wait for it {gap / pace:.0%} of each {pace:.3g} s step — "
            f"check {slow.node} (a slower GPU, thermal throttling, its data loading, a noisy neighbour)")


def _pace(seqs: Sequence[Sequence[Mapping[str, Any]]]) -> float | None:
    """Seconds a step over the node's ranks' recent beats (the slowest rank's), None with under 2 beats."""
    paces = []
    for seq in seqs:
        if len(seq) < 2:
            continue
        steps = int(seq[-1]["step"]) - int(seq[0]["step"])
        if steps > 0:
            paces.append((float(seq[-1]["ts"]) - float(seq[0]["ts"])) / steps)
    return max(paces) if paces else None


def node_line(row: NodeRow) -> str:
    """"node n2 (rank 1): step 40 · 0.41 s/step · GPU util 93 % · free RAM 7.1 GiB": a poll's row for one node
    (GPU util where the node's sidecar lists the job's GPUs)."""
    who = f" (rank{'s' if len(row.ranks) != 1 else ''} {', '.join(map(str, row.ranks))})" if row.ranks else ""
    parts = [f"step {MISSING if row.step is None else row.step}",
             f"{MISSING if row.seconds_per_step is None else f'{row.seconds_per_step:.3g}'} s/step"]
    if row.gpus:
        parts.append(f"GPU util {MISSING if row.gpu_util_pct is None else f'{row.gpu_util_pct:.0f} %'}")
    parts.append(f"free RAM {fmt_gib(row.available_ram_bytes)}")
    if row.quiet_seconds is not None and row.seconds_per_step is not None \
            and row.quiet_seconds > max(10.0, 10 * row.seconds_per_step):
        parts.append(f"no step for {fmt_duration(row.quiet_seconds)}")
    return f"node {row.node}{who}: " + " · ".join(parts)


STOPPED = ("T", "t")  # /proc state of a process stopped by a signal (SIGSTOP) or a debugger


def stacks_by_rank(node_dumps: Sequence[Mapping[str, Any]], last_steps: Mapping[int, int]) -> dict[str, str]:
    """Every rank's stack from every node (each node's `babysit.run.node_stacks` line) as a stall's
    `stacks`: "n2 rank 1 pid 4242" -> its py-spy text; "stalled" names the rank the others wait for — a
    stopped process (state T) first, else the rank whose last finished step is behind the others'
    (`last_steps`: rank -> step, from the ranks' beats); "note" says what could not be dumped;
    "flight_records" names each rank's NCCL flight record gathered from its node (and those that were not)."""
    out: dict[str, str] = {}
    notes: list[str] = []
    records: list[str] = []
    procs: list[tuple[str, Mapping[str, Any]]] = []
    for dump in sorted(node_dumps, key=lambda d: str(d.get("node"))):
        node = str(dump.get("node") or "?")
        if dump.get("note"):
            notes.append(f"{node}: {dump['note']}")
        records += [f"{node} rank {r.get('rank')}: {r.get('to')} (from {node}:{r.get('from')}, {r.get('bytes')} B)"
                    for r in dump.get("flight_records") or ()]
        records += [f"{node} {text}" for text in dump.get("flight_missing") or ()]
        for proc in dump.get("procs") or ():
            procs.append((node, proc))
            key = f"{node} rank {proc.get('rank')} pid {proc.get('pid')}"
            out[key] = str(proc.get("stack") or "(no stack: see the note)")
    stopped = [f"rank {p.get('rank')} on {n} (pid {p.get('pid')}): its process is stopped (state "
               f"{p.get('state')}: SIGSTOP or a debugger)" for n, p in procs if p.get("state") in STOPPED]
    behind = _behind(procs, last_steps)
    if stopped or behind:
        out["stalled"] = "; ".join(stopped or behind)
    if records:
        out["flight_records"] = "; ".join(records)
    if notes:
        out["note"] = "; ".join(notes)
    elif not procs:
        out["note"] = "no stack dump: no rank of the job found on any node"
    return out


def _behind(procs: Sequence[tuple[str, Mapping[str, Any]]], last_steps: Mapping[int, int]) -> list[str]:
    """The ranks whose last finished step is below the newest any rank finished."""
    steps = {int(p.get("rank", -1)): last_steps[int(p.get("rank", -1))] for _, p in procs
             if int(p.get("rank", -1)) in last_steps}
    if len(set(steps.values())) < 2:
        return []
    top = max(steps.values())
    return [f"rank {p.get('rank')} on {n} (pid {p.get('pid')}): last finished step {steps[int(p['rank'])]}, "
            f"the others reached {top}" for n, p in procs if steps.get(int(p.get("rank", -1)), top) < top]
