"""Two boxes on one PostgreSQL, on this machine, in about a minute (docs/fleet.md): the same demo as
`babysit demo --fleet` (babysit/demo/fleet.py), runnable from a checkout without installing babysit.

  python examples/fleet_demo.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from babysit.core.errors import BabysitError
from babysit.demo import fleet

if __name__ == "__main__":
    try:
        sys.exit(fleet.main())
    except BabysitError as exc:
        print(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        sys.exit(exc.exit_code)
