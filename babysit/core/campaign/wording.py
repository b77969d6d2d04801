"""A single-delta run asks its own question: its prereg words must not be its parent's copied. Pure.

A child changes one factor of its parent, so what it asks — and what each of its labels means — is
about that factor ("does the climb survive augmentation?"), not the parent's question ("does the drift
reproduce on one CPU?"). A run.toml copied from the parent keeps the parent's text, and its verdict then
speaks with the parent's words ("look at the distributed path" for a question about augmentation).
`register` warns (never refuses: the words do not change the read) for each key whose text is the
parent's, word for word (whitespace aside).
"""

from __future__ import annotations

from babysit.core.spec.prereg import Prereg


def echoed_keys(run: Prereg | None, parent: Prereg | None) -> tuple[str, ...]:
    """The prereg keys of `run` whose text is `parent`'s verbatim: prereg.question, prereg.interpretation.LABEL."""
    if run is None or parent is None:
        return ()
    out = []
    if _same(run.question, parent.question):
        out.append("prereg.question")
    for label, text in run.interpretation.items():
        if label in parent.interpretation and _same(text, parent.interpretation[label]):
            out.append(f"prereg.interpretation.{label}")
    return tuple(out)


def echo_warnings(shown: str, parent: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """One warning a key, naming the file and the key, saying what to do."""
    return tuple(f"{shown}: {key}: its parent {parent}'s text, word for word — a single-delta run asks "
                 "its own question (about the one factor it changes); say what each label means for that factor, "
                 "or its verdict speaks with its parent's words (docs/campaigns.md)" for key in keys)


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split()) and bool(a.strip())
