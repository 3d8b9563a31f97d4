"""Validate eval/verifier_sets/peers.jsonl (or peers_fresh.jsonl, peers_fresh2.jsonl) and print counts.

Usage: python eval/verifier_sets/check_peers.py [path/to/peers.jsonl]
The path defaults to peers.jsonl. For a file whose name ends in ``_fresh.jsonl``
(the fresh external set) every record must have split "fresh", and for one ending
in ``_fresh2.jsonl`` (the second fresh set) split "fresh2"; otherwise the split
must follow the sha1 dev/holdout rule.
Exits non-zero if any record breaks the schema or the split rule.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import sys
from pathlib import Path

REQUIRED = {
    "id": str,
    "gold": str,
    "response": str,
    "label": bool,
    "source": str,
    "license": str,
    "kind": str,
    "debatable": bool,
    "debatable_why": str,
    "split": str,
}
OPTIONAL = {"also_in": list, "test": str, "grader_fn": str, "options": dict, "note": str}
KINDS = {"number_format", "fraction", "latex", "set", "interval", "matrix", "units", "relation", "text", "boxed", "other"}
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*/[1-9][0-9]*$")
SOURCE_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+:[^@]+@([0-9a-f]{40}|HEAD)$")


def expected_split(rid: str) -> str:
    return "holdout" if int(hashlib.sha1(rid.encode()).hexdigest(), 16) % 10 < 3 else "dev"


FIXED_SPLITS = {"_fresh.jsonl": "fresh", "_fresh2.jsonl": "fresh2"}


def fixed_split(path: Path) -> str | None:
    """The split every record of a fresh set must have, or None for the sha1 dev/holdout rule."""
    for suffix, split in FIXED_SPLITS.items():
        if path.name.endswith(suffix):
            return split
    return None


def is_fresh_file(path: Path) -> bool:
    return fixed_split(path) is not None


def main(path: Path) -> int:
    fresh = is_fresh_file(path)
    want_split = fixed_split(path)
    errors: list[str] = []
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            errors.append(f"line {n}: blank line")
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"line {n}: bad JSON ({exc})")
            continue
        rows.append((n, rec))
        for key, typ in REQUIRED.items():
            if key not in rec:
                errors.append(f"line {n}: missing {key}")
            elif not isinstance(rec[key], typ):
                errors.append(f"line {n}: {key} is {type(rec[key]).__name__}, want {typ.__name__}")
        for key, val in rec.items():
            if key in REQUIRED:
                continue
            if key not in OPTIONAL:
                errors.append(f"line {n}: unknown field {key}")
            elif not isinstance(val, OPTIONAL[key]):
                errors.append(f"line {n}: {key} is {type(val).__name__}, want {OPTIONAL[key].__name__}")
        if any(k not in rec or not isinstance(rec[k], REQUIRED[k]) for k in REQUIRED):
            continue
        if not ID_RE.match(rec["id"]):
            errors.append(f"line {n}: bad id {rec['id']!r}")
        if not SOURCE_RE.match(rec["source"]):
            errors.append(f"line {n}: bad source {rec['source']!r}")
        if rec["kind"] not in KINDS:
            errors.append(f"line {n}: unknown kind {rec['kind']!r}")
        if fresh:
            if rec["split"] != want_split:
                errors.append(f"line {n}: split {rec['split']!r}, want {want_split!r} in {path.name}")
        elif rec["split"] != expected_split(rec["id"]):
            errors.append(f"line {n}: split {rec['split']!r} breaks the sha1 rule for {rec['id']}")
        if rec["debatable"] != bool(rec["debatable_why"].strip()):
            errors.append(f"line {n}: debatable={rec['debatable']} but debatable_why={rec['debatable_why']!r}")
        if not rec["license"].strip():
            errors.append(f"line {n}: empty license")
        for other in rec.get("also_in", []):
            if not isinstance(other, str):
                errors.append(f"line {n}: also_in entry is not a string")

    ids = collections.Counter(r["id"] for _, r in rows if isinstance(r.get("id"), str))
    errors += [f"duplicate id {i} ({c}x)" for i, c in ids.items() if c > 1]
    pairs = collections.Counter(
        (r.get("gold"), r.get("response")) for _, r in rows if isinstance(r.get("gold"), str)
    )
    errors += [f"duplicate (gold, response) pair {p!r}" for p, c in pairs.items() if c > 1]

    recs = [r for _, r in rows]
    print(f"{path}: {len(recs)} records")
    by_src = collections.defaultdict(collections.Counter)
    for r in recs:
        repo = r.get("source", "?").split(":", 1)[0]
        by_src[repo][r.get("label")] += 1
        by_src[repo][r.get("split") if r.get("split") in ("holdout", "fresh", "fresh2") else "dev"] += 1
        by_src[repo]["debatable"] += bool(r.get("debatable"))
    if fresh:
        print(f"{'source repo':46} {'total':>5} {'true':>5} {'false':>5} {'debat':>5}")
        for repo, c in sorted(by_src.items(), key=lambda kv: -(kv[1][True] + kv[1][False])):
            print(f"{repo:46} {c[True] + c[False]:5} {c[True]:5} {c[False]:5} {c['debatable']:5}")
    else:
        print(f"{'source repo':36} {'total':>5} {'true':>5} {'false':>5} {'dev':>5} {'hold':>5} {'debat':>5}")
        for repo, c in sorted(by_src.items(), key=lambda kv: -(kv[1][True] + kv[1][False])):
            print(f"{repo:36} {c[True] + c[False]:5} {c[True]:5} {c[False]:5} {c['dev']:5} {c['holdout']:5} {c['debatable']:5}")
    lab = collections.Counter(r.get("label") for r in recs)
    spl = collections.Counter(r.get("split") for r in recs)
    print(f"labels: true={lab[True]} false={lab[False]} ({100 * lab[False] / max(len(recs), 1):.1f}% false)")
    if fresh:
        print(f"splits: {want_split}={spl[want_split]}")
    else:
        print(f"splits: dev={spl['dev']} holdout={spl['holdout']} ({100 * spl['holdout'] / max(len(recs), 1):.1f}% holdout)")
        for split in ("dev", "holdout"):
            c = collections.Counter(r.get("label") for r in recs if r.get("split") == split)
            print(f"  {split}: true={c[True]} false={c[False]}")
    print(f"debatable: {sum(bool(r.get('debatable')) for r in recs)}")
    print("kinds: " + ", ".join(f"{k}={v}" for k, v in collections.Counter(r.get('kind') for r in recs).most_common()))
    print(f"pairs also found in other sources: {sum(1 for r in recs if r.get('also_in'))}")

    if errors:
        print(f"\n{len(errors)} problem(s):", file=sys.stderr)
        for e in errors[:50]:
            print("  " + e, file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    default = Path(__file__).with_name("peers.jsonl")
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else default))
