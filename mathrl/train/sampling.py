"""Steps 1-3 of an RL step, shared by the RL loop and the ablation methods: draw this rank's problems,
sample G responses each, grade and score them."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mathrl.config import Config
from mathrl.train.engines import DistInfo


def sampling_seed(cfg: Config, step: int, rank: int) -> int:
    """A seed per (run seed, step, rank), hashed so that no two share vLLM's per-sample seed streams
    (vLLM seeds sample j of a call with seed + j, so nearby seeds would reuse noise)."""
    digest = hashlib.sha256(f"mathrl/{cfg.train.seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def stop_strings(cfg: Config) -> tuple[str, ...]:
    """rollout.stop plus the prompt template's own stops (few-shot plain prompts)."""
    from mathrl.data import get_template

    return tuple(dict.fromkeys([*cfg.rollout.stop, *get_template(cfg.data.template).stop]))


@dataclass
class Sampled:
    """Steps 1-3 of an RL step on this rank: the problems, the rollout batch (G rows per problem, in
    problem order) and the scores. ``grades`` is None when no reward term needs the verifier."""

    problems: list
    batch: Any                      # mathrl.rollout.RolloutBatch
    golds: list[str]
    truncated: list[bool]
    grades: list | None
    scores: torch.Tensor            # [N] float32, the reward of each response
    correct: list[bool]
    times: dict[str, float] = field(default_factory=dict)


def sample_and_grade(cfg: Config, dist: DistInfo, tokenizer, rollout, problems: list, step: int) -> Sampled:
    """Draw the problems of step ``step`` (0-based; this rank's share), sample ``rollout.n`` responses
    each, grade them with the verifier and turn the grades into rewards (``reward.*`` terms).

    The verifier runs when a configured reward term needs grades; a custom task whose terms do not
    (``register_reward(name, needs_grades=False)``) skips it, and a response counts as correct when its
    reward is > 0. Used by the RL loop and the ablation methods, so they see the same problems, prompts
    and samples at the same step.
    """
    from mathrl.data import render_prompt
    from mathrl.data.splits import step_indices
    from mathrl.reward import grade_batch
    from mathrl.reward.rewards import RewardContext, compute_rewards, needs_grades, reward_terms
    from mathrl.rollout import SamplingConfig, colocate
    from mathrl.train.faults import fault

    t, r = cfg.train, cfg.rollout
    G = r.n
    times: dict[str, float] = {}

    # 1. the problems of this step (this rank's share) and their prompts
    per_rank = t.batch_size // dist.world_size
    idx = step_indices(len(problems), step, t.batch_size, t.seed, cfg.data.shuffle)
    batch_problems = [problems[i] for i in idx[dist.rank * per_rank:(dist.rank + 1) * per_rank]]
    prompts = [render_prompt(p, tokenizer, cfg.data.template) for p in batch_problems]

    # 2. G responses per prompt (colocated schedule, rollout.sleep_between_steps: wake the KV cache
    #    before, sleep after; both no-ops without it)
    times.update(colocate.before_generate(rollout))
    t0 = time.perf_counter()
    sampling = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens,
                              stop=stop_strings(cfg), seed=sampling_seed(cfg, step, dist.rank))
    batch = rollout.generate(prompts, G, sampling)
    times["generate"] = time.perf_counter() - t0
    times.update(colocate.after_generate(rollout))
    fault("generate", step + 1)

    # 3. grade (verifier worker processes, hard timeouts) and reward
    t0 = time.perf_counter()
    truncated = [f == "length" for f in batch.finish_reason]
    golds = [p.gold for p in batch_problems for _ in range(G)]
    terms = reward_terms(cfg)  # reward.terms, or the reward.function shorthand
    grades = None
    if needs_grades(terms):
        grades = grade_batch(batch.response_text, golds, timeout=cfg.reward.timeout, workers=cfg.reward.workers,
                             truncated=truncated, rel_tol=cfg.reward.rel_tol)
    ctx = RewardContext(responses=batch.response_text, grades=grades, truncated=truncated,
                        lengths=[int(n) for n in batch.response_mask.sum(1)], max_length=r.max_tokens, golds=golds)
    score_list = compute_rewards(terms, ctx)
    correct = [g.correct for g in grades] if grades is not None else [x > 0 for x in score_list]
    times["grade"] = time.perf_counter() - t0
    return Sampled(problems=batch_problems, batch=batch, golds=golds, truncated=truncated, grades=grades,
                   scores=torch.tensor(score_list, dtype=torch.float32), correct=correct, times=times)


def sample_records(s: Sampled, advantages: torch.Tensor, mask: torch.Tensor, k: int) -> list[dict[str, Any]]:
    """``k`` of the step's completions for ``rollouts.jsonl``, spread evenly over the rows (so over the
    groups): prompt, response, extracted answer, gold, reward, the response's mean advantage, finish
    reason and length."""
    n = len(s.batch.response_text)
    if k <= 0 or n == 0:
        return []
    rows = sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(min(k, n))})
    G = s.batch.group_size
    m = mask.float()
    adv = (advantages * m).sum(1) / m.sum(1).clamp(min=1)
    out = []
    for i in rows:
        g = s.grades[i] if s.grades is not None else None
        out.append({"prompt": s.batch.prompt_text[i // G], "response": s.batch.response_text[i],
                    "extracted": g.extracted if g is not None else None, "gold": s.golds[i],
                    "reward": float(s.scores[i]), "advantage": float(adv[i]), "correct": bool(s.correct[i]),
                    "finish_reason": s.batch.finish_reason[i], "tokens": int(mask[i].sum())})
    return out
