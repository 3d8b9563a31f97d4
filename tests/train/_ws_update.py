"""Worker for test_world_size_two_equals_one: one policy update on a fixed global batch.

Every rank samples the same global batch (same seed), takes its share of the groups and runs the
trainer's update with the global normalisers; rank 0 saves the updated parameters.
Usage: torchrun --nproc_per_node {1,2} _ws_update.py MODEL_DIR OUT.pt
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from mathrl.algo.losses import global_normalizers  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.data import render_prompt  # noqa: E402
from mathrl.rollout import SamplingConfig, make_engine  # noqa: E402
from mathrl.train.engines import init_distributed  # noqa: E402
from mathrl.train.forward import plan_micro_batches  # noqa: E402
from mathrl.train.loop import (_update_policy, batch_logprobs, build_models, compute_advantages,  # noqa: E402
                               group_share)

sys.path.insert(0, os.path.dirname(__file__))
from _train_tasks import digit_problems, first_digit_reward  # noqa: E402


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist = init_distributed()
    cfg = load_config(None, [f"model.name={model_dir}", "rollout.n=4", "train.batch_size=4", "train.lr=1e-2",
                             "algo.kl_coef=0.04", "data.template=chat_boxed", "deepspeed.zero_stage=2",
                             "train.micro_batch_tokens=8"])
    models = build_models(cfg, dist, total_steps=1)
    # Adam's first step is lr * g / (|g| + eps) ~ lr * sign(g): float32 noise in near-zero gradients would
    # flip whole updates. eps = 1 makes the update ~ lr * g, so the comparison tests the gradient itself.
    for group in models.policy.optimizer.param_groups:
        group["eps"] = 1.0
    before = {k: v.detach().clone() for k, v in models.policy.module.named_parameters()}
    engine = make_engine("hf", model_dir, tokenizer=models.tokenizer)  # its own copy: same weights
    problems = digit_problems(4)
    prompts = [render_prompt(p, models.tokenizer, "chat_boxed") for p in problems]
    batch = engine.generate(prompts, 4, SamplingConfig(temperature=1.0, max_tokens=1, seed=123))
    golds = [p.gold for p in problems for _ in range(4)]
    scores = torch.tensor(first_digit_reward(batch.response_text, golds, None))
    mask = batch.response_mask.bool()
    advantages, _ = compute_advantages(cfg, scores, batch.group_index, mask, None, None)
    ref_logp = batch_logprobs(models.ref, batch.prompt_ids, batch.prompt_mask, batch.response_ids, mask,
                              token_budget=64, temperature=1.0, device="cpu")
    per_rank = 4 // dist.world_size
    prompts_mine = torch.arange(dist.rank * per_rank, (dist.rank + 1) * per_rank)
    rows = (prompts_mine[:, None] * 4 + torch.arange(4)[None, :]).flatten()
    plan = plan_micro_batches(batch.prompt_mask, mask, cfg.train.micro_batch_tokens, rows, group_size=group_share(cfg))
    norms = global_normalizers([mask[r] for r in plan])
    stats: dict = {}
    problem = _update_policy(cfg, dist, models, batch, plan, mask, advantages, None, ref_logp, norms, 1.0, 1.0,
                             stats)
    assert problem is None, problem
    params = {k: v.detach().clone() for k, v in models.policy.module.named_parameters()}
    if dist.is_main:
        changed = sum(int(not torch.equal(before[k], params[k])) for k in params)
        torch.save({"params": params, "changed": changed, "micro_batches": len(plan)}, out)


if __name__ == "__main__":
    main()
