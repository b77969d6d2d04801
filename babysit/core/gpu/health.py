"""GPU health signals judged: the machine's fault or the trainer's, what to do, whether to stop.

Pure. The probe (babysit/probes/health.py) sees signals — an Xid event, a double-bit ECC event, a
field that rose, an NVML call that blocked — and this module says what each one means:

  side "machine"     — the hardware, firmware or driver: evidence for a `gpu-fault` classification;
                       `stop` ones stop the run at once, the others are incidents;
  side "application" — the trainer's own error (Xid 13/31/43): the GPU stays healthy, nothing is
                       quarantined, the exit is classified as the trainer's (crashed);
  "warn"             — throttling, single-bit errors, PCIe replays, NVLink errors, temperature near its
                       slowdown threshold: one warning each per attempt, never a stop, never evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from babysit.core.gpu import xid as xid_catalog
from babysit.core.readings import GpuReading, GpuSignal

TEMPERATURE_MARGIN_C = 5.0  # warn when the GPU is this close to its slowdown threshold, or closer

# NVML's recovery action values (nvmlDeviceGetFieldValues NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
RECOVERY_ACTIONS = {0: ("none", "none"), 1: ("GPU reset", "reset-gpu"), 2: ("node reboot", "reboot"),
                    3: ("drain peer-to-peer traffic", "reset-gpu"), 4: ("drain and reset", "reset-gpu"),
                    5: ("recover the IMEX domain", "reset-gpu"), 6: ("bus reset", "reset-gpu"),
                    7: ("system reboot", "reboot")}

# clock-event reasons (nvmlClocksEventReason*) that mean the hardware slows the GPU down
THROTTLE_REASONS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                    0x80: "HW power brake"}


@dataclass(frozen=True)
class Assessment:
    side: str  # machine | application | consequence | unknown | warn
    action: str  # xid.ACTIONS
    stop: bool
    name: str  # "Xid 79 (GPU has fallen off the bus)", "double-bit ECC error", "HW thermal slowdown"
    meaning: str

    @property
    def machine(self) -> bool:
        return self.side == "machine"

    @property
    def quarantines(self) -> bool:
        return self.machine and self.action in xid_catalog.QUARANTINE_ACTIONS

    @property
    def action_words(self) -> str:
        return xid_catalog.ACTION_WORDS.get(self.action, self.action)


_FIXED = {
    "ecc-dbe": Assessment("machine", "reset-gpu", True, "double-bit ECC error",
                          "an uncorrectable double-bit error in GPU memory"),
    "ecc-uncorrectable": Assessment("machine", "restart-app", True, "uncorrectable ECC error",
                                    "the volatile uncorrectable ECC count rose: the memory returned bad data "
                                    "(a contained error ends the application; remapped rows pending says "
                                    "whether a reset is needed)"),
    "remap-pending": Assessment("machine", "reset-gpu", False, "remapped rows pending",
                                "a bad memory row waits for its remapping, which takes effect at the next GPU "
                                "reset"),
    "remap-failure": Assessment("machine", "contact-support", True, "row remapping failed",
                                "a bad memory row could not be remapped: the GPU needs replacing"),
    "unavailable": Assessment("machine", "reset-gpu", True, "GPU unavailable",
                              "the driver marked the GPU unavailable"),
    "lost": Assessment("machine", "reboot", True, "GPU lost", "NVML reports the GPU lost (fallen off the bus?)"),
    "unresponsive": Assessment("machine", "reset-gpu", False, "GPU unresponsive",
                               "an NVML call on this GPU did not return in time (a degrading GPU or driver)"),
    "ecc-sbe": Assessment("warn", "none", False, "single-bit ECC errors",
                          "corrected single-bit memory errors: corrected, but a sign of degrading memory"),
    "ecc-sbe-storm": Assessment("warn", "none", False, "single-bit ECC storm",
                                "a storm of corrected single-bit errors: the memory is degrading"),
    "pcie-replay": Assessment("warn", "none", False, "PCIe replays",
                              "PCIe packets resent after link errors: a marginal link or riser (slower transfers)"),
    "nvlink-errors": Assessment("warn", "none", False, "NVLink errors",
                                "NVLink CRC, replay or recovery errors: a marginal link (slower collectives)"),
    "temperature": Assessment("warn", "none", False, "temperature near slowdown",
                              "the GPU is within a few degrees of its slowdown threshold: check the cooling"),
    "throttle": Assessment("warn", "none", False, "clocks slowed by the hardware",
                           "the hardware slows the clocks (thermal, power brake): steps get slower"),
}


def assess(signal: GpuSignal) -> Assessment:
    """What `signal` means (see the module docstring)."""
    if signal.kind == "xid":
        entry = xid_catalog.lookup(signal.code or 0)
        return Assessment(entry.side, entry.action, entry.stop and entry.machine, f"Xid {entry.code} ({entry.name})",
                          entry.meaning)
    if signal.kind == "recovery-action":
        words, action = RECOVERY_ACTIONS.get(int(signal.code or 0), (f"action {signal.code}", "reset-gpu"))
        return Assessment("machine", action, True, f"driver recovery action: {words}",
                          f"the driver prescribes a {words} for this GPU")
    if signal.kind == "throttle":
        mask = int(signal.value or 0)
        reasons = [name for bit, name in THROTTLE_REASONS.items() if mask & bit] or ["hardware slowdown"]
        base = _FIXED["throttle"]
        return Assessment("warn", "none", False, ", ".join(reasons), base.meaning)
    found = _FIXED.get(signal.kind)
    if found is not None:
        return found
    return Assessment("unknown", "none", False, signal.kind, signal.text or signal.kind)


def describe(index: int, signal: GpuSignal, node: str | None = None) -> str:
    """One line for an incident: "GPU 1: Xid 79 (GPU has fallen off the bus) — the machine's fault: reboot";
    "GPU 1 on n2: …" for a GPU of a job across nodes."""
    a = assess(signal)
    who = {"machine": "the machine's fault", "application": "the trainer's own error, the GPU stays healthy",
           "consequence": "a follow-on of an earlier error", "warn": "a warning",
           "unknown": "not in babysit's Xid catalog"}[a.side]
    value = "" if signal.value is None or signal.kind in ("throttle",) else f" ({_num(signal.value)})"
    return f"GPU {index}{f' on {node}' if node else ''}: {a.name}{value} — {a.meaning}; {who}" + (
        f": {a.action_words}" if a.action != "none" else "")


# the probes' fault texts (GpuReading.faults; a simulated GPU file writes them): "xid 79", "device lost"
_TEXT = (
    (re.compile(r"xid (\d+)", re.I), lambda m: GpuSignal("xid", code=int(m.group(1)), text=m.group(0))),
    (re.compile(r"ecc double-bit", re.I), lambda m: GpuSignal("ecc-dbe", text=m.group(0))),
    (re.compile(r"ecc uncorrectable volatile (\d+)", re.I),
     lambda m: GpuSignal("ecc-uncorrectable", value=float(m.group(1)), text=m.group(0))),
    (re.compile(r"device lost", re.I), lambda m: GpuSignal("lost", text=m.group(0))),
    (re.compile(r"unresponsive", re.I), lambda m: GpuSignal("unresponsive", text=m.group(0))),
    (re.compile(r"unavailable", re.I), lambda m: GpuSignal("unavailable", text=m.group(0))),
    (re.compile(r"remap(?:ped rows)? pending", re.I), lambda m: GpuSignal("remap-pending", text=m.group(0))),
    (re.compile(r"remap(?:ping)? fail", re.I), lambda m: GpuSignal("remap-failure", text=m.group(0))),
)


def parse_fault(text: str) -> GpuSignal:
    """A probe's fault text as a signal; a text no pattern knows is an `unknown` signal carrying it."""
    for pattern, make in _TEXT:
        m = pattern.search(text)
        if m:
            return make(m)
    return GpuSignal("unknown", text=text)


