"""`babysit prereg show NAME [--json]`: everything a stranger needs to re-derive the verdict.

The [prereg] table as canonical JSON, its hash and whether the spec still matches what `register` froze,
and the amendment chain with every record's hash recomputed. Exit 1 when the prereg no longer matches
or the chain is broken (printed in full either way), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from babysit.runtime.registry import resolve_registry_path
from babysit.verdict.prereg_record import collect


def run(args: argparse.Namespace) -> int:
    info = collect(resolve_registry_path(args.registry), args.run)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(render(info))
    return 0 if info["matches"] and info["chain_ok"] else 1


def render(info: dict[str, Any]) -> str:
    lines = [f"run:            {info['run']}", f"spec:           {info['spec']}",
             f"registered_at:  {info['registered_at']}",
             f"registered sha: {info['prereg_sha256_registered'] or '— (no [prereg] at registration)'}",
             f"current sha:    {info['prereg_sha256_current'] or '— (no [prereg] now)'}"]
    if info["matches"]:
        lines.append("status:         FROZEN - the spec's [prereg] still hashes to what `register` recorded")
    else:
        lines.append("status:         TAMPERED - the [prereg] below is the CURRENT text, not what was registered; "
                     "no verdict will be read from it (register a new name for a different experiment)")
    lines.append(f"log:            {info['log']}")
    if info["fixture_log"]:
        lines.append(f"fixture log:    {info['fixture_log']}")
    lines.append("[prereg] (canonical JSON; sha256 of the compact form `sort_keys, separators=(',', ':')`):")
    lines.append(json.dumps(info["prereg"], indent=2, sort_keys=True, ensure_ascii=False))
    if not info["matches"] and info.get("prereg_registered") is not None:
        lines.append("[prereg] AS REGISTERED (the frozen copy kept by `register`: what was pre-registered):")
        lines.append(json.dumps(info["prereg_registered"], indent=2, sort_keys=True, ensure_ascii=False))
    if not info["amendments"]:
        lines.append("amendments:     none")
    for a in info["amendments"]:
        state = "chain ok" if a["chain_ok"] else "CHAIN BROKEN: " + "; ".join(a["problems"])
        seen = a["data_seen_through_step"]
        lines.append(f"amendment {a['n']}: {a['title']} - declared {a['declared_at']}, data seen through step "
                     f"{seen if seen is not None else '— (none)'}; sha256 {a['sha256']} ({state})")
        lines.extend("    " + line for line in a["text"].rstrip("\n").splitlines())
    lines.append("re-derive: sha256(canonical) must equal the registered sha; amendment k's sha256 is "
                 "sha256(prev_sha256 + '\\n' + text) with prev_sha256 of amendment 1 empty.")
    return "\n".join(lines)
