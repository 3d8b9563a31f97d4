"""Worker for tests/train/test_uneven_ranks.py: the real SmolLM2-135M-Instruct, sampled responses of up
to 64 tokens, one GRPO update of one PPO epoch (old and reference logprobs, then the policy step) under
ZeRO-2 and ZeRO-3 on a fixed global batch, where the two ranks get different numbers of micro-batches.

Every rank samples the same global batch (same seed, its own hf engine), grades it with the real
verifier, computes the group advantages, and takes its share: rank 0 the three groups with the longest
prompt + responses, rank 1 the shortest. The token budget is the cost of the costliest group, so rank 1
runs one micro-batch per pass and rank 0 three. Rank 0 saves the parameter change and the counts.

One ZeRO stage per process (two SmolLM2 engines plus their reference models in one process would
need ~10 GB). Usage: torchrun --nproc_per_node {1,2} _uneven_update.py MODEL_DIR OUT.pt STAGE
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402

import mathrl.train.loop as loop  # noqa: E402
import mathrl.train.models as tm  # noqa: E402
import mathrl.train.update as tu  # noqa: E402
from mathrl.train.forward import batch_logprobs  # noqa: E402
from mathrl.algo.losses import global_normalizers  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.data import load_problems, render_prompt  # noqa: E402
from mathrl.reward import grade_batch  # noqa: E402
from mathrl.reward.rewards import RewardContext, compute_rewards  # noqa: E402
from mathrl.rollout import SamplingConfig, make_engine  # noqa: E402
from mathrl.train.engines import global_sum, init_distributed  # noqa: E402
from mathrl.train.forward import agreed_plan, plan_micro_batches  # noqa: E402

G, B, MAX_TOKENS = 2, 4, 64


def group_cost(pmask, mask, groups) -> int:
    rows = (torch.as_tensor(groups)[:, None] * G + torch.arange(G)[None, :]).flatten()
    return len(groups) * int(pmask[rows].sum(1).max()) + len(rows) * int(mask[rows].sum(1).max())


def main() -> None:
    model_dir, out, stage = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    dist = init_distributed()
    problems = load_problems("synthetic", None, "train", n=B, level=3, seed=5)
    sampler = None
    results, counts = {}, {}
    for stage in (stage,):
        cfg = load_config(None, [
            f"model.name={model_dir}", f"rollout.n={G}", f"train.batch_size={B}", "train.lr=2e-2",
            "train.max_grad_norm=0", "algo.kl_coef=0.04", "algo.entropy_coef=0.01", "algo.ppo_epochs=1",
            "data.template=chat_boxed_oneshot", f"deepspeed.zero_stage={stage}", "reward.function=correctness_format",
            "reward.format_bonus=0.2"])
        models = tm.build_models(cfg, dist, total_steps=1)
        for group in models.policy.optimizer.param_groups:
            group["eps"] = 1.0  # Adam's step ~ lr * g: the change compares gradients, not their signs
        if sampler is None:
            sampler = make_engine("hf", model_dir, tokenizer=models.tokenizer)  # its own copy: same weights
            prompts = [render_prompt(p, models.tokenizer, cfg.data.template) for p in problems]
            batch = sampler.generate(prompts, G, SamplingConfig(temperature=1.0, max_tokens=MAX_TOKENS, seed=11))
            sampler.close()
            mask = batch.response_mask.bool()
            golds = [p.gold for p in problems for _ in range(G)]
            truncated = [f == "length" for f in batch.finish_reason]
            grades = grade_batch(batch.response_text, golds, timeout=10.0, workers=1, truncated=truncated)
            ctx = RewardContext(responses=batch.response_text, grades=grades, truncated=truncated)
            scores = torch.tensor(compute_rewards({"correctness": {}, "format": {"bonus": 0.2}}, ctx))
            # rank 0: the three costliest groups, rank 1: the cheapest; a budget of the costliest single
            # group gives rank 1 one micro-batch and rank 0 three (two groups never fit: the ~200-token
            # prompts alone cost more), whatever lengths the sample has
            order = sorted(range(B), key=lambda g: -group_cost(batch.prompt_mask, mask, [g]))
            shares = [sorted(order[:3]), sorted(order[3:])] if dist.world_size == 2 else [list(range(B))]
            budget = group_cost(batch.prompt_mask, mask, order[:1])
        advantages, _ = loop.compute_advantages(cfg, scores, batch.group_index, mask, None, None)
        before = tm.full_state_dict(models.policy)
        before = {k: v.clone() for k, v in before.items()} if dist.is_main else None
        gs = tu.group_share(cfg)
        fwd = dict(token_budget=budget, temperature=1.0, device="cpu", group_size=gs)
        mine = torch.as_tensor(shares[dist.rank])
        rows = (mine[:, None] * G + torch.arange(G)[None, :]).flatten()
        pids, pmask, rids = batch.prompt_ids[rows], batch.prompt_mask[rows], batch.response_ids[rows]
        # no-grad forwards over this rank's rows (ZeRO-3 gathers parameters inside each one)
        old = torch.zeros_like(batch.logprobs)
        ref = torch.zeros_like(batch.logprobs)
        old[rows] = batch_logprobs(models.policy.module, pids, pmask, rids, mask[rows], **fwd)
        ref[rows] = batch_logprobs(models.ref, pids, pmask, rids, mask[rows], **fwd)
        n_micro = []
        for _epoch in range(cfg.algo.ppo_epochs):
            plan = plan_micro_batches(batch.prompt_mask, mask, budget, rows, group_size=gs)
            n_micro.append(len(plan))
            norms = global_normalizers([mask[r] for r in plan], reduce=global_sum)
            tb = tu.TrainBatch(batch=batch, mask=mask, advantages=advantages, old_logp=old, ref_logp=ref,
                               norm_const=float(MAX_TOKENS))
            problem = tu.update_policy(cfg, dist, models, tb, agreed_plan(plan, gs), norms, {})
            assert problem is None, problem
        after = tm.full_state_dict(models.policy)
        if dist.is_main:
            results[stage] = {k: after[k].float() - before[k].float() for k in before}
        counts[stage] = n_micro
        del models
    gathered = [None] * dist.world_size
    tdist.all_gather_object(gathered, counts)
    if dist.is_main:
        torch.save({"deltas": results, "micro_batches": gathered, "lengths": mask.sum(1).tolist(),
                    "scores": scores.tolist(), "budget": budget}, out)


if __name__ == "__main__":
    main()
