"""A job across nodes, one row a node: what each node's probe sidecar and each rank's beats say.

Pure: the newest sidecar record of each node (`probe-<node>.jsonl`: free RAM) and each rank's recent
beats (`rank-<r>.jsonl`, written by the trainer every step: step, time, node) in; frozen rows out.
A node's pace is its own ranks' (steps between their first and last recent beat over the time between),
so a node that falls behind shows it; a node no beat or record speaks for says "not measured" (None),
never a number borrowed from another node.
"""

from __future__ import annotations

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

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "ranks": list(self.ranks), "step": self.step,
                "seconds_per_step": self.seconds_per_step, "quiet_seconds": self.quiet_seconds,
                "available_ram_bytes": self.available_ram_bytes, "total_ram_bytes": self.total_ram_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeRow:
        return cls(node=str(d.get("node") or "?"), ranks=tuple(int(r) for r in d.get("ranks") or ()),
                   step=d.get("step"), seconds_per_step=d.get("seconds_per_step"),
                   quiet_seconds=d.get("quiet_seconds"), available_ram_bytes=d.get("available_ram_bytes"),
                   total_ram_bytes=d.get("total_ram_bytes"))


def node_rows(probe_records: Sequence[Mapping[str, Any]], beats: Mapping[int, Sequence[Mapping[str, Any]]],
              now: float) -> tuple[NodeRow, ...]:
    """One row per node named by a sidecar record or a rank's beat, in node-name order.

    `beats` maps a rank to its recent beats, oldest first (each {"step", "ts", "node"}).
    """
    ram = {str(r.get("host")): r.get("host_mem") or {} for r in probe_records if r.get("host")}
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
            available_ram_bytes=mem.get("available_ram_bytes"), total_ram_bytes=mem.get("total_ram_bytes")))
    return tuple(rows)


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
    """"node n2 (rank 1): step 40 · 0.41 s/step · free RAM 7.1 GiB": a poll's row for one node."""
    who = f" (rank{'s' if len(row.ranks) != 1 else ''} {', '.join(map(str, row.ranks))})" if row.ranks else ""
    parts = [f"step {MISSING if row.step is None else row.step}",
             f"{MISSING if row.seconds_per_step is None else f'{row.seconds_per_step:.3g}'} s/step",
             f"free RAM {fmt_gib(row.available_ram_bytes)}"]
    if row.quiet_seconds is not None and row.seconds_per_step is not None \
            and row.quiet_seconds > max(10.0, 10 * row.seconds_per_step):
        parts.append(f"no step for {fmt_duration(row.quiet_seconds)}")
    return f"node {row.node}{who}: " + " · ".join(parts)


STOPPED = ("T", "t")  # /proc state of a process stopped by a signal (SIGSTOP) or a debugger


def stacks_by_rank(node_dumps: Sequence[Mapping[str, Any]], last_steps: Mapping[int, int]) -> dict[str, str]:
    """Every rank's stack from every node (each node's `babysit.run.node_stacks` line) as a stall's
    `stacks`: "n2 rank 1 pid 4242" -> its py-spy text; "stalled" names the rank the others wait for — a
    stopped process (state T) first, else the rank whose last finished step is behind the others'
    (`last_steps`: rank -> step, from the ranks' beats); "note" says what could not be dumped."""
    out: dict[str, str] = {}
    notes: list[str] = []
    procs: list[tuple[str, Mapping[str, Any]]] = []
    for dump in sorted(node_dumps, key=lambda d: str(d.get("node"))):
        node = str(dump.get("node") or "?")
        if dump.get("note"):
            notes.append(f"{node}: {dump['note']}")
        for proc in dump.get("procs") or ():
            procs.append((node, proc))
            key = f"{node} rank {proc.get('rank')} pid {proc.get('pid')}"
            out[key] = str(proc.get("stack") or "(no stack: see the note)")
    stopped = [f"rank {p.get('rank')} on {n} (pid {p.get('pid')}): its process is stopped (state "
               f"{p.get('state')}: SIGSTOP or a debugger)" for n, p in procs if p.get("state") in STOPPED]
    behind = _behind(procs, last_steps)
    if stopped or behind:
        out["stalled"] = "; ".join(stopped or behind)
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
