"""What the general reader (babysit/core/reading/printed.py) costs a printed line, through the real stdout source with
`preset = "auto"`: every preset tried first, then the general reader, as `babysit run` reads.

  python bench/general_reader.py             # 100,000 lines a shape, ~30 s here
  python bench/general_reader.py --lines 20000

Shapes: tqdm frames with a postfix (`epoch 1:  50%|█████| 50/100 [00:01<00:01, 99.00it/s, loss=0.5]`, drawn
with `\\r`) and `step N | loss X | lr 0.001` lines. Prints µs a line and that every line became a record.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from babysit.core.spec.source import parse_source
from babysit.core.spec.tomlfile import Table
from babysit.sources import stdout


def shape_lines(shape: str, n: int) -> str:
    if shape == "tqdm":
        return "\r".join(f"epoch 1: {k * 100 // n:3d}%|████      | {k}/{n} [00:01<00:02, 99.00it/s, loss={1 / k:.4f}]"
                         for k in range(1, n + 1)) + "\n"
    return "".join(f"step {k} | loss {1 / k:.4f} | lr 0.001\n" for k in range(1, n + 1))


def one(shape: str, n: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "attempt-1").mkdir()
        (run / "attempt-1" / "stdout.log").write_text(shape_lines(shape, n))
        source = parse_source(Table({"kind": "stdout", "preset": "auto"}, "run.toml"), workdir=run, name="b", log=None)
        state: dict = {}
        records = 0
        started = time.process_time()
        while True:
            got = stdout.read(source, run, state, final=True)
            state, records = got.state or {}, records + len(got.items)
            if not got.more:
                break
        return time.process_time() - started, records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=100_000)
    a = p.parse_args(argv)
    print(f"{'shape':8s} {'lines':>8s} {'records':>8s} {'µs a line':>10s}")
    for shape in ("tqdm", "pipes"):
        cpu, records = one(shape, a.lines)
        print(f"{shape:8s} {a.lines:8d} {records:8d} {cpu / a.lines * 1e6:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
