"""Steps 1-3 of an RL step, shared by the RL loop and the ablation methods: draw this rank's problems,
sample G responses each, grade and score them."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mathrl.config import Config
from mathrl.rollout import RolloutBatch, SamplingConfig
from mathrl.dist.collectives import DistInfo
from mathrl.algo.filtering import Selection, draw_prompts, group_pass_rates, informative_groups, select_pooled
from mathrl.algo.process import StepRewards
from mathrl.data import get_template, render_prompt
from mathrl.data.splits import step_indices, stream_index
from mathrl.dist.collectives import all_gather_objects, global_sum
from mathrl.reward.api import GradeStream
from mathrl.reward.options import GradeOptions
from mathrl.reward.rewards import RewardContext, compute_rewards, needs_grades, reward_terms
from mathrl.rollout import colocate
from mathrl.rollout.batch import select_groups


def sampling_seed(cfg: Config, step: int, rank: int, round_: int = 0) -> int:
    """A seed per (run seed, step, rank, sampling round), hashed so that no two share vLLM's per-sample
    seed streams (vLLM seeds sample j of a call with seed + j, so nearby seeds would reuse noise)."""
    key = f"mathrl/{cfg.train.seed}/{step}/{rank}" + (f"/round{round_}" if round_ else "")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def stop_strings(cfg: Config) -> tuple[str, ...]:
    """rollout.stop plus the prompt template's own stops (few-shot plain prompts)."""

    return tuple(dict.fromkeys([*cfg.rollout.stop, *get_template(cfg.data.template).stop]))


@dataclass
class Sampled:
    """Steps 1-3 of an RL step on this rank: the problems, the rollout batch (G rows per problem, in
    problem order) and the scores. ``grades`` is None when no reward term needs the verifier."""

    problems: list
    batch: RolloutBatch
    golds: list[str]
    truncated: list[bool]
    grades: list | None
    scores: torch.Tensor            # [N] float32, the reward of each response
    correct: list[bool]
    times: dict[str, float] = field(default_factory=dict)
    indices: list[int] = field(default_factory=list)   # the problems' indices in the training set
    stats: dict[str, float] = field(default_factory=dict)  # dynamic sampling's sampling/* metrics
    streamed: int = 0               # responses graded while the engine was still generating (reward.stream)


def merge_groups(rounds: list[Sampled], picks: list[tuple[int, int]]) -> Sampled:
    """One :class:`Sampled` made of whole groups of several rounds (``picks``: (round, group) pairs in
    batch order); the times of all rounds are summed."""

    G = rounds[0].batch.group_size
    rows = [(k, i * G + j) for k, i in picks for j in range(G)]
    times: dict[str, float] = {}
    for s in rounds:
        for key, v in s.times.items():
            times[key] = times.get(key, 0.0) + v
    graded = all(s.grades is not None for s in rounds)
    return Sampled(problems=[rounds[k].problems[i] for k, i in picks],
                   batch=select_groups([s.batch for s in rounds], picks),
                   golds=[rounds[k].golds[r] for k, r in rows], truncated=[rounds[k].truncated[r] for k, r in rows],
                   grades=[rounds[k].grades[r] for k, r in rows] if graded else None,
                   scores=torch.stack([rounds[k].scores[r] for k, r in rows]),
                   correct=[rounds[k].correct[r] for k, r in rows], times=times,
                   indices=[rounds[k].indices[i] for k, i in picks], streamed=sum(s.streamed for s in rounds))


