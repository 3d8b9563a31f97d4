#!/usr/bin/env python
"""Fuzz the verifier and the reward path with generated hostile model outputs.

Runs N cases (default 100,000) from :mod:`mathrl.testing.hostile` through the real
:func:`mathrl.reward.grade_batch` (the shared worker pool, real SIGKILL timeouts) and
:func:`mathrl.reward.compute_rewards`, in chunks, and checks after every chunk:

* no exception escapes; every case passes :func:`mathrl.testing.fuzz.case_violations` (the same
  per-case invariants as ``tests/reward/test_hostile_outputs.py``): a valid ``Grade``, never
  correct against an unrelated gold (``HostileCase.unrelated``) nor with a reason other than
  ``ok``, a finite float reward, and no case longer than the sum of ``timeout``, ``--slack-s``
  (worker pool) and ``--parent-max-s`` (the in-process fast path has no timeout of its own);
* a chunk's wall time stays within (cases / workers) * timeout + ``--slack-s``;
* peak resident memory of this process and of every worker (sampled from /proc every 0.2 s)
  stays under ``--parent-rss-mb`` / ``--worker-rss-mb``;
* after ``shutdown_pool()`` no worker process is left.

Prints a table (cases, cases/s, timeouts, slowest case, peak RSS, per-category breakdown) and
exits 1 if any check failed (the failures are listed).

    OMP_NUM_THREADS=1 python scripts/fuzz_verifier.py [--cases 100000] [--workers 2] [--timeout 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mathrl.progress import Progress  # noqa: E402
from mathrl.reward import REASONS, compute_rewards, grade_batch, shutdown_pool  # noqa: E402
from mathrl.reward.rewards import RewardContext  # noqa: E402
from mathrl.testing.fuzz import case_violations, valid_grade  # noqa: E402
from mathrl.testing.hostile import REALISTIC, generate, named_cases  # noqa: E402
from mathrl.reward.pool import get_pool  # noqa: E402
from mathrl.procs import child_pids, cmdline, status_kb  # noqa: E402

REWARD_TERMS = {"correctness": {}, "format": {"bonus": 0.1}, "length": {}}
MAX_LENGTH = 4096  # the length term's limit


# ----------------------------------------------------------------------------- /proc helpers

def worker_pids() -> list[int]:
    """Pids of the shared pool's current workers."""
    pool = get_pool()
    return [w.proc.pid for w in list(pool._workers)]


def leftover_workers() -> list[int]:
    """Live (non-zombie) child processes of this process that run the grading worker."""
    return [p for p in child_pids() if b"mathrl.reward._worker" in cmdline(p)]


