"""The order tests/conftest.py gives an xdist session: every worker's first block starts on long files."""

from __future__ import annotations

from dataclasses import dataclass

from tests.conftest import deal


@dataclass(frozen=True)
class Item:
    nodeid: str


def collection(long_files: dict[str, int], short: int) -> list[Item]:
    items = [Item(f"{path}::t{i}") for path, n in long_files.items() for i in range(n)]
    return items + [Item(f"tests/test_short.py::t{i}") for i in range(short)]


def is_long(item: Item) -> bool:
    return not item.nodeid.startswith("tests/test_short.py")


def blocks(items: list[Item], workers: int) -> list[list[Item]]:
    """xdist's worksteal split: worker i first gets the i-th contiguous block."""
    out, left = [], list(items)
    for i in range(workers):
        n = len(left) // (workers - i)
        out.append(left[:n])
        left = left[n:]
    return out


def test_each_workers_first_block_starts_with_every_third_long_file_whole() -> None:
    items = collection({"tests/a.py": 2, "tests/b.py": 1, "tests/c.py": 3, "tests/d.py": 1, "tests/e.py": 2}, 40)
    dealt = deal(items, 3, is_long)
    assert sorted(i.nodeid for i in dealt) == sorted(i.nodeid for i in items)  # every test once
    heads = []
    for block in blocks(dealt, 3):
        head = [i.nodeid.split("::")[0] for i in block if is_long(i)]
        assert block[:len(head)] == [i for i in block if is_long(i)], "long files first in the block"
        heads.append(list(dict.fromkeys(head)))
    assert heads == [["tests/a.py", "tests/d.py"], ["tests/b.py", "tests/e.py"], ["tests/c.py"]]
    a = [n for n, i in enumerate(dealt) if i.nodeid.startswith("tests/a.py")]
    assert a == list(range(a[0], a[0] + 2)), "a file stays whole: its module fixtures are built once"


def test_long_files_that_do_not_fit_a_block_leave_the_order_as_it_was() -> None:
    items = collection({"tests/a.py": 30, "tests/b.py": 1}, 5)
    assert deal(items, 3, is_long) == items
