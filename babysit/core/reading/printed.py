"""The general printed-metrics reader: a step and metrics from a line a trainer printed, zero configuration.

`babysit run -- CMD` must read what trainers really print, not only the formats a preset knows. This
reader takes one line at a time (colour codes already stripped) and finds three things in it:

- a **counter**: `step`, `steps`, `iter`, `iteration`, `it`, `global_step`, `num_updates`, `batch` then an
  integer (`step 10`, `iter: 10`, `Step [100/600]`, `batch 20/100`, `Iter(train) [50/4000]`), a bare
  `b/B` at the start of a line (Keras), a tqdm bar's `| b/B [`, or a bracketed `[b/B]`;
- an **epoch**: `epoch 2`, `Epoch [1/5]`, `Epoch 1/3`, `epoch 001:`, `Epoch(train) [1]`, `Train Epoch: 1`;
- **metrics**: `name value`, `name=value`, `name: value`, separated by spaces, `|`, `,`, `;`, tabs or ` - `.

The step is the trainer's progress (`Progress`): a counter as printed while it only grows; a counter that
restarts each epoch counts on, as (epoch − base) × L + counter, L the counter's printed total or else the
largest value seen in an epoch. A step is never allowed to go backwards silently: a notice says it.
docs/your-trainer.md ("The general reader") is the user's version of these rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
NONFINITE = r"[-+]?(?:nan|inf(?:inity)?)(?:\.0+)?"  # Lightning's bar prints `nan.0`

# Noise that is never a metric: dates and clock times (a log prefix, tqdm's elapsed<remaining, an eta),
# log levels. Replaced by a separator, so the words around them do not join into one name.
_NOISE = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"  # 2024-05-01 12:00:00,123
    r"|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}(?=\s+\d{1,2}:\d{2})"  # 2024-05-01; 12/01 before a clock time
    r"|\b\d+:\d{2}(?::\d{2})?(?:[.,]\d+)?\b|<\?|\?<|\d+:\d{2}<"  # 12:00:00, 00:21, 0:10:00
    r"|\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b"
    r"|\b\d+(?:\.\d+)?\s+(?:hours?|minutes?|seconds?|days?)\b(?:\s+and\b)?"  # 2 minutes and 3.45 seconds
    r"|[\w.-]+\.py:\d+(?::[\w<>.]+)?|\(\w+:\d+\)"  # a logger's source location: [logging.py:128:log_dist]
    r"|\[(?:rank|Rank|RANK)\s*\d+\]:?",
)
_QUOTES = re.compile(r"['\"`]")

# tqdm's bar: "desc: 42%|████▏     | 420/1000 [00:21<00:29, 19.75it/s, loss=0.5]" (desc and postfix optional)
_BAR = re.compile(r"(?P<pct>\d+)%\s*(?:\|[^|]*\||[^\w\s|]+\s)\s*(?P<n>\d+)/(?P<total>\d+|\?)"
                  r"\s*(?:\[(?P<inner>[^\]]*)\])?")
# a table (YOLO): a header line of names, then rows of values under them ("1/2  2.51G  1.205 …")
_HEADER_WORD = re.compile(r"[A-Za-z][\w\-./()%]*")
_CELL = re.compile(rf"(?:(?P<n>\d+)/(?P<total>\d+)|(?P<num>{NUMBER})(?P<unit>[A-Za-z%]+)?):?")
_RATE = re.compile(r"^\s*(?:[\d:?<]+\s*,\s*)?(?:[\d.?]+\s*(?:it|s|[a-zA-Z]+)/(?:s|it|[a-zA-Z]+))?\s*,?\s*")

_COUNTER_WORDS = ("global_step", "num_updates", "steps", "step", "iteration", "iter", "it", "batch")
RANK = {"global_step": 0, "num_updates": 0, "step": 1, "steps": 1, "iter": 2, "iteration": 2, "it": 2,
        "batch": 3, "bar": 4, "bare": 4}
_WORD_COUNTER = re.compile(
    r"(?<![\w/.])(?P<word>global[_ ]step|num_updates|steps|step|iteration|iter|it|batch)"
    r"(?:\s*\((?P<phase>[A-Za-z]+)\))?\s*[:=#]?\s*(?P<open>\[)?\s*(?P<n>\d+)(?![\d.eE])"
    r"(?:\s*/\s*(?P<total>\d+))?\s*(?(open)\]?)",
    re.IGNORECASE)
_EPOCH = re.compile(
    r"(?<![\w/.])epoch(?:\s*\((?P<phase>[A-Za-z]+)\))?\s*[:=#]?\s*(?P<open>\[)?\s*(?P<e>\d+)(?![\d.eE])"
    r"(?:\s*/\s*(?P<total>\d+))?\s*(?(open)\])",
    re.IGNORECASE)
# ESPnet's number-first forms: "1epoch:train:1-100batch:", "1/2epoch started"
_SUFFIXED = re.compile(r"(?<![\w.])(?P<e>\d+)(?:/(?P<total>\d+))?epoch\b(?::(?P<phase>[A-Za-z]+))?"
                       r"(?::(?:\d+-)?(?P<n>\d+)batch\b)?", re.IGNORECASE)
_BRACKET_PHASE = re.compile(r"\[(train|training|valid|validation|val|eval|evaluation|test)\]", re.IGNORECASE)
# Stable-Baselines3's table: "| rollout/ |  |", "|    ep_len_mean | 22.3 |", closed by a line of dashes
_KV_ROW = re.compile(r"^\|\s*(?P<name>[A-Za-z][\w./-]*)\s*\|\s*(?P<value>\S*)\s*\|$")
_RULE = re.compile(r"^-{5,}$")
_PHASE_BEFORE = re.compile(r"(?<![\w])(?P<phase>valid|validation|val|eval|evaluation|test)\W{0,3}$", re.IGNORECASE)
BLOCK_STEPS = ("total_timesteps", "num_timesteps", "global_step", "step", "timesteps")
_PHASE_EPOCH = re.compile(r"^(?P<phase>train|training)\s*:?\s*(?P<e>\d+)\s+(?=\[\s*\d+\s*/)", re.IGNORECASE)  # timm
_BRACKETED = re.compile(r"\[\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)\s*(?:\([^)]*\))?\s*\]")
_LEADING = re.compile(r"^\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)(?=\s|$)")
_LEAD_WORD = re.compile(r"^\s*(?P<word>[A-Za-z]+)\s*:?\s*(?=\[)")

_TOKEN = re.compile(
    r"(?P<ratio>\d+\s*/\s*\d+)(?![\w.])"
    rf"|(?P<num>{NONFINITE}(?![\w])(?!\s+[A-Za-z][\w ]*:)|{NUMBER})(?P<unit>%|[A-Za-z]+(?:/[A-Za-z]+)?)?(?![\w.])"
    r"|(?P<paren>\((?P<punit>[A-Za-z%/]+)\))"
    r"|(?P<word>[A-Za-z_][\w./@\-]*)"
    r"|(?P<sep>[:=])"
    r"|(?P<other>\S)",
    re.IGNORECASE)
_LIST_VALUE = re.compile(rf"([:=]\s*)\[\s*({NUMBER}|{NONFINITE})\s*\]", re.IGNORECASE)  # lr=[0.0001]
_KERAS_SEP = re.compile(r"\s-\s")
PHASE_WORDS = ("valid", "validation", "val", "eval", "evaluation", "test")
_PHASE_SEGMENT = re.compile(r"(?:^|\|)\s*(?P<phase>valid|validation|val|eval|evaluation|test)\s*(?=\|)", re.IGNORECASE)
IDENTIFIERS = frozenset({"rank", "local_rank", "gpu", "device", "node", "worker", "pid", "seed", "epoch"}
                        | set(_COUNTER_WORDS))
UNIT_NAMES = {"%": "pct"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
MAX_NAME_WORDS = 6


@dataclass(frozen=True)
class Counter:
    """A step counter printed on a line: its value, the total it counts to, what kind it is."""

    n: int
    total: int | None
    kind: str  # a counter word (step, iter, …), "bar" (tqdm) or "bare" (b/B)
    key: str  # which counter this is: a phase word, a bar's description; "" for the training counter


@dataclass(frozen=True)
class Parsed:
    """What one line shows, before the step is worked out."""

    counter: Counter | None
    epoch: int | None
    metrics: dict[str, float]
    explicit: dict[str, float]  # those written `name: value` or `name=value`: what a line with no counter gives
    shadows: tuple[str, ...] = ()  # counter words on the line less global than its counter (litgpt's iter)
    kv: tuple[str, str] | None = None  # a block table's row (Stable-Baselines3): name, value
    rule: bool = False  # a block table's edge: a line of dashes
    header: tuple[str, ...] = ()  # a table's header line: its column names
    row: tuple[str, ...] = ()  # a table's row: its leading cells, read against the header above it


def parse(line: str) -> Parsed | None:
    """The counter, epoch and metrics of one printed line; None when it shows none of them."""
    stripped = line.strip()
    if (kv := _KV_ROW.match(stripped)) is not None:
        return Parsed(None, None, {}, {}, kv=(kv.group("name"), kv.group("value")))
    if _RULE.match(stripped):
        return Parsed(None, None, {}, {}, rule=True)
    cells = line.split()
    if len(cells) >= 3 and all(_HEADER_WORD.fullmatch(c) for c in cells) and not any(c.isdigit() for c in line):
        return Parsed(None, None, {}, {}, header=tuple(cells))
    row = tuple(_row(cells))
    text = _QUOTES.sub(" ", line)
    counter: Counter | None = None
    found = _BAR.search(text)
    if found is not None:
        desc, inner = text[:found.start()], found.group("inner") or ""
        postfix = _RATE.sub("", inner, count=1) if inner else ""
        total = found.group("total")
        if found.group("n") and (total != "?"):
            key = re.sub(r"[\d\s:.,/\[\]-]+", " ", _EPOCH.sub(" ", desc)).strip().lower()
            counter = Counter(int(found.group("n")), int(total), "bar", f"{key}|{total}")
        text = f"{desc} | {postfix} | {text[found.end():]}"
    text = _NOISE.sub(" | ", text)
    epoch = None
    if (m := _EPOCH.search(text)) is not None:
        epoch = int(m.group("e"))
        phase = (m.group("phase") or "").lower()
        text = f"{text[:m.start()]} | {text[m.end():]}"
        counter_phase = phase if phase not in ("train", "training") else ""
    elif (m := _SUFFIXED.search(text)) is not None:
        epoch = int(m.group("e"))
        phase = (m.group("phase") or "").lower()
        counter_phase = phase if phase not in ("train", "training") else ""
        if m.group("n") and counter is None:
            counter = Counter(int(m.group("n")), None, "batch", counter_phase)
        text = f"{text[:m.start()]} | {text[m.end():]}"
    else:
        counter_phase = ""
        if (m := _PHASE_EPOCH.search(text)) is not None:
            epoch = int(m.group("e"))
            text = f" | {text[m.end():]}"
    shadows: tuple[str, ...] = ()
    if counter is None:
        counter, text, shadows = _counter(text, counter_phase, epoch is not None)
    phase = _PHASE_SEGMENT.search(text)
    if phase is not None:  # fairseq's "| valid |": the line's metrics are the validation's
        text = f"{text[:phase.start()]} | {text[phase.end():]}"
    parts = _BRACKET_PHASE.split(text)  # ESPnet's "[train] loss=… [valid] loss=…": each part its phase's
    metrics, explicit = _metrics(parts[0])
    for word, part in zip(parts[1::2], parts[2::2], strict=True):
        more, more_explicit = _metrics(part)
        metrics.update({f"{word.lower()}_{k}": v for k, v in more.items()})
        explicit.update({f"{word.lower()}_{k}": v for k, v in more_explicit.items()})
    if phase is not None:
        word = phase.group("phase").lower()
        metrics, explicit = _prefixed(metrics, word), _prefixed(explicit, word)
    if counter is None and epoch is None and not metrics and not row:
        return None
    return Parsed(counter, epoch, metrics, explicit, shadows, row=row)


def _row(cells: list[str]) -> list[str]:
    """A table row's leading cells (at least three values: `1/2`, `2.51G`, `1.205`, `640:`), else none."""
    out = []
    for cell in cells:
        if not _CELL.fullmatch(cell):
            break
        out.append(cell)
    return out if len(out) >= 3 else []


