"""Both backends are the interface the shell asks for (babysit/db/interface.py), signature for signature."""

from __future__ import annotations

import inspect

from babysit.db.interface import StateStore
from babysit.db.store import Store

MEMBERS = [n for n, v in vars(StateStore).items() if callable(v) and not n.startswith("_")]


def test_the_interface_names_every_public_method_of_the_store() -> None:
    # Store and the table groups it is made of (babysit/db/facts.py, polls.py, …): every class of its MRO of ours
    ours = [cls for cls in Store.__mro__ if cls.__module__.startswith("babysit.")]
    assert len(ours) > 1
    public = {n for cls in ours for n, v in vars(cls).items() if callable(v) and not n.startswith("_")
              and n != "in_dir" and not isinstance(v, type)}
    assert public - set(MEMBERS) == set(), "a store method missing from StateStore"
    assert len(MEMBERS) >= 60


def test_sqlite_and_postgresql_stores_match_the_interface_signature_for_signature() -> None:
    from babysit.db.postgres import PostgresStore

    for cls in (Store, PostgresStore):
        for name in MEMBERS:
            ours = inspect.signature(getattr(cls, name))
            declared = inspect.signature(getattr(StateStore, name))
            assert list(ours.parameters) == list(declared.parameters), (cls.__name__, name)
            assert str(ours.return_annotation) == str(declared.return_annotation) or name in (
                "tx", "batch", "deferred_readings"), (cls.__name__, name)
