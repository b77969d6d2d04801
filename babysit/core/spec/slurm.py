"""run.toml's [slurm]: the sbatch options of a run whose executor is Slurm, and its time limit read.

Its own module because only the Slurm executor reads it (babysit/executors/slurm*.py), and the time
limit's grammar and warning are Slurm's, not babysit's. The rest of run.toml is run_toml.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from babysit.core.spec.tomlfile import Table


@dataclass(frozen=True)
class SlurmSpec:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1
    gpus_per_node: int | None = None  # default: len(run.gpus)
    gres: str | None = None  # e.g. "gpu:h200:8"; default derived from gpus_per_node
    time_limit: str | None = None  # sbatch --time, e.g. "12:00:00"
    cpus_per_task: int | None = None
    mem: str | None = None
    sbatch_options: tuple[str, ...] = ()
    torchrun: bool | None = None  # None: wrap in torchrun when more than one GPU per node or several nodes
    time_limit_warning_seconds: int | None = None  # with time_limit: the trainer is stopped this long before
    # it and the run continues in a new job from its checkpoint (sbatch --signal); None: `warning_seconds`

    def warning_seconds(self) -> int | None:
        """Seconds before the time limit the trainer is stopped: as written, else 300 s or a tenth of
        the limit when that is shorter; None without a time limit."""
        if self.time_limit is None:
            return None
        if self.time_limit_warning_seconds is not None:
            return self.time_limit_warning_seconds
        return max(1, min(300, slurm_seconds(self.time_limit) // 10))


def slurm_seconds(text: str) -> int:
    """A Slurm time limit in seconds: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS"."""
    days, _, clock = text.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, s = (*parts, 0, 0)[:3]
    elif len(parts) == 3:  # HH:MM:SS
        h, m, s = parts
    else:  # MM[:SS]
        h, m, s = 0, parts[0], parts[1] if len(parts) > 1 else 0
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def parse_slurm(t: Table | None) -> SlurmSpec | None:
    if t is None:
        return None
    s = SlurmSpec(
        partition=t.str("partition", None),
        account=t.str("account", None),
        qos=t.str("qos", None),
        nodes=t.int("nodes", 1, minimum=1),
        gpus_per_node=t.int("gpus_per_node", None, minimum=0),
        gres=t.str("gres", None),
        time_limit=t.str("time_limit", None, check=re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}").fullmatch,
                         expected='a Slurm time limit such as "12:00:00" or "1-00:00:00"'),
        cpus_per_task=t.int("cpus_per_task", None, minimum=1),
        mem=t.str("mem", None),
        sbatch_options=t.str_list("sbatch_options", ()),
        torchrun=t.bool("torchrun", None),
        time_limit_warning_seconds=t.int("time_limit_warning_seconds", None, minimum=1),
    )
    if s.time_limit_warning_seconds is not None and (
            s.time_limit is None or s.time_limit_warning_seconds >= slurm_seconds(s.time_limit)):
        raise t.error("time_limit_warning_seconds", f"a number of seconds under time_limit "
                      f"({s.time_limit or 'not set'})", s.time_limit_warning_seconds)
    t.finish()
    return s
