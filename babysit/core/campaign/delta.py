"""The difference between a run and its parent, factor by factor, and the single-delta rule. Pure.

A factor is one thing a run could change: a command-line flag (the command with attempt 1's profile
args, as launched, the run's own name written `{name}` so an output path is not a delta), an
environment variable, the GPU count, the executor, a Slurm shape, the fallback profiles. Factors the
run declares platform-only (`[campaign].platform`) or that are its `[machinery].knobs` (throughput
only) are shown and not counted. The factors of the suspect the run tests count as ONE delta (the
seed's "the ONLY delta is the distributed machinery" is GPUs, torchrun and a flag together); every
other changed factor is one more. More than one delta is refused unless the run says `multi_delta`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from babysit.core.campaign.spec import Campaign, RunLink
from babysit.core.errors import BadInput
from babysit.core.spec.run_toml import RunSpec

BARE = "(set)"  # a flag without a value
ABSENT = "(absent)"


class MultiDeltaRefused(BadInput):
    """A campaign run changes more than one factor beyond its declared platform deltas (exit 2)."""


@dataclass(frozen=True)
class Factor:
    name: str  # "--batch-size", "env.NCCL_ALGO", "gpus", "executor", "slurm.nodes", "program", "fallback profiles"
    old: str
    new: str
    role: str = "delta"  # "suspect" (covered by the suspect tested) | "platform" | "delta" (one more)
    suspect: str | None = None  # the campaign suspect whose factors include this one

    def __str__(self) -> str:
        owner = f" (suspect {self.suspect})" if self.suspect else ""
        return f"{self.name}: {self.old} → {self.new}{owner}"


@dataclass(frozen=True)
class Delta:
    run: str
    parent: str
    suspect: str | None
    factors: tuple[Factor, ...]
    multi_delta: bool = False

    @property
    def counted(self) -> tuple[str, ...]:
        """The deltas, one per name: the suspect tested (however many of its factors changed), then the rest."""
        tested = [f"suspect {self.suspect}"] if any(f.role == "suspect" for f in self.factors) else []
        return (*tested, *(str(f) for f in self.factors if f.role == "delta"))

    @property
    def refused(self) -> bool:
        return len(self.counted) > 1 and not self.multi_delta

    def lines(self) -> list[str]:
        """What `register` prints: every factor with its role."""
        if not self.factors:
            return [f"  no factor differs from '{self.parent}': a replication"]
        tag = {"suspect": "the delta tested", "platform": "declared platform-only", "delta": "ANOTHER DELTA"}
        return [f"  {f}   [{tag[f.role]}]" for f in self.factors]

    def summary(self) -> str:
        """One line: what the run changed (the campaign table's "changed" column)."""
        changed = [f for f in self.factors if f.role != "platform"]
        return "; ".join(f"{f.name} {f.old} → {f.new}" for f in changed) or "nothing (a replication)"


def compute(run: RunSpec, parent: RunSpec, link: RunLink, campaign: Campaign) -> Delta:
    """Every factor that differs between `parent` and `run`, each with its role."""
    platform = set(link.platform) | set(run.machinery_knobs)
    tested = campaign.suspect(link.suspect) if link.suspect else None
    covers = {f: s.name for s in campaign.suspects for f in s.covers}
    factors = []
    for name, old, new in raw_factors(parent, run):
        if name in platform:
            role, owner = "platform", None
        elif tested is not None and name in tested.covers:
            role, owner = "suspect", tested.name
        else:
            role, owner = "delta", covers.get(name)
        factors.append(Factor(name, old, new, role, owner))
    return Delta(run.name, parent.name, link.suspect, tuple(factors), link.multi_delta)


def refusal(delta: Delta, shown: str) -> MultiDeltaRefused:
    counted = delta.counted
    return MultiDeltaRefused(
        f"{shown}: {len(counted)} deltas vs parent '{delta.parent}' beyond the declared platform deltas: "
        + "; ".join(counted) + " — a single-delta run changes one",
        hint="change one factor; declare the others platform-only in [campaign].platform when they do not touch "
             "training math, or set [campaign].multi_delta = true for a deliberate multi-delta run "
             "(docs/campaigns.md)")


def raw_factors(parent: RunSpec, run: RunSpec) -> list[tuple[str, str, str]]:
    """(name, old, new) for every factor that differs, in a fixed order."""
    out: list[tuple[str, str, str]] = []
    old_pos, old_flags = parse_argv(launch_argv(parent))
    new_pos, new_flags = parse_argv(launch_argv(run))
    if old_pos != new_pos:
        out.append(("program", " ".join(old_pos), " ".join(new_pos)))
    for flag in sorted(old_flags.keys() | new_flags.keys()):
        a, b = old_flags.get(flag, ABSENT), new_flags.get(flag, ABSENT)
        if a != b:
            out.append((flag, a, b))
    for key in sorted(parent.env.keys() | run.env.keys()):
        a, b = parent.env.get(key, ABSENT), run.env.get(key, ABSENT)
        if a != b:
            out.append((f"env.{key}", a, b))
    if len(parent.gpus) != len(run.gpus):
        out.append(("gpus", _gpus(parent), _gpus(run)))
    if parent.executor != run.executor:
        out.append(("executor", parent.executor, run.executor))
    for key in ("nodes", "gpus_per_node", "torchrun") if parent.slurm and run.slurm else ():  # else: "executor"
        a, b = _slurm(parent, key), _slurm(run, key)
        if a != b:
            out.append((f"slurm.{key}", a, b))
    old_fb, new_fb = _fallbacks(parent), _fallbacks(run)
    if old_fb != new_fb:
        out.append(("fallback profiles", old_fb, new_fb))
    return out


def launch_argv(spec: RunSpec) -> list[str]:
    """Attempt 1's argv as written, the run's own name put back as {name} where it is a path segment
    (outputs/disc/log.jsonl); a flag's whole value that happens to equal the name is left as it is."""
    own = re.compile(r"(?<=/)" + re.escape(spec.name) + r"(?=/|$)|^" + re.escape(spec.name) + r"(?=/)")
    return [own.sub("{name}", a) for a in (*spec.command, *spec.profile_for(1).args)]


def parse_argv(argv: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """Leading words (the program), then flags: "--f v", "--f=v" or a bare "--f"; the last one written wins."""
    positional: list[str] = []
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if _is_flag(word):
            if "=" in word and word.startswith("--"):
                flag, value = word.split("=", 1)
            elif i + 1 < len(argv) and not _is_flag(argv[i + 1]):
                flag, value = word, argv[i + 1]
                i += 1
            else:
                flag, value = word, BARE
            flags[flag] = value
        elif flags:
            last = next(reversed(flags))
            flags[last] = f"{flags[last]} {word}" if flags[last] != BARE else word  # "--f a b": one value
        else:
            positional.append(word)
        i += 1
    return tuple(positional), flags


def _is_flag(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False  # "-1", "-0.5": a negative number is a value


def _gpus(spec: RunSpec) -> str:
    return f"{len(spec.gpus)} GPU" + ("s" if len(spec.gpus) != 1 else "") if spec.gpus else "CPU"


def _slurm(spec: RunSpec, key: str) -> str:
    if spec.slurm is None:
        return ABSENT
    value = getattr(spec.slurm, key)
    return ABSENT if value is None else str(value)


def _fallbacks(spec: RunSpec) -> str:
    rest = spec.attempts[1:]
    return "; ".join(f"{p.profile} {' '.join(p.args)}".strip() for p in rest) or "none"