def sample_step(cfg: Config, dist: DistInfo, tokenizer, rollout, problems: list, state) -> Sampled:
    """Steps 1-3 of RL step ``state.step`` with the data stream position and the prompt filter of ``state``.

    Without dynamic sampling and the pass-rate filter this is :func:`sample_and_grade` of the step
    (positions ``step * B .. step * B + B - 1`` of the stream). Otherwise every round draws B prompts from
    ``state.prompts_used`` on (skipping filtered ones; every rank draws the same B and keeps its share),
    samples and grades them; with ``algo.dynamic_sampling`` rounds continue until the whole batch has B
    informative groups or ``algo.sampling_rounds`` rounds were sampled (the count is summed over ranks, so
    all ranks sample the same number of rounds), and the informative groups are pooled over the ranks
    (:func:`mathrl.algo.filtering.select_pooled`, :func:`pooled_share`). Round 0 samples with the step's
    own seed, so a step whose first round suffices is the plain step. Records every prompt's pass rate
    (all ranks') in the filter and advances ``state.prompts_used``."""

    a, t = cfg.algo, cfg.train
    B, G = t.batch_size, cfg.rollout.n
    per_rank = B // dist.world_size
    lo, hi = dist.rank * per_rank, (dist.rank + 1) * per_rank
    if state.prompts_used is None:  # a checkpoint from before the stream position was saved
        state.prompts_used = state.step * B
    if not a.dynamic_sampling and a.pass_rate_filter == 0:
        s = sample_and_grade(cfg, dist, tokenizer, rollout, problems, state.step)
        state.prompts_used += B
        return s
    n = len(problems)
    rounds: list[Sampled] = []
    masks = []
    consumed = 0
    for k in range(a.sampling_rounds if a.dynamic_sampling else 1):
        drawn, pos = draw_prompts(lambda p: stream_index(n, p, t.seed, cfg.data.shuffle), state.prompts_used, B,
                                  state.pass_filter.skip, limit=n)
        consumed += pos - state.prompts_used
        state.prompts_used = pos
        seed = None if k == 0 else sampling_seed(cfg, state.step, dist.rank, round_=k)
        s = sample_and_grade(cfg, dist, tokenizer, rollout, problems, state.step, indices=drawn[lo:hi], seed=seed)
        rounds.append(s)
        masks.append(informative_groups(s.scores, G))
        # every rank records every prompt's pass rate: the filter is the same on all ranks
        rates = torch.zeros(B, dtype=torch.float64)
        rates[lo:hi] = torch.tensor(group_pass_rates(s.correct, G), dtype=torch.float64)
        rates = global_sum(rates)
        for i, r in zip(drawn, rates.tolist()):
            state.pass_filter.record(i, r)
        have = int(sum(int(m.sum()) for m in masks))
        # the informative groups of all ranks are pooled: stop when the whole batch has B of them
        if not a.dynamic_sampling or global_sum(torch.tensor(float(have))) >= B:
            break
    if not a.dynamic_sampling:
        s = rounds[0]
        s.stats = {"sampling/prompts_consumed": float(consumed), "sampling/skipped_prompts": float(consumed - B)}
        return s
    sel = select_pooled([[torch.tensor(m, dtype=torch.bool) for m in ms]
                         for ms in all_gather_objects([m.tolist() for m in masks])], per_rank)
    out = pooled_share(rounds, sel, dist.rank)
    sampled_groups = sum(m.numel() for m in masks)
    right = sum(sum(map(bool, s.correct)) for s in rounds)
    totals = global_sum(torch.tensor([sampled_groups, sampled_groups - sum(int(m.sum()) for m in masks), right],
                                     dtype=torch.float64)).tolist()
    # reward/accuracy is over the trained groups, which the filter biases towards half right; the
    # policy's own accuracy on the stream is over every response sampled in every round
    out.stats = {"sampling/rounds": float(len(rounds)), "sampling/prompts_consumed": float(consumed),
                 "sampling/skipped_prompts": float(consumed - B * len(rounds)),
                 "sampling/filtered_frac": totals[1] / max(totals[0], 1.0),
                 "sampling/filled_groups": float(sel.filled), "sampling/surplus_groups": float(sel.surplus),
                 "sampling/moved_groups": float(len(sel.moved)),
                 "sampling/accuracy_sampled": totals[2] / max(totals[0] * G, 1.0)}
    return out