def _prefixed(metrics: dict[str, float], phase: str) -> dict[str, float]:
    return {k if k.startswith(PHASE_WORDS) else f"{phase}_{k}": v for k, v in metrics.items()}


def _counter(text: str, phase: str, has_epoch: bool) -> tuple[Counter | None, str, tuple[str, ...]]:
    """The line's most global counter (global_step over step over iter over batch over a bare b/B), the
    text without it, and the other counter words on the line."""
    best: tuple[int, re.Match[str], Counter] | None = None
    words: list[str] = []
    for m in _WORD_COUNTER.finditer(text):
        word = m.group("word").lower().replace(" ", "_")
        total = int(m.group("total")) if m.group("total") else None
        if word == "batch" and total is None and not has_epoch:
            continue  # "batch 32" alone is a batch size as often as a counter
        own = (m.group("phase") or "").lower()
        before = _PHASE_BEFORE.search(text, 0, m.start())  # Composer's "[Eval batch=2/10]"
        own = own or (before.group("phase").lower() if before else "")
        key = own if own not in ("", "train", "training") else phase
        counter = Counter(int(m.group("n")), total, word, key)
        words.append(word)
        if best is None or RANK[word] < best[0]:
            best = (RANK[word], m, counter)
    if best is None:
        m = _LEADING.match(text) or _BRACKETED.search(text)
        if m is not None:
            lead = _LEAD_WORD.match(text)
            key = phase or (lead.group("word").lower() if lead and m.re is _BRACKETED else "")
            if key in ("train", "training", "epoch"):
                key = ""
            best = (RANK["bare"], m, Counter(int(m.group("n")), int(m.group("total")), "bare", key))
    if best is None:
        return None, text, ()
    m = best[1]
    rest = f"{text[:m.start()]} | {text[m.end():]}"
    for other in _WORD_COUNTER.finditer(rest):  # a second counter on the line (litgpt's iter beside step)
        rest = f"{rest[:other.start()]} | {rest[other.end():]}"
        break
    if best[2].kind == "bare" and best[2].key:
        rest = rest.replace(best[2].key, " ", 1) if rest.lower().startswith(best[2].key) else \
            re.sub(rf"^\s*{re.escape(best[2].key)}\s*:?", " | ", rest, count=1, flags=re.IGNORECASE)
    return best[2], rest, tuple(w for w in words if w != best[2].kind)


