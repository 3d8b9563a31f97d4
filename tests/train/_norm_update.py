"""Worker for tests/train/test_normalisation.py: one step of the product's own
:class:`~mathrl.train.trainer.Trainer` with the RL step (:class:`~mathrl.train.loop.RLMethod`) on the tiny digit
model, through the real DeepSpeed engine, on fixed responses of clearly different lengths (1..12 tokens).

The trainer sets up (run folder, models, memory fit, first weight sync) and runs its step whole: this rank's
problems drawn from the stream, "sampling" through a rollout engine, the reward, advantages (GRPO), the
loop's global normalisers, the planner's micro-batches, the agreed micro-batch count, the world-size scaling
and the update. Nothing of it is re-implemented here. The rollout engine is :class:`ReplayEngine`
(``mathrl.train.trainer.make_rollout`` replaced in this process): it answers ``generate`` with a fixed batch
(prompts of 3..8 tokens, G = 4 responses each), the same in every process; the reward is a fixed value per
response (the registered term :data:`REWARD`), so every group has advantages that differ, by group too.

For every ZeRO stage (1, 2, 3), loss aggregation, token budget (1, 2 or 4 micro-batches at world size 1; at
world size 2 rank 0 holds the long responses and needs 2 micro-batches, rank 1 only 1) and mode it runs one
trainer step; rank 0 saves the parameter change. The modes: ``global`` = the product as it is; the negative
controls are mutations of the product's own code, installed in this process for that run:

* ``per_micro``: the classic per-micro-batch token mean. ``policy_objective`` as ``mathrl.train.update`` looks
  it up gets each micro-batch's own token (and sequence) count times this rank's micro-batch count times the
  world size (the mean over micro-batches and, through DeepSpeed, over ranks) in place of the global counts;
* ``per_rank``: ``global_sum`` as ``mathrl.train.loop`` looks it up is the identity: each rank normalises by
  its own counts (world size 2 only; at world size 1 it is the product itself).

A spy around ``mathrl.train.update.accumulate_and_step`` (it calls the product's loop unchanged) records what
the step ran: this rank's real micro-batches and the agreed count; one around ``mathrl.train.loop.
compute_advantages`` records each row's advantage.

Usage: torchrun --nproc_per_node {1,2} _norm_update.py MODEL_DIR OUT.pt
"""

import contextlib
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402

import mathrl.train.loop as loop  # noqa: E402
import mathrl.train.models as tm  # noqa: E402
import mathrl.train.trainer as trainer_mod  # noqa: E402
import mathrl.train.update as tu  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.data import Problem, render_prompt  # noqa: E402
from mathrl.models import load_tokenizer  # noqa: E402
from mathrl.reward.rewards import register_reward  # noqa: E402
from mathrl.rollout import Sample, collate  # noqa: E402
from mathrl.testing.replay import ReplayEngine  # noqa: E402
from mathrl.dist.collectives import init_distributed  # noqa: E402

G = 4
PROMPT_LENS = [3, 6, 4, 8]   # "show : d d ..." = 2 + digits tokens
RESPONSE_LENS = [[12, 9, 5, 11], [7, 11, 10, 2], [4, 2, 3, 4], [3, 1, 2, 3]]  # groups 0-1 long, 2-3 short
# a fixed reward per response: not constant in any group, groups unlike each other
REWARDS = [[1.0, 0.0, 0.5, 0.2], [0.0, 1.0, 1.0, 0.3], [0.1, 0.9, 0.0, 0.4], [1.0, 0.0, 0.0, 0.0]]
# the planner's cost of a micro-batch (train.share_prompt, padded layout) = groups x max prompt + rows x max
# response: group0 51, group1 50, group2 20, group3 20; 0+1 = 108, 2+3 = 48
BUDGETS_WS1 = {1: 100_000, 2: 110, 4: 25}
BUDGET_WS2 = 60  # rank 0 (groups 0, 1): 2 micro-batches; rank 1 (groups 2, 3): 1
MAX_TOKENS = 16  # >= the longest response: the memory fit's largest micro-batch holds a whole mini-batch
STAGES = (1, 2, 3)
AGGS = ("token-mean", "seq-mean-token-mean")
REWARD = "norm_test_fixed"


