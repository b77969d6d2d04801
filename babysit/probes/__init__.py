"""Probes: the only code that touches NVML (`gpu`) and psutil (`host`).

Each probe returns frozen readings in which "not measured" is an explicit state (None, or
`GpuView.available = False` with a reason), never a value that looks fine. Decisions over the
readings live in `babysit.core.guards` and `babysit.core.snapshot`, which import no probe library.
"""