def _metrics(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """`name value` pairs: the name is the words since the last boundary (a separator, a value, a word
    ended by `:`/`=`), lower-cased and joined by `_`; a unit after the number joins the name."""
    text = _LIST_VALUE.sub(r"\1\2", text)
    text = _KERAS_SEP.sub(" | ", text)
    out: dict[str, float] = {}
    explicit: dict[str, float] = {}
    words: list[str] = []
    unit = ""
    closed = False  # a `:`/`=` came after the words: a further word starts a new name
    separated = False  # the words are followed by `:`/`=`
    for tok in _TOKEN.finditer(text):
        if tok.group("word") is not None:
            if closed:
                words, unit, closed, separated = [], "", False, False
            words.append(tok.group("word"))
        elif tok.group("sep") is not None:
            if words:
                closed = separated = True
        elif tok.group("paren") is not None:
            if words:
                unit = unit or tok.group("punit")
        elif tok.group("num") is not None:
            if words:
                name = _name(words, unit, tok.group("unit"))
                if name and name not in out:
                    out[name] = _float(tok.group("num"))
                    if separated:
                        explicit[name] = out[name]
            words, unit, closed, separated = [], "", False, False
        else:  # a ratio, punctuation, a bar: the words before it name nothing
            words, unit, closed, separated = [], "", False, False
    return out, explicit


def _float(text: str) -> float:
    """A value as printed: `nan.0` (Lightning's) is nan."""
    return float(text.split(".")[0]) if text[-1:] == "0" and "n" in text.lower() else float(text)


def _name(words: list[str], unit: str, attached: str | None) -> str | None:
    words = words[-MAX_NAME_WORDS:]
    name = "_".join(w.strip("./-@_").lower() for w in words if w.strip("./-@_"))
    for u in (unit, attached):
        if u:
            name += "_" + UNIT_NAMES.get(u, u.lower().replace("/", "_per_"))
    if not name or name in IDENTIFIERS or name.isdigit() or name.startswith("eta"):
        return None  # an id, a counter, a time left (eta): never a metric
    return name


@dataclass
class Progress:
    """The step of each line: the trainer's progress, kept across lines (persisted with the reader's state).

    `base` is the first epoch's number convention (0 or 1); `length` (L) the counter's count per epoch once
    it is known to restart; `restarts` the epochs counted where none is printed."""

    main: str | None = None  # the training counter's key: the first that gave a record
    base: int | None = None
    epoch: int | None = None  # the last epoch printed (a header line carries it to the lines after)
    last_n: int | None = None  # the training counter's last value
    last_epoch: int | None = None  # the epoch that value was printed in
    max_n: int = 0  # the largest counter value since the last restart
    per_epoch: bool = False
    length: int | None = None
    restarts: int = 0
    last_step: int | None = None
    last_bar: tuple[str, int] | None = None
    header: list[str] = field(default_factory=list)  # the newest table header's column names
    block: dict[str, float] = field(default_factory=dict)  # a block table's values so far (Stable-Baselines3)
    section: str = ""  # the block table's current section ("rollout/")
    shadowed: list[str] = field(default_factory=list)  # counter words seen beside a more global one
    notices: list[tuple[str, str]] = field(default_factory=list)
    told: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("notices", "told")} | {"told": sorted(self.told)}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Progress:
        if not d:
            return cls()
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k not in ("notices", "told")}
        if isinstance(known.get("last_bar"), list):
            known["last_bar"] = tuple(known["last_bar"])
        return cls(**known, told=set(d.get("told", ())))

    def step(self, parsed: Parsed, line: str) -> tuple[int, dict[str, float]] | None:
        """(step, metrics) of the line's record, or None when it is none."""
        if parsed.header:
            self.header = list(parsed.header)
            return None
        if parsed.kv is not None or parsed.rule:
            return self._block(parsed)
        if parsed.row and self.header:
            parsed = self._table_row(parsed)
        if parsed.epoch is not None:
            if self.base is None or parsed.epoch < self.base:
                self.base = 0 if parsed.epoch == 0 else 1
            self.epoch = parsed.epoch
        c, metrics = parsed.counter, parsed.metrics
        for word in parsed.shadows:
            if word not in self.shadowed:
                self.shadowed.append(word)
        if c is not None and c.kind in self.shadowed and self.last_step is not None:
            # litgpt's `iter N: val loss`: the iter counter runs beside the step; at the step read last
            return (self.last_step, metrics) if metrics else None
        if c is not None and (self.main is None or c.key == self.main) and (metrics or c.kind in ("bar", "bare")):
            if c.kind == "bar" and c.n == 0:
                return None  # a bar's first frame: no step done yet
            if self.main is None:
                self.main = c.key
            step = self._counted(c, parsed.epoch if parsed.epoch is not None else self.epoch, line)
            if c.kind == "bar" and not metrics and self.last_bar == (c.key, step):
                return None  # the same frame redrawn
            self.last_bar = (c.key, step) if c.kind == "bar" else None
            self.last_step = step
            return step, metrics
        if c is not None and (c.key == self.main or (self.main is None and not c.key)) and not metrics:
            # a step announced with its metrics on the lines after it (Composer's "[epoch=1][batch=10/50]:")
            self.main = c.key if self.main is None else self.main
            self.last_step = self._counted(c, parsed.epoch if parsed.epoch is not None else self.epoch, line)
            return None
        if not metrics:
            return None
        if c is not None and self.main is not None and c.key != self.main:  # another phase's counter: an eval
            if self.last_step is None:
                return None
            prefix = c.key.split("|")[0].strip().replace(" ", "_")
            return self.last_step, {f"{prefix}_{k}" if prefix else k: v for k, v in metrics.items()}
        if parsed.epoch is not None and c is None:  # an end-of-epoch summary
            if self.per_epoch and self.length and self.base is not None:
                step = (parsed.epoch - self.base + 1) * self.length
            elif self.last_step is not None and self.main is not None:
                step = self.last_step
            else:
                step = parsed.epoch
            if self.last_step is not None and step < self.last_step:
                step = self.last_step
            self.last_step = step
            return step, metrics
        if c is None and parsed.explicit and self.last_step is not None:
            return self.last_step, parsed.explicit  # an eval summary, a dict: at the step read last
        return None

    def _block(self, parsed: Parsed) -> tuple[int, dict[str, float]] | None:
        """A block table's row kept, or its closing edge: the block is one record, at its step row
        (`time/total_timesteps`), else one past the step read last."""
        if parsed.kv is not None:
            name, value = parsed.kv
            if not value and name.endswith("/"):
                self.section = name.lower()
            else:
                try:
                    self.block[self.section + name.lower()] = float(value)
                except ValueError:
                    pass
            return None
        block, self.block, self.section = self.block, {}, ""
        if not block:
            return None
        at = next((k for k in block if k.rsplit("/", 1)[-1] in BLOCK_STEPS), None)
        step = int(block.pop(at)) if at is not None else (self.last_step or 0) + 1
        self.last_step = step
        return step, block

    def _table_row(self, parsed: Parsed) -> Parsed:
        """A row under a table's header: each cell named by its column (`Epoch` `1/2` is the epoch)."""
        metrics: dict[str, float] = {}
        epoch = parsed.epoch
        for column, cell in zip(self.header, parsed.row, strict=False):  # a row may run past its header
            m = _CELL.fullmatch(cell)
            assert m is not None
            name = column.lower()
            if name == "epoch" and m.group("n"):
                epoch = int(m.group("n"))
            elif m.group("num") is not None:
                full = _name([column], "", m.group("unit"))
                if full:
                    metrics[full] = float(m.group("num"))
        return replace(parsed, epoch=epoch, metrics={**metrics, **parsed.metrics})

    def _counted(self, c: Counter, epoch: int | None, line: str) -> int:
        n = c.n
        if self.last_n is not None and (n < self.last_n or (n == self.last_n and epoch is not None
                                                           and self.last_epoch is not None
                                                           and epoch > self.last_epoch)):
            if epoch is not None and self.last_epoch is not None and epoch > self.last_epoch:
                self._restart(c, line)
            elif epoch is None and c.total is not None:
                self._restart(c, line)
                self.restarts += 1
            elif not (self.per_epoch and epoch is None):
                self._say("backwards", f"the step went backwards, {self.last_n} → {n}, at the line {line[:200]!r}; "
                          "records keep the step as printed (said once)")
        if self.per_epoch and self.length:
            if epoch is not None and self.base is not None:
                step = (epoch - self.base) * self.length + n
            else:
                step = self.restarts * self.length + n
        else:
            step = n
        self.max_n = max(self.max_n, n) if self.last_n is None or n >= self.last_n else n
        self.last_n, self.last_epoch = n, epoch
        return step

    def _restart(self, c: Counter, line: str) -> None:
        """The counter restarted with a new epoch: from now on the step is counted over epochs."""
        if not self.per_epoch:
            self.per_epoch = True
            self.length = c.total or max(self.max_n, self.last_n or 0)
            how = (f"{self.length} per epoch (its printed total)" if c.total else
                   f"about {self.length} per epoch (the largest value printed in an epoch: print `batch b/B` "
                   "with the total for exact steps)")
            self._say("per-epoch", f"the {c.kind} counter restarts every epoch: the step counts on across epochs, "
                      f"{how}; at the line {line[:200]!r}")
        self.max_n = 0

    def _say(self, key: str, text: str) -> None:
        text = _CONTROL.sub("", text)  # a Keras line's backspaces are no part of what is quoted
        if key not in self.told:
            self.told.add(key)
            self.notices.append(("general-" + key, text))


def describe_record(step: int, metrics: dict[str, float], limit: int = 6) -> str:
    """`step 10: loss=0.6931 lr=0.001`: one record as the answer about reading shows it."""
    shown = " ".join(f"{k}={v:g}" for k, v in list(metrics.items())[:limit])
    more = f" (+{len(metrics) - limit} more)" if len(metrics) > limit else ""
    return f"step {step}: {shown}{more}" if shown else f"step {step} (a progress bar: no metric printed)"