def pooled_share(rounds: list[Sampled], sel: Selection, rank: int) -> Sampled:
    """This rank's groups of the pooled selection ``sel`` (:func:`mathrl.algo.filtering.select_pooled`), in
    batch order: its own from ``rounds``, the others' received from the ranks that sampled them (one
    all-gather of the moved groups, only when some move; every rank takes the same branch, since ``sel`` is
    the same on all)."""
    moved = sel.moved
    received: dict[tuple[int, int, int], Sampled] = {}
    if moved:
        outgoing = {g: merge_groups(rounds, [g[1:]]) for g in moved if g[0] == rank}
        for one in outgoing.values():  # the sender's times and streamed count stay with the sender
            one.times, one.streamed = {}, 0
        for sent in all_gather_objects(outgoing):
            received.update(sent)
    sources = list(rounds)
    picks: list[tuple[int, int]] = []
    for g in sel.assigned[rank]:
        if g[0] == rank:
            picks.append(g[1:])
        else:
            sources.append(received[g])
            picks.append((len(sources) - 1, 0))
    return merge_groups(sources, picks)


@dataclass
class Request:
    """What one generation call of step ``step`` asks for on this rank: the problems (and their indices
    in the training set), their rendered prompts and the sampling parameters with the step's seed."""

    step: int
    problems: list
    indices: list[int]
    prompts: list[str]
    sampling: SamplingConfig


def make_request(cfg: Config, dist: DistInfo, tokenizer, problems: list, step: int,
                 indices: list[int] | None = None, seed: int | None = None) -> Request:
    """Step 1: the problems of step ``step`` (0-based; this rank's share of the stream, or ``indices``),
    their prompts (chat template) and the sampling parameters (the step's seed, or ``seed``)."""

    t = cfg.train
    per_rank = t.batch_size // dist.world_size
    if indices is None:
        idx = step_indices(len(problems), step, t.batch_size, t.seed, cfg.data.shuffle)
        indices = idx[dist.rank * per_rank:(dist.rank + 1) * per_rank]
    batch_problems = [problems[i] for i in indices]
    prompts = [render_prompt(p, tokenizer, cfg.data.template) for p in batch_problems]
    sampling = rollout_sampling(cfg, sampling_seed(cfg, step, dist.rank) if seed is None else seed)
    return Request(step=step, problems=batch_problems, indices=list(indices), prompts=prompts, sampling=sampling)


def rollout_sampling(cfg: Config, seed: int | None) -> SamplingConfig:
    """The run's sampling parameters (``rollout.*`` and :func:`stop_strings`) with ``seed``: what a training
    step samples with, and what every other sampler of the run (a PRM's step-label completions) must use."""
    r = cfg.rollout
    return SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens,
                          stop=stop_strings(cfg), seed=seed)


def grade_stream(cfg: Config, req: Request):
    """A :class:`mathrl.reward.GradeStream` for the responses of ``req`` (the engine's ``on_row`` feeds
    it while generating), or None when ``reward.stream`` is off or no reward term needs the verifier."""

    if not cfg.reward.stream or not needs_grades(reward_terms(cfg)):
        return None
    golds = [p.gold for p in req.problems for _ in range(cfg.rollout.n)]
    return GradeStream(golds, GradeOptions.from_config(cfg))


def stream_feeder(stream):
    """The ``on_row`` callback that hands a finished response to ``stream`` (None: no callback)."""
    return None if stream is None else stream.on_row


