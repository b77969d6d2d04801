"""The Xid catalog as data, the health signals judged, and the GPU choice around a quarantined GPU: pure."""

from __future__ import annotations

import pytest

from babysit.core.gpu import choice as gpuchoice
from babysit.core.gpu import health as gpuhealth
from babysit.core.gpu import xid
from babysit.core.readings import GpuSignal


@pytest.mark.parametrize("code", [13, 31, 43])
def test_the_trainers_xids_leave_the_gpu_healthy(code: int) -> None:
    e = xid.lookup(code)
    assert (e.side, e.action, e.stop, e.quarantines) == ("application", "restart-app", False, False)


@pytest.mark.parametrize(("code", "action"), [(48, "reset-gpu"), (62, "reset-gpu"), (64, "reset-gpu"),
                                              (79, "reboot"), (95, "reset-gpu"), (119, "reset-gpu"),
                                              (120, "reset-gpu")])
def test_the_machines_xids_stop_and_quarantine(code: int, action: str) -> None:
    e = xid.lookup(code)
    assert (e.side, e.action, e.stop, e.quarantines) == ("machine", action, True, True)


def test_a_contained_ecc_error_restarts_the_app_without_quarantine() -> None:
    e = xid.lookup(94)
    assert (e.side, e.action, e.stop, e.quarantines) == ("machine", "restart-app", True, False)


def test_an_unlisted_xid_is_unknown_and_blames_nobody() -> None:
    e = xid.lookup(9999)
    assert (e.side, e.stop) == ("unknown", False) and xid.CATALOG_URL in e.meaning


def test_the_catalog_file_cites_nvidia() -> None:
    from importlib import resources

    text = resources.files("babysit.core.gpu").joinpath("xid_catalog.toml").read_text()
    assert "https://docs.nvidia.com/deploy/xid-errors/index.html" in text


def test_xid_codes_are_read_from_the_kernel_logs_words() -> None:
    text = "NVRM: Xid (PCI:0000:18:00): 79, pid=123, GPU has fallen off the bus.\nXid 13: graphics exception\nXid 79"
    assert xid.codes_in(text) == (79, 13)


@pytest.mark.parametrize(("signal", "side", "stop", "action"), [
    (GpuSignal("xid", code=31), "application", False, "restart-app"),
    (GpuSignal("xid", code=79), "machine", True, "reboot"),
    (GpuSignal("xid", code=63), "machine", False, "reset-gpu"),
    (GpuSignal("ecc-dbe"), "machine", True, "reset-gpu"),
    (GpuSignal("remap-failure"), "machine", True, "contact-support"),
    (GpuSignal("remap-pending", value=1), "machine", False, "reset-gpu"),
    (GpuSignal("recovery-action", code=2), "machine", True, "reboot"),
    (GpuSignal("unresponsive"), "machine", False, "reset-gpu"),
    (GpuSignal("lost"), "machine", True, "reboot"),
    (GpuSignal("throttle", value=0x80), "warn", False, "none"),
    (GpuSignal("temperature", value=2), "warn", False, "none"),
    (GpuSignal("pcie-replay", value=5), "warn", False, "none"),
    (GpuSignal("nvlink-errors", value=5), "warn", False, "none"),
    (GpuSignal("ecc-sbe", value=5), "warn", False, "none"),
])
def test_each_signal_is_judged(signal: GpuSignal, side: str, stop: bool, action: str) -> None:
    a = gpuhealth.assess(signal)
    assert (a.side, a.stop, a.action) == (side, stop, action)


def test_a_throttle_names_its_reasons() -> None:
    assert gpuhealth.assess(GpuSignal("throttle", value=0x40 | 0x80)).name == "HW thermal slowdown, HW power brake"


@pytest.mark.parametrize(("text", "kind"), [("xid 79", "xid"), ("ecc double-bit", "ecc-dbe"),
                                            ("ecc uncorrectable volatile 2", "ecc-uncorrectable"),
                                            ("device lost", "lost"), ("something else", "unknown")])
def test_the_probes_fault_texts_parse(text: str, kind: str) -> None:
    assert gpuhealth.parse_fault(text).kind == kind


UUIDS = {0: "A", 1: "B", 2: "C", 3: "D"}


@pytest.mark.parametrize(("declared", "any_gpu", "spares", "quarantined", "held", "gpus", "waiting"), [
    ((0, 1), False, (), set(), (), (0, 1), ()),
    ((0, 1), False, (), {"A"}, (), None, (0,)),
    ((0, 1), False, (2,), {"B"}, (), (0, 2), ()),
    ((0, 1), False, (2,), {"B", "C"}, (), None, (1,)),
    ((0,), True, (), {"A"}, {1}, (2,), ()),  # a held GPU is no stand-in
    ((0, 1), True, (), {"A", "B", "C"}, (), None, (0, 1)),
])
def test_the_gpu_choice(declared, any_gpu, spares, quarantined, held, gpus, waiting) -> None:
    c = gpuchoice.choose(declared, any_gpu=any_gpu, spares=spares, uuids=UUIDS, quarantined=quarantined, held=held)
    assert (c.gpus, c.waiting_for) == (gpus, waiting)
