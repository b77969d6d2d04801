"""NVIDIA's Xid catalog as data (babysit/core/gpu/xid_catalog.toml, which cites its source): what an Xid
means, whether the application or the machine is at fault, and the action the catalog prescribes.

Pure: the catalog is a package data file read once at import; `lookup` never fails (an Xid the
catalog does not list is `unknown`: said as such, never blamed on either side).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType

from babysit.core.spec.tomlfile import tomllib  # the TOML parser (tomli below Python 3.11)

SIDES = ("application", "machine", "consequence", "unknown")
ACTIONS = ("none", "restart-app", "reset-gpu", "reboot", "contact-support")
QUARANTINE_ACTIONS = ("reset-gpu", "reboot", "contact-support")  # the GPU is not fit for the next attempt
ACTION_WORDS = {"none": "no action needed", "restart-app": "restart the application",
                "reset-gpu": "reset the GPU (`nvidia-smi -r -i N` with nothing running on it)",
                "reboot": "reboot the machine", "contact-support": "drain the GPU and contact support (RMA)"}
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/index.html"


@dataclass(frozen=True)
class XidEntry:
    code: int
    name: str
    meaning: str
    side: str  # application | machine | consequence | unknown
    action: str  # ACTIONS
    stop: bool  # babysit stops the run when it sees this Xid on one of its GPUs

    @property
    def machine(self) -> bool:
        return self.side == "machine"

    @property
    def quarantines(self) -> bool:
        return self.machine and self.action in QUARANTINE_ACTIONS


def _load() -> MappingProxyType:
    text = resources.files("babysit.core.gpu").joinpath("xid_catalog.toml").read_text(encoding="utf-8")
    out = {}
    for key, row in tomllib.loads(text)["xid"].items():
        entry = XidEntry(int(key), str(row["name"]), str(row["meaning"]), str(row["side"]), str(row["action"]),
                         bool(row["stop"]))
        if entry.side not in SIDES or entry.action not in ACTIONS:  # the package's own file: a bug, loudly
            raise ValueError(f"babysit/core/gpu/xid_catalog.toml: xid.{key}: side {entry.side!r} or action "
                             f"{entry.action!r} not one of {SIDES} / {ACTIONS}")
        out[entry.code] = entry
    return MappingProxyType(out)


CATALOG = _load()


def lookup(code: int) -> XidEntry:
    """The catalog's entry for Xid `code`; an unlisted code is `unknown` (no side blamed, no stop)."""
    found = CATALOG.get(int(code))
    if found is not None:
        return found
    return XidEntry(int(code), f"Xid {code}", f"Xid {code} is not in babysit's catalog: look it up at {CATALOG_URL}",
                    "unknown", "none", False)


# The kernel log's line, as the trainer's stderr or dmesg shows it: "NVRM: Xid (PCI:0000:18:00): 79, pid=…"
_XID_TEXT = re.compile(r"\bXid\b(?:\s*\([^)]*\))?\s*:?\s*(\d+)", re.I)


def codes_in(text: str) -> tuple[int, ...]:
    """The Xid codes a text names ("NVRM: Xid (PCI:0000:18:00): 79, ..." → (79,)), in order, once each."""
    return tuple(dict.fromkeys(int(m.group(1)) for m in _XID_TEXT.finditer(text)))
