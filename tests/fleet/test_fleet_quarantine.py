"""A GPU quarantine is its box's: on one PostgreSQL, box-a's quarantined GPU 0 keeps no run of box-b off
its own GPU 0, is not listed by box-b, and cannot be released from box-b by index or by UUID."""

from __future__ import annotations

from babysit.db.postgres import PostgresStore
from babysit.run import gpufault


def test_each_box_sees_and_releases_only_its_own_quarantined_gpus(pg_url: str) -> None:
    box_a, box_b = PostgresStore(pg_url, host="box-a"), PostgresStore(pg_url, host="box-b")
    try:
        assert box_a.quarantine_gpu("GPU-a0", 0, "Xid 79: fell off the bus", {"xid": 79}, 1.0, run="ra")
        assert list(box_a.quarantined_gpus()) == ["GPU-a0"]
        assert box_b.quarantined_gpus() == {}  # box-b's GPU 0 is another GPU
        assert gpufault.release_target(box_b, "0", {0: "GPU-b0"}) is None  # the index names box-b's own GPU
        assert not box_b.release_gpu("GPU-a0")  # nor can box-b lift box-a's by its UUID
        assert box_b.quarantine_gpu("GPU-b0", 0, "double-bit ECC", {}, 2.0)
        assert list(box_a.quarantined_gpus()) == ["GPU-a0"] and list(box_b.quarantined_gpus()) == ["GPU-b0"]
        assert gpufault.release_target(box_a, "0", {}) == "GPU-a0" and box_a.release_gpu("GPU-a0")
        assert box_a.quarantined_gpus() == {} and list(box_b.quarantined_gpus()) == ["GPU-b0"]
    finally:
        box_a.close()
        box_b.close()