def signals_of(reading: GpuReading) -> tuple[GpuSignal, ...]:
    """A reading's signals: the probe's own (NVML), else its fault texts parsed (a simulated GPU file)."""
    if reading.signals:
        return reading.signals
    return tuple(parse_fault(f) for f in reading.faults)


def evidence(reading: GpuReading, signal: GpuSignal, at: float | None) -> dict[str, object]:
    """What an attempt's detail records of a signal: enough to blame, quarantine and say why."""
    return evidence_of(reading.index, reading.uuid, signal, at, reading.node)


def evidence_of(index: int, uuid: str, signal: GpuSignal, at: float | None,
                node: str | None = None) -> dict[str, object]:
    """`node`: the GPU's node on a job across nodes, kept so that the machine at fault is known by name."""
    a = assess(signal)
    return {"gpu": index, "uuid": uuid, "kind": signal.kind, "xid": signal.code
            if signal.kind == "xid" else None, "code": signal.code, "value": signal.value,
            "at": signal.at if signal.at is not None else at, "name": a.name, "meaning": a.meaning,
            "side": a.side, "action": a.action, "action_words": a.action_words, "quarantine": a.quarantines,
            **({"node": node} if node else {})}


def machine_evidence(items: Iterable[dict[str, object]]) -> list[dict[str, object]]:
    """The machine-side items of recorded evidence, once each (gpu, kind, code, node)."""
    seen: dict[tuple[object, ...], dict[str, object]] = {}
    for item in items:
        if item.get("side") == "machine":
            seen.setdefault((item.get("gpu"), item.get("kind"), item.get("code"), item.get("node")), dict(item))
    return list(seen.values())


def fault_nodes(items: Iterable[dict[str, object]]) -> list[str]:
    """The nodes machine-side evidence names (a job across nodes), sorted: the machines at fault."""
    return sorted({str(e["node"]) for e in machine_evidence(items) if e.get("node")})


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
