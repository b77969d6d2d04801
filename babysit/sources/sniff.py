"""A run whose JSONL log stays empty while it prints: are its printed lines a format a preset reads?

Asked once, at the run's first poll (and its answer kept for `babysit status`): the captured stdout and
stderr so far are read with `preset = "auto"`, as a stdout source would read them, and the answer says
what to write in run.toml — or that no preset matched, a line none did, and a pattern that would.
"""

from __future__ import annotations

from pathlib import Path

from babysit.core.reading import presets
from babysit.core.reading.suggest import suggest
from babysit.core.spec.source import parse_source
from babysit.core.spec.tomlfile import Table
from babysit.sources import kinds, stdout
from babysit.sources.lines import WINDOW_BYTES

AUTO = parse_source(Table({"kind": "stdout", "preset": "auto"}, "babysit", "source"), workdir=Path("."),
                    name="sniff", log=None)


def sniff(run_dir: Path) -> str | None:
    """What the run's printed lines say about reading them, or None when it printed nothing yet."""
    reader = kinds.adapter(AUTO.kind).reader(AUTO, run_dir, "sniff")  # as the registry's stdout kind reads them
    got = reader.read({}, stdout.captured_files(run_dir), WINDOW_BYTES, False)
    chosen = [name for kind, name in got.notices if kind == "preset"]
    if chosen:
        name = chosen[-1]
        return (f'📄 no record in its log ($BABYSIT_LOG) yet, but its printed lines match preset "{name}" '
                f'({presets.load(name).get("description", name)}): [source] kind = "stdout", preset = "{name}" '
                "in run.toml reads them (docs/your-trainer.md)")
    if not got.lines:
        return None
    tried = ", ".join(n for n, _ in AUTO.candidates)
    would = suggest(got.sample) if got.sample else None
    return (f"📄 no record in its log ($BABYSIT_LOG) yet, and no preset matches its printed lines (tried {tried})"
            + (f"; a line: {got.sample!r}; a pattern that would read it: [source] kind = \"stdout\", "
               f"[[source.patterns]] regex = '{would}'" if would else "") + " (docs/your-trainer.md)")