class RssSampler(threading.Thread):
    """Samples VmRSS of this process and of the pool's workers every ``period`` seconds."""

    def __init__(self, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.parent_peak_kb = 0
        self.worker_peak_kb = 0
        self.pids: set[int] = set()
        self.pids_lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: list[int] = []

    def watch(self, pids: list[int]) -> None:
        with self.pids_lock:
            self._watch = list(pids)
            self.pids.update(pids)

    def sample(self) -> None:
        self.parent_peak_kb = max(self.parent_peak_kb, status_kb("self", "VmRSS"))
        with self.pids_lock:
            pids = list(self._watch)
        for pid in pids:
            self.worker_peak_kb = max(self.worker_peak_kb, status_kb(pid, "VmRSS"), status_kb(pid, "VmHWM"))

    def run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()


# ----------------------------------------------------------------------------- main

def load_seeds(path: Path | None) -> list[tuple[str, str]]:
    """Realistic (response, gold) pairs to mutate: REALISTIC plus the rows of ``path`` (JSONL
    with 'response' and 'gold'), when it exists."""
    seeds = list(REALISTIC)
    if path is not None and path.exists():
        with path.open(encoding="utf-8") as f:
            for ln, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    seeds.append((str(row["response"]), str(row["gold"])))
                except (json.JSONDecodeError, KeyError) as e:
                    raise SystemExit(f"{path}:{ln}: expected JSON with 'response' and 'gold': {e}") from None
    return seeds


def short(s: str, n: int = 80) -> str:
    return ascii(s[:n])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000, help="generated cases (the named cases come on top)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0, help="per-case verifier timeout, seconds")
    ap.add_argument("--chunk", type=int, default=500, help="cases per grade_batch call")
    ap.add_argument("--parent-rss-mb", type=float, default=1024.0)
    ap.add_argument("--worker-rss-mb", type=float, default=2560.0,
                    help="workers cap their address space at imports + MATHRL_VERIFIER_MEM_MB (2048)")
    ap.add_argument("--parent-max-s", type=float, default=2.0,
                    help="bound on one case's in-process (fast path) time; that path has no timeout")
    ap.add_argument("--slack-s", type=float, default=2.0,
                    help="allowed lateness of a timeout (select granularity, kill, scheduling)")
    ap.add_argument("--seeds", type=Path, default=ROOT / "tests" / "reward" / "cases.jsonl",
                    help="JSONL of realistic responses to mutate (default: the labelled cases)")
    ap.add_argument("--no-named", action="store_true", help="skip the hand-written named cases")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary as JSON here")
    args = ap.parse_args(argv)
    if args.cases < 0 or args.workers < 1 or args.timeout <= 0 or args.chunk < 1:
        raise SystemExit("--cases >= 0, --workers >= 1, --timeout > 0 and --chunk >= 1 are required")

    seeds = load_seeds(args.seeds)
    named = [] if args.no_named else named_cases()
    total = len(named) + args.cases

    def cases():
        for i, c in enumerate(named):
            yield f"named[{i}]", c
        for k, c in enumerate(generate(args.cases, seed=args.seed, seeds=seeds)):
            yield f"gen[{k}]", c

    failures: list[str] = []

    def fail(msg: str) -> None:
        failures.append(msg)
        if len(failures) <= 20:
            print("FAIL:", msg, file=sys.stderr, flush=True)

    # start the pool (its start-up is not counted in the throughput)
    t0 = time.perf_counter()
    warm = ["\\boxed{\\frac{\\sqrt{2}}{2}}"] * args.workers  # needs sympy: goes to the workers
    grade_batch(warm, ["\\frac{1}{\\sqrt{2}}"] * args.workers, timeout=max(args.timeout, 60.0), workers=args.workers)
    startup_s = time.perf_counter() - t0
    sampler = RssSampler()
    sampler.watch(worker_pids())
    sampler.start()

    per_cat: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    reasons_total: dict[str, int] = defaultdict(int)
    slowest = (0.0, "", "", "")
    top: list[tuple] = []  # the 10 slowest: (seconds, case id, category, reason, head)
    n_done = 0
    grade_s = 0.0
    gen_s = 0.0
    max_chunk_ratio = 0.0
    t_start = time.perf_counter()
    it = cases()
    chunk_no = 0
    bar = Progress(total, "fuzz_verifier", unit="case")
    while True:
        tg = time.perf_counter()
        chunk = []
        ids = []
        for cid, c in it:
            chunk.append(c)
            ids.append(cid)
            if len(chunk) >= args.chunk:
                break
        gen_s += time.perf_counter() - tg
        if not chunk:
            break
        chunk_no += 1
        resps = [c.response for c in chunk]
        golds = [c.gold for c in chunk]
        truncs = [c.truncated for c in chunk]
        durations: list[float] = []
        tc = time.perf_counter()
        try:
            grades = grade_batch(resps, golds, timeout=args.timeout, workers=args.workers, truncated=truncs,
                                 durations=durations)
            ctx = RewardContext(responses=resps, grades=grades, truncated=truncs, lengths=[len(r) for r in resps],
                                max_length=MAX_LENGTH)
            rewards = compute_rewards(REWARD_TERMS, ctx)
        except BaseException as e:  # noqa: BLE001 - the point is that nothing escapes
            fail(f"chunk {chunk_no}: {type(e).__name__} escaped: {e}")
            raise
        wall = time.perf_counter() - tc
        grade_s += wall
        sampler.watch(worker_pids())
        sampler.sample()
        bound = len(chunk) / args.workers * args.timeout + args.slack_s
        max_chunk_ratio = max(max_chunk_ratio, wall / bound)
        if wall > bound:
            fail(f"chunk {chunk_no}: {wall:.1f} s > bound {bound:.1f} s")
        bar.update(len(chunk))
        if len(grades) != len(chunk) or len(rewards) != len(chunk) or len(durations) != len(chunk):
            fail(f"chunk {chunk_no}: {len(grades)} grades / {len(rewards)} rewards for {len(chunk)} cases")
            continue
        for cid, c, g, r, d in zip(ids, chunk, grades, rewards, durations):
            cat = per_cat[c.category]
            cat["n"] += 1
            cat["time"] += d
            cat["max"] = max(cat["max"], d)
            for msg in case_violations(c, g, r, d, max_duration=args.timeout + args.slack_s + args.parent_max_s):
                fail(msg)
            if not valid_grade(g):
                continue
            cat[g.reason] += 1
            reasons_total[g.reason] += 1
            if d > slowest[0]:
                slowest = (d, c.category, short(c.response), g.reason)
            if len(top) < 10 or d > top[-1][0]:
                top.append((d, cid, c.category, g.reason, short(c.response, 100)))
                top.sort(key=lambda x: -x[0])
                del top[10:]
        n_done += len(chunk)
        if sampler.parent_peak_kb / 1024 > args.parent_rss_mb:
            fail(f"parent RSS {sampler.parent_peak_kb / 1024:.0f} MB > {args.parent_rss_mb} MB")
        if sampler.worker_peak_kb / 1024 > args.worker_rss_mb:
            fail(f"worker RSS {sampler.worker_peak_kb / 1024:.0f} MB > {args.worker_rss_mb} MB")
        if bar.enabled:  # on a terminal the bar shows the progress instead of the lines below
            bar.set_postfix(f"{reasons_total['timeout']} timeouts, {len(failures)} failures")
        elif chunk_no % 10 == 0 or n_done == total:
            el = time.perf_counter() - t_start
            print(f"[fuzz] {n_done}/{total} cases, {n_done / grade_s:.0f} cases/s grading, "
                  f"{reasons_total['timeout']} timeouts, elapsed {el:.0f} s, "
                  f"RSS parent {sampler.parent_peak_kb / 1024:.0f} MB workers {sampler.worker_peak_kb / 1024:.0f} MB",
                  file=sys.stderr, flush=True)
    bar.close()
    sampler.sample()
    sampler.stop()
    pool = get_pool()
    stats = dict(pool.stats)
    seen = set(sampler.pids)
    shutdown_pool()
    time.sleep(0.2)
    alive = [p for p in seen if status_kb(p, "VmRSS") and p in leftover_workers()]
    left = leftover_workers()
    if alive or left:
        fail(f"worker processes left after shutdown_pool(): {sorted(set(alive) | set(left))}")
    elapsed = time.perf_counter() - t_start

    # ------------------------------------------------------------------ report
    print()
    print("## Verifier fuzz (hostile model output)")
    print()
    print(f"seed {args.seed}, workers {args.workers}, timeout {args.timeout} s, chunk {args.chunk}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, cpus {os.cpu_count()}")
    print()
    print("| metric | value |")
    print("|---|---|")
    print(f"| cases (named + generated) | {n_done} ({len(named)} + {n_done - len(named)}) |")
    print(f"| grading wall (grade_batch + compute_rewards) | {grade_s:.1f} s |")
    print(f"| cases/s (grading) | {n_done / max(grade_s, 1e-9):.1f} |")
    print(f"| total wall incl. generation / pool start | {elapsed:.1f} s / {startup_s:.1f} s |")
    print("| reasons | " + ", ".join(f"{k} {reasons_total.get(k, 0)}" for k in REASONS) + " |")
    print(f"| timeouts (pool stats) | {stats.get('timeouts', 0)} (worker restarts {stats.get('restarts', 0)}, "
          f"crashes {stats.get('crashes', 0)}) |")
    print(f"| slowest case | {slowest[0]:.2f} s, {slowest[1]}, reason {slowest[3]}: {slowest[2]} |")
    print(f"| max chunk wall / bound | {max_chunk_ratio:.3f} |")
    print(f"| peak RSS parent | {sampler.parent_peak_kb / 1024:.0f} MB (bound {args.parent_rss_mb:.0f} MB) |")
    print(f"| peak RSS worker | {sampler.worker_peak_kb / 1024:.0f} MB (bound {args.worker_rss_mb:.0f} MB) |")
    print(f"| worker processes seen / left after shutdown | {len(seen)} / {len(alive) + len(left)} |")
    print(f"| check failures | {len(failures)} |")
    print()
    print("| category | cases | ok | mismatch | no_answer | error | timeout | mean ms | max s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in sorted(per_cat):
        c = per_cat[name]
        n = int(c["n"])
        print(f"| {name} | {n} | {int(c['ok'])} | {int(c['mismatch'])} | {int(c['no_answer'])} | {int(c['error'])} "
              f"| {int(c['timeout'])} | {1000 * c['time'] / max(n, 1):.1f} | {c['max']:.2f} |")
    print()
    print("Slowest cases (id: gen[k] = hostile.generate(n, seed)[k], named[i] = hostile.named_cases()[i]):")
    for d, cid, cat, reason, head in top:
        print(f"  {d:6.2f} s  {cid:>12}  {cat:<12} {reason:<9} {head}")
    if failures:
        print()
        print(f"FAILED checks ({len(failures)}):")
        for f in failures[:50]:
            print(" -", f)
    if args.json:
        summary = {
            "cases": n_done, "grading_s": grade_s, "cases_per_s": n_done / max(grade_s, 1e-9),
            "elapsed_s": elapsed, "timeout_s": args.timeout, "workers": args.workers, "seed": args.seed,
            "reasons": dict(reasons_total), "pool_stats": stats,
            "slowest": {"seconds": slowest[0], "category": slowest[1], "head": slowest[2], "reason": slowest[3]},
            "peak_rss_mb": {"parent": sampler.parent_peak_kb / 1024, "worker": sampler.worker_peak_kb / 1024},
            "categories": {k: dict(v) for k, v in per_cat.items()}, "failures": failures,
            "top": [{"seconds": d, "id": cid, "category": cat, "reason": rs, "head": h} for d, cid, cat, rs, h in top],
        }
        args.json.write_text(json.dumps(summary, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
