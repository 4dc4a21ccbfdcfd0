"""A study's or a tune's YAML in the record's words, and the words such a file wrote before.

A record's `study` block says `blocks` and `margin`, and its `workload` is the catalog's name
(pretrain, inference); a spec once said `trials:`, `equivalence:` and `entry: train` /
`entry: infer` for the same things. The old words still load for a release, read as the new
ones, with one line on stderr per spec naming the new words; a spec that writes both words for
one field is refused, since which one it means cannot be guessed. Saved definitions
(`<study id>/study.json`, `tune.json`) written with the old entry words are read in the new ones
here too, so a study started before the rename resumes, and counts as earlier evidence for the plan.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

from workloads import catalog
from workloads.core.errors import UsageError

# field -> its new word, per kind of file (a tune never had `trials`; its confirmation says blocks already)
RENAMED = {"study": {"trials": "blocks", "equivalence": "margin"}, "tune": {"equivalence": "margin"}}
_TOLD: set[str] = set()  # the specs whose old words were named on stderr in this process (once per spec)


def entry_name(word: Any) -> Any:
    """The catalog's name for a workload entry word, old (train, infer) or new; other values as given
    (a typo stays one, for the spec's own message)."""
    known = catalog.get(str(word)) if isinstance(word, str) else None
    return known.name if known else word


def modernise(raw: Mapping[str, Any], source: Path, kind: str) -> dict[str, Any]:
    """`raw` (a study's or a tune's mapping) with every old word replaced by the new one; one
    deprecation line on stderr the first time this process reads `source` with old words;
    UsageError when a field is given under both its words."""
    out, said = dict(raw), []
    for old, new in RENAMED[kind].items():
        if old not in raw:
            continue
        if new in raw:
            raise UsageError(f"{source}: both {old}: {raw[old]} and {new}: {raw[new]} are given, one field under "
                             f"its old and its new name; keep {new}: only")
        out[new] = out.pop(old)
        said.append(f"{old}: is now {new}:")
    workloads = raw.get("workloads")
    if isinstance(workloads, list):
        out["workloads"] = [_entry(w, said) for w in workloads]
    if said and str(source) not in _TOLD:
        _TOLD.add(str(source))
        print(f"{source}: deprecated word(s), read for this release: {', '.join(dict.fromkeys(said))} "
              f"(the record's words)", file=sys.stderr)
    return out


def _entry(w: Any, said: list[str]) -> Any:
    if not isinstance(w, Mapping) or not isinstance(w.get("entry"), str):
        return w
    name = entry_name(w["entry"])
    if name == w["entry"]:
        return w
    said.append(f"entry: {w['entry']} is now entry: {name}")
    # a workload without a name was named by its entry word: keep that name, so the run ids and the
    # saved definition of a study started before the rename stay the same
    return {"name": w["entry"], **w, "entry": name}


def saved(definition: dict[str, Any]) -> dict[str, Any]:
    """A saved study.json / tune.json with its workloads' entries in the catalog's names (one
    written before the rename said train / infer): what a rerun compares itself against."""
    workloads = definition.get("workloads")
    if not isinstance(workloads, list):
        return definition
    return {**definition, "workloads": [{**w, "entry": entry_name(w.get("entry"))} if isinstance(w, dict) else w
                                        for w in workloads]}