def cases(world_size: int) -> list[tuple]:
    """(stage, aggregation, budget label, budget, mode) of every run of this world size."""
    budgets = BUDGETS_WS1 if world_size == 1 else {"ws2": BUDGET_WS2}
    out = []
    for stage in STAGES:
        for agg in AGGS:
            for label, budget in budgets.items():
                modes = ["global"]
                if agg == "token-mean" and label != 1:  # one micro-batch on one rank: the mutants are the product
                    modes += ["per_micro"] + (["per_rank"] if world_size > 1 else [])
                out += [(stage, agg, label, budget, mode) for mode in modes]
    return out


def fixed_rollout(tokenizer, template: str):
    """The problems, their rendered prompts and the replayed batch (prompt-major, G rows per prompt)."""
    g = torch.Generator().manual_seed(0)
    problems, prompts, prompt_ids, samples = [], [], [], []
    digits = iter(range(1000))
    for b, plen in enumerate(PROMPT_LENS):
        question = "show : " + " ".join(str(next(digits) % 10) for _ in range(plen - 2))
        problems.append(Problem(id=f"norm/{b}", question=question, gold=str(b), source="digit"))
        prompts.append(render_prompt(problems[-1], tokenizer, template))
        prompt_ids.append(tokenizer.encode(prompts[-1], add_special_tokens=False))
        assert len(prompt_ids[-1]) == plen, (prompts[-1], prompt_ids[-1])
        group = []
        for n in RESPONSE_LENS[b]:
            ids = (torch.randint(3, 13, (n,), generator=g)).tolist()  # digit tokens
            logprobs = (-torch.rand(n, generator=g) * 3).tolist()   # the "sampler's" logprobs
            group.append(Sample(token_ids=ids, logprobs=logprobs, finish_reason="stop", text=tokenizer.decode(ids)))
        assert len({s.text for s in group}) == G, "responses of a group must differ (the reward reads the text)"
        samples.append(group)
    batch = collate(prompt_ids, samples, prompts, tokenizer.pad_token_id)
    batch.validate()
    table = {(str(b), s.text): REWARDS[b][j] for b, group in enumerate(samples) for j, s in enumerate(group)}
    return problems, prompts, batch, table


