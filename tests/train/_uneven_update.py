"""Worker for tests/train/test_uneven_ranks.py: one step of the product's own
:class:`~mathrl.train.trainer.Trainer` with the RL step (:class:`~mathrl.train.loop.RLMethod`) on the real
SmolLM2-135M-Instruct, under ZeRO-2 or ZeRO-3, where the ranks get different numbers of micro-batches.

The trainer sets up (run folder, models, memory fit, first weight sync) and runs its step whole: the step's
problems drawn from the stream (this rank's share), sampling through a rollout engine, grading with the real
verifier, old/reference forwards, advantages, the global normalisers, the agreed micro-batch count, the
world-size scaling and the update. Nothing of it is re-implemented here.

For the one-process run and the two-rank run to see the same responses, the responses are sampled once,
before the step, by the real hf engine (temperature 1, up to 64 tokens) and the step's engine replays them:
:class:`ReplayEngine` answers ``generate`` with the recorded rows of the prompts asked for and passes weight
pushes and scoring to the real engine. Every process samples the same recording (same seed, same weights).

The stream order gives rank 0 the two groups that cost most (prompt + responses) and rank 1 the two that
cost least, and ``train.micro_batch_tokens`` is the smallest budget at which the product's planner gives
rank 0 more micro-batches than rank 1. Rank 0 saves the parameter change and each rank's counts.

One ZeRO stage per process (two SmolLM2 engines plus their reference models in one process would
need ~10 GB). The trainer's rollout engine is the replay (``mathrl.train.trainer.make_rollout`` replaced in
this process). Usage: torchrun --nproc_per_node {1,2} _uneven_update.py MODEL_DIR OUT.pt STAGE
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402

import mathrl.train.models as tm  # noqa: E402
import mathrl.train.trainer as trainer_mod  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.data import load_problems, render_prompt  # noqa: E402
from mathrl.models import load_tokenizer  # noqa: E402
from mathrl.rollout import SamplingConfig, make_engine  # noqa: E402
from mathrl.testing.replay import ReplayEngine  # noqa: E402
from mathrl.dist.collectives import init_distributed  # noqa: E402
from mathrl.train.forward import plan_micro_batches  # noqa: E402
from mathrl.train.loop import RLMethod  # noqa: E402

G, B, CANDIDATES, MAX_TOKENS = 2, 4, 8, 64


def rows_of(groups) -> torch.Tensor:
    g = torch.as_tensor(groups)
    return (g[:, None] * G + torch.arange(G)[None, :]).flatten()


def main() -> None:
    model_dir, out, stage = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist = init_distributed()
    # one thread per rank on the 2-core machine; the one-process reference takes both (same recording: the
    # engine's uniforms are seeded; its sums round in another order: tests/train/test_uneven_ranks.py, REL_TOL)
    torch.set_num_threads(2 if dist.world_size == 1 else 1)
    overrides = [
        f"model.name={model_dir}", f"rollout.n={G}", f"train.batch_size={B}", "train.lr=2e-2",
        "train.max_grad_norm=0", "algo.kl_coef=0.04", "algo.entropy_coef=0.01", "algo.ppo_epochs=1",
        "data.template=chat_boxed_oneshot", "data.shuffle=false", f"deepspeed.zero_stage={stage}",
        "reward.function=correctness_format", "reward.format_bonus=0.2", "rollout.backend=hf",
        "rollout.temperature=1.0", f"rollout.max_tokens={MAX_TOKENS}"]
    cfg = load_config(None, overrides)

    # the recording: CANDIDATES problems, G real samples each
    tokenizer = load_tokenizer(model_dir)
    candidates = load_problems("synthetic", None, "train", n=CANDIDATES, level=3, seed=5)
    texts = [render_prompt(p, tokenizer, cfg.data.template) for p in candidates]
    real = make_engine("hf", model_dir, tokenizer=tokenizer)  # its own copy of the initial weights
    recorded = real.generate(texts, G, SamplingConfig(temperature=1.0, max_tokens=MAX_TOKENS, seed=11))
    mask = recorded.response_mask.bool()

    # the stream: the two costliest groups first (rank 0's share), then the two cheapest (rank 1's)
    def cost(groups, budget=10**9) -> int:  # micro-batches of the product's planner at ``budget``
        return len(plan_micro_batches(recorded.prompt_mask, mask, budget, rows_of(groups), group_size=G))

    def tokens(g) -> int:
        r = rows_of([g])
        return int(recorded.prompt_mask[r].sum(1).max()) + G * int(mask[r].sum(1).max())

    order = sorted(range(CANDIDATES), key=tokens, reverse=True)
    shares = [order[:2], order[-2:]]
    budget = next(b for b in range(tokens(order[0]), 100_000, 8)
                  if cost(shares[0], b) > cost(shares[1], b))
    problems = [candidates[g] for g in shares[0] + shares[1]]
    mine = shares[0] + shares[1] if dist.world_size == 1 else shares[dist.rank]
    counts = [cost(mine, budget)]

    run_dir = os.path.join(os.path.dirname(os.path.abspath(out)), f"run_{os.path.basename(out)}")
    cfg = load_config(None, overrides + [f"train.micro_batch_tokens={budget}", f"train.output_dir={run_dir}",
                                         "train.steps=1", "train.save_every_minutes=0", "logging.tensorboard=false",
                                         "logging.console=plain"])
    trainer_mod.make_rollout = lambda cfg, models: ReplayEngine(recorded, texts, real.tokenizer, real=real)
    trainer = trainer_mod.Trainer(cfg, RLMethod(), problems=problems)
    trainer.setup()
    assert cfg.train.micro_batch_tokens == budget, "the memory fit changed the budget: the counts would differ"
    models = trainer.models
    for group in models.policy.optimizer.param_groups:
        group["eps"] = 1.0  # Adam's step ~ lr * g: the change compares gradients, not their signs
    before = tm.full_state_dict(models.policy)
    before = {k: v.clone() for k, v in before.items()} if dist.is_main else None
    metrics = trainer.step()
    assert metrics.get("bad_step", 0) == 0, metrics
    after = tm.full_state_dict(models.policy)
    deltas = {k: after[k].float() - before[k].float() for k in before} if dist.is_main else None
    gathered = [None] * dist.world_size
    tdist.all_gather_object(gathered, {stage: counts})
    if dist.is_main:
        lengths = [int(mask[rows_of([g])].sum(1)[j]) for g in shares[0] + shares[1] for j in range(G)]
        torch.save({"deltas": {stage: deltas}, "micro_batches": gathered, "lengths": lengths,
                    "budget": budget, "metrics": metrics}, out)
    trainer.close()


if __name__ == "__main__":
    main()
