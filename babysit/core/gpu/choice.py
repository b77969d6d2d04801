"""Which GPUs an attempt runs on when some of the declared ones are quarantined. Pure.

A run declares `gpus = [0, 1]` (those GPUs, and only those), `gpus = "any N"` (any N healthy GPUs of
the box) or a list with `spare_gpus` (stand-ins, in order, for a quarantined one). A quarantined GPU
(a machine fault hit it: babysit/core/gpu/health.py) is never chosen; a GPU another process holds is
not chosen as a stand-in. When no healthy choice exists the run waits for the GPU, and says which.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuChoice:
    gpus: tuple[int, ...] | None  # None: no healthy choice now, wait
    note: str | None  # what changed, for the launch message ("GPU 0 quarantined: on GPU 1 instead")
    waiting_for: tuple[int, ...] = ()  # the quarantined GPUs a waiting run needs


def choose(declared: Sequence[int], *, any_gpu: bool, spares: Sequence[int], uuids: Mapping[int, str],
           quarantined: Collection[str], held: Collection[int] = ()) -> GpuChoice:
    """The attempt's GPUs. `uuids`: index -> UUID of every GPU the box shows (a GPU not shown cannot be
    chosen as a stand-in); `held`: GPUs with another process on them."""
    bad = [g for g in declared if uuids.get(g) in quarantined]
    if not bad:
        return GpuChoice(tuple(declared), None)
    pool = [g for g in (sorted(uuids) if any_gpu else spares) if g not in declared]
    stand_ins = [g for g in pool if uuids.get(g) not in quarantined and g not in held and g in uuids]
    if (any_gpu or spares) and len(stand_ins) >= len(bad):
        swap = dict(zip(bad, stand_ins, strict=False))
        chosen = tuple(swap.get(g, g) for g in declared)
        said = ", ".join(f"GPU {b} → GPU {swap[b]}" for b in bad)
        return GpuChoice(tuple(sorted(chosen)) if any_gpu else chosen,
                         f"quarantined GPU replaced: {said}")
    return GpuChoice(None, None, tuple(bad))