@contextlib.contextmanager
def patched(module, name: str, value):
    """``module.name = value`` for the block (the product looks the name up in ``module`` at call time)."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def spies(record: dict):
    """Record the step's micro-batches (this rank's real ones, the agreed count) and advantages; the product's
    functions run unchanged."""
    real_acc, real_adv = tu.accumulate_and_step, loop.compute_advantages

    def accumulate_and_step(engine, plan, micro_loss, **kw):
        if kw.get("what") == "policy":
            record["micro_batches"] = (sum(bool(r) for _, r in plan), len(plan))
        return real_acc(engine, plan, micro_loss, **kw)

    def compute_advantages(cfg, scores, group_index, mask, *args, **kw):
        adv, returns = real_adv(cfg, scores, group_index, mask, *args, **kw)
        record["advantages"] = ((adv * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist()
        return adv, returns

    stack = contextlib.ExitStack()
    stack.enter_context(patched(tu, "accumulate_and_step", accumulate_and_step))
    stack.enter_context(patched(loop, "compute_advantages", compute_advantages))
    return stack


def mutation(mode: str, record: dict, world_size: int):
    """The mutated product code of ``mode`` (see the module docstring); nothing for ``global``."""
    if mode == "per_rank":
        return patched(loop, "global_sum", lambda t: t)
    if mode == "per_micro":
        real = tu.policy_objective

        def policy_objective(logp, old, adv, m, **kw):
            n_micro = record["micro_batches"][0]  # this rank's real micro-batches (set by the spy before)
            kw["norm_tokens"] = float(m.sum()) * n_micro * world_size
            kw["norm_seqs"] = float(m.any(-1).sum()) * n_micro * world_size
            return real(logp, old, adv, m, **kw)

        return patched(tu, "policy_objective", policy_objective)
    assert mode == "global", mode
    return contextlib.nullcontext()


def run_case(model_dir: str, out_dir: str, problems, stage: int, agg: str, budget: int, mode: str, dist):
    """One trainer step of the case: the parameter change (rank 0; None elsewhere) and the spies' record."""
    cfg = load_config(None, [
        f"model.name={model_dir}", "rollout.backend=hf", f"rollout.n={G}", f"rollout.max_tokens={MAX_TOKENS}",
        f"train.batch_size={len(PROMPT_LENS)}", "train.lr=1.0", "train.max_grad_norm=0", "algo.kl_coef=0",
        "algo.entropy_coef=0.01", "algo.ppo_epochs=1", f"algo.loss_agg={agg}", "data.template=chat_boxed",
        "data.shuffle=false", f"reward.terms={{{REWARD}: {{}}}}", f"deepspeed.zero_stage={stage}",
        f"train.micro_batch_tokens={budget}", f"train.output_dir={out_dir}", "train.steps=1",
        "train.save_every_minutes=0", "logging.tensorboard=false", "logging.console=plain", "logging.log_samples=0",
        "train.dist_timeout_minutes=4"])
    record: dict = {}
    trainer = trainer_mod.Trainer(cfg, loop.RLMethod(), problems=problems)
    trainer.setup()
    try:
        assert cfg.train.micro_batch_tokens == budget, "the memory fit changed the budget: the split would differ"
        models = trainer.models
        # Adam's first step is lr * g / (|g| + eps): with eps = 1 and lr = 1 it is ~ g itself, so the weight
        # change compares the gradients, not their signs
        for group in models.policy.optimizer.param_groups:
            group["eps"] = 1.0
        before = tm.full_state_dict(models.policy)  # a collective under ZeRO-3; None off rank 0
        before = {k: v.clone() for k, v in before.items()} if dist.is_main else None
        with spies(record), mutation(mode, record, dist.world_size):
            metrics = trainer.step()
        assert metrics.get("bad_step", 0) == 0, metrics
        after = tm.full_state_dict(models.policy)
        delta = {k: after[k].float() - before[k].float() for k in before} if dist.is_main else None
    finally:
        trainer.close()
    return delta, record


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist = init_distributed()
    tokenizer = load_tokenizer(model_dir)
    problems, prompts, recorded, table = fixed_rollout(tokenizer, "chat_boxed")
    register_reward(REWARD, needs_grades=False)(
        lambda ctx: [table[(gold, text)] for text, gold in zip(ctx.responses, ctx.golds)])
    trainer_mod.make_rollout = lambda cfg, models: ReplayEngine(recorded, prompts, tokenizer)
    root = os.path.join(os.path.dirname(os.path.abspath(out)), f"runs_{os.path.basename(out)}")
    deltas, records = {}, {}
    for stage, agg, label, budget, mode in cases(dist.world_size):
        key = (stage, agg, label, mode)
        delta, records[key] = run_case(model_dir, os.path.join(root, "_".join(map(str, key))), problems, stage,
                                       agg, budget, mode, dist)
        if dist.is_main:
            deltas[key] = delta
    gathered = [None] * dist.world_size
    tdist.all_gather_object(gathered, records)
    if dist.is_main:
        lengths = recorded.response_mask.sum(1).tolist()
        torch.save({"deltas": deltas, "records": gathered, "lengths": lengths}, out)


if __name__ == "__main__":
    main()