def grade_and_score(cfg: Config, req: Request, batch, times: dict[str, float], stream=None) -> Sampled:
    """Step 3: grade the responses of ``batch`` (the rollout of ``req``; verifier worker processes, hard
    timeouts) and turn the grades into rewards (``reward.*`` terms). ``times`` gets ``grade``: with a
    ``stream`` fed during generation, only the wait for what it has not graded yet."""
    from mathrl.reward import grade_batch  # here: looked up at call time, tests stand in for mathrl.reward.grade_batch

    r = cfg.rollout
    G = r.n
    t0 = time.perf_counter()
    truncated = batch.truncated
    golds = [p.gold for p in req.problems for _ in range(G)]
    terms = reward_terms(cfg)  # reward.terms, or the reward.function shorthand
    grades = None
    if stream is not None:
        grades = stream.finish(batch.response_text, truncated)
    elif needs_grades(terms):
        grades = grade_batch(batch.response_text, golds, GradeOptions.from_config(cfg), truncated=truncated)
    ctx = RewardContext(responses=batch.response_text, grades=grades, truncated=truncated,
                        lengths=[int(n) for n in batch.response_mask.sum(1)], max_length=r.max_tokens, golds=golds)
    score_list = compute_rewards(terms, ctx)
    correct = [g.correct for g in grades] if grades is not None else [x > 0 for x in score_list]
    times["grade"] = time.perf_counter() - t0
    return Sampled(problems=req.problems, batch=batch, golds=golds, truncated=truncated, grades=grades,
                   scores=torch.tensor(score_list, dtype=torch.float32), correct=correct, times=times,
                   indices=list(req.indices), streamed=stream.streamed if stream is not None else 0)


def sample_and_grade(cfg: Config, dist: DistInfo, tokenizer, rollout, problems: list, step: int,
                     indices: list[int] | None = None, seed: int | None = None) -> Sampled:
    """Draw the problems of step ``step`` (0-based; this rank's share), sample ``rollout.n`` responses
    each, grade them with the verifier and turn the grades into rewards (``reward.*`` terms).
    ``indices`` (this rank's problem indices) and ``seed`` replace the step's own draw and sampling
    seed (dynamic sampling's later rounds).

    The verifier runs when a configured reward term needs grades; a custom task whose terms do not
    (``register_reward(name, needs_grades=False)``) skips it, and a response counts as correct when its
    reward is > 0. Used by the RL loop and the ablation methods, so they see the same problems, prompts
    and samples at the same step.
    """

    # 1. the problems of this step (this rank's share) and their prompts
    req = make_request(cfg, dist, tokenizer, problems, step, indices=indices, seed=seed)

    # 2. G responses per prompt (colocated schedule, rollout.sleep_between_steps: wake the KV cache
    #    before, sleep after; both no-ops without it)
    #    Each response is handed to the verifier as soon as it is finished (reward.stream).
    times: dict[str, float] = dict(colocate.before_generate(rollout))
    stream = grade_stream(cfg, req)
    t0 = time.perf_counter()
    try:
        batch = rollout.generate(req.prompts, cfg.rollout.n, req.sampling, on_row=stream_feeder(stream))
    except BaseException:
        if stream is not None:
            stream.close()
        raise
    times["generate"] = time.perf_counter() - t0
    if batch.meta.get("engine_s") is not None:  # the engine's own part of it (model forwards / vLLM's call)
        times["generate_engine"] = float(batch.meta["engine_s"])
    times.update(colocate.after_generate(rollout))

    # 3. grade (what the stream has not graded yet) and reward
    return grade_and_score(cfg, req, batch, times, stream=stream)


def sample_records(s: Sampled, advantages: torch.Tensor, mask: torch.Tensor, k: int,
                   steps: StepRewards | None = None) -> list[dict[str, Any]]:
    """``k`` of the step's completions for ``rollouts.jsonl``, spread evenly over the rows (so over the
    groups): prompt, response, extracted answer, gold, reward, the response's mean advantage, finish
    reason and length; with process rewards (``steps``) also each step's reward and the token through which it
    is credited (``step_rewards``, ``step_ends``)."""
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
        if steps is not None:
            real = steps.mask[i].bool()
            out[-1].update(step_rewards=steps.rewards[i][real].tolist(), step_ends=steps.ends[i][real].tolist())
    return out
