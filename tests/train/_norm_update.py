"""Worker for tests/train/test_normalisation.py: one policy update through the real DeepSpeed engine on a
fixed batch whose responses have clearly different lengths (2..12 tokens).

For every ZeRO stage (1, 2, 3), loss aggregation, token budget (1, 2 or 4 micro-batches at world size
1; at world size 2 rank 0 holds the long responses and needs 2 micro-batches, rank 1 only 1) and
normaliser ("global" = mathrl's; "per_micro" = a mutated trainer with the classic per-micro-batch
token mean, the negative control), it builds the policy, runs ``update_policy`` on this rank's share
and rank 0 saves the parameter change.

Usage: torchrun --nproc_per_node {1,2} _norm_update.py MODEL_DIR OUT.pt
"""

import os
import sys
from types import SimpleNamespace

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

import mathrl.train.models as tm  # noqa: E402
import mathrl.algo.objectives as objectives  # noqa: E402
import mathrl.train.update as tu  # noqa: E402
from mathrl.algo.losses import POLICY_LOSSES  # noqa: E402
from mathrl.algo.losses import global_normalizers  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.train.engines import global_sum, init_distributed  # noqa: E402
from mathrl.train.forward import agreed_plan, plan_micro_batches  # noqa: E402

G = 4
PROMPT_LENS = [3, 6, 4, 8]
RESPONSE_LENS = [[12, 9, 5, 11], [7, 11, 10, 2], [4, 2, 3, 4], [3, 1, 2, 3]]  # groups 0-1 long, 2-3 short
# share_prompt cost of a micro-batch = groups x max prompt + rows x max response:
# group0 51, group1 50, group2 20, group3 20; 0+1 = 108, 2+3 = 48
BUDGETS_WS1 = {1: 100_000, 2: 110, 4: 25}
BUDGET_WS2 = 60  # rank 0 (groups 0, 1): 2 micro-batches; rank 1 (groups 2, 3): 1
STAGES = (1, 2, 3)
AGGS = ("token-mean", "seq-mean-token-mean")


def make_batch():
    g = torch.Generator().manual_seed(0)
    B, P, T = len(PROMPT_LENS), max(PROMPT_LENS), max(max(r) for r in RESPONSE_LENS)
    pids = torch.zeros(B * G, P, dtype=torch.long)
    pmask = torch.zeros(B * G, P, dtype=torch.long)
    rids = torch.zeros(B * G, T, dtype=torch.long)
    rmask = torch.zeros(B * G, T, dtype=torch.bool)
    for b, plen in enumerate(PROMPT_LENS):
        prompt = torch.randint(3, 13, (plen,), generator=g)
        for j in range(G):
            i = b * G + j
            pids[i, P - plen:], pmask[i, P - plen:] = prompt, 1
            n = RESPONSE_LENS[b][j]
            rids[i, :n] = torch.randint(3, 13, (n,), generator=g)
            rmask[i, :n] = True
    adv = torch.randn(B * G, generator=g)[:, None].expand(-1, T) * rmask
    ref_logp = -torch.rand(B * G, T, generator=g) * 3 * rmask
    sampler_logp = -torch.rand(B * G, T, generator=g) * 3 * rmask  # the rollout engine's logprobs
    batch = SimpleNamespace(prompt_ids=pids, prompt_mask=pmask, response_ids=rids, logprobs=sampler_logp)
    return batch, rmask, adv.contiguous(), ref_logp


def per_micro_mutation(n_micro: int, world: int):
    """The classic (wrong) normaliser: each micro-batch's own token/sequence count, averaged over the
    micro-batches of this rank and (by DeepSpeed) over ranks."""
    real = POLICY_LOSSES["ppo"], objectives.agg_loss

    def fix(kw, m):
        kw = dict(kw)
        kw["norm_tokens"] = float(m.sum()) * n_micro * world
        kw["norm_seqs"] = float(m.any(-1).sum()) * n_micro * world
        return kw

    def policy_loss(logp, old, adv, m, **kw):
        return real[0](logp, old, adv, m, **fix(kw, m))

    def agg_loss(x, m, **kw):
        return real[1](x, m, **fix(kw, m))

    return policy_loss, agg_loss


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist = init_distributed()
    batch, mask, adv, ref_logp = make_batch()
    groups = torch.arange(len(PROMPT_LENS)).tensor_split(dist.world_size)[dist.rank]
    rows = (groups[:, None] * G + torch.arange(G)[None, :]).flatten()
    budgets = BUDGETS_WS1 if dist.world_size == 1 else {"ws2": BUDGET_WS2}
    results, plans = {}, {}
    originals = POLICY_LOSSES["ppo"], objectives.agg_loss
    for stage in STAGES:
        for agg in AGGS:
            for label, budget in budgets.items():
                for mode in (("global", "per_micro") if agg == "token-mean" else ("global",)):
                    cfg = load_config(None, [
                        f"model.name={model_dir}", f"rollout.n={G}", f"train.batch_size={len(PROMPT_LENS)}",
                        "train.lr=1.0", "train.max_grad_norm=0", "algo.kl_coef=0.1", "algo.entropy_coef=0.01",
                        f"algo.loss_agg={agg}", f"deepspeed.zero_stage={stage}", f"train.micro_batch_tokens={budget}"])
                    models = tm.build_models(cfg, dist, total_steps=1)
                    # Adam's first step is lr * g / (|g| + eps): with eps = 1 and lr = 1 it is ~ g itself,
                    # so the weight change compares the gradients, not their signs
                    for group in models.policy.optimizer.param_groups:
                        group["eps"] = 1.0
                    before = tm.full_state_dict(models.policy)  # a collective under ZeRO-3; None off rank 0
                    before = {k: v.clone() for k, v in before.items()} if dist.is_main else None
                    plan = plan_micro_batches(batch.prompt_mask, mask, budget, rows, group_size=tu.group_share(cfg))
                    norms = global_normalizers([mask[r] for r in plan], reduce=global_sum)
                    if mode == "per_micro":
                        POLICY_LOSSES["ppo"], objectives.agg_loss = per_micro_mutation(len(plan), dist.world_size)
                    try:
                        tb = tu.TrainBatch(batch=batch, mask=mask, advantages=adv, ref_logp=ref_logp, norm_const=16.0)
                        problem = tu.update_policy(cfg, dist, models, tb, agreed_plan(plan, G), norms, {})
                    finally:
                        POLICY_LOSSES["ppo"], objectives.agg_loss = originals
                    assert problem is None, problem
                    after = tm.full_state_dict(models.policy)
                    key = (stage, agg, label, mode)
                    plans[key] = len(plan)
                    if dist.is_main:
                        results[key] = {k: (after[k].float() - before[k].float()) for k in before}
                    del models
    gathered = [None] * dist.world_size
    import torch.distributed as tdist

    tdist.all_gather_object(gathered, plans)
    if dist.is_main:
        torch.save({"deltas": results, "plans": gathered}, out)


if __name__ == "__main__":
    main()
