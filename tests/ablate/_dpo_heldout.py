"""Worker for tests/ablate/test_dpo.py: offline DPO of SmolLM2-135M-Instruct on the synthetic task (the real
verifier), then the implicit reward margin of held-out pairs before and after.

The held-out pairs are built by the product's own code (:meth:`mathrl.ablate.methods.DPOMethod.sample`, the
offline method's sampler: the initial model's samples of each problem, graded, paired, with the initial model's
reference logprobs) on the held-out problems (another synthetic draw: :func:`mathrl.data.splits.heldout_problems`).
Prints ``heldout_pairs=``, ``heldout_chosen_right=`` (the fraction of pairs whose chosen response the verifier
graded right and whose rejected one it graded wrong), ``heldout_margin=`` (the mean of beta * [(log pi - log pi_ref)(chosen) - (...)(rejected)]
under the trained policy; 0 before training, when the policy is the reference) and ``heldout_ordered=`` (the
fraction of pairs whose margin is > 0).

Usage: python _dpo_heldout.py MODEL_DIR OUTPUT_DIR
"""

import os
import sys
from types import SimpleNamespace

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from mathrl.ablate.methods import DPOMethod, run_method  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.data.splits import heldout_problems  # noqa: E402
from mathrl.dist.collectives import init_distributed  # noqa: E402
from mathrl.train import dpo  # noqa: E402
from mathrl.train.models import build_models, make_rollout  # noqa: E402

STEPS, HELDOUT_STEPS = 4, 2


def main() -> None:
    model_dir, out = sys.argv[1:]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = [f"model.name={model_dir}", "rollout.backend=hf", "rollout.n=8", "rollout.max_tokens=40",
            "train.batch_size=8", f"train.steps={STEPS}", "train.lr=1e-5", "train.micro_batch_tokens=4096", "algo.kl_coef=0", "algo.dpo_beta=0.1",
            "algo.dpo_pairs=2", "data.synthetic_size=256", "reward.function=correctness", "reward.format_bonus=0",
            "logging.tensorboard=false", "logging.console=plain", "train.save_every=0", "train.keep_last=1",
            "eval.max_tokens=4"]
    cfg = load_config("configs/demo.yaml", [*args, f"train.output_dir={out}/run"])
    assert run_method("dpo", cfg) == 0
    final = sorted((p for p in (os.path.join(out, "run", "checkpoints", d) for d in
                                os.listdir(os.path.join(out, "run", "checkpoints"))) if os.path.isdir(p)))[-1]

    # held-out pairs of the initial model, by the offline method's own sampler
    hcfg = load_config("configs/demo.yaml", [*args, f"train.output_dir={out}/heldout"])
    _, problems = heldout_problems(hcfg)
    dist = init_distributed()
    models = build_models(hcfg, dist, 1, reference=False)
    rollout = make_rollout(hcfg, models)
    trainer = SimpleNamespace(cfg=hcfg, dist=dist, models=models, rollout=rollout, problems=problems)
    pairs = [DPOMethod(online=False).sample(trainer, s)[0] for s in range(HELDOUT_STEPS)]
    close = getattr(rollout, "close", None)
    if close is not None:
        close()
    del models, rollout, trainer

    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(os.path.join(final, "policy"), dtype=torch.float32)
    margins, lengths, ordered_by_verifier = [], set(), []
    for data in pairs:
        if data["response_ids"].shape[0] == 0:
            continue
        ordered_by_verifier += (data["correct"][0::2] & ~data["correct"][1::2]).tolist()
        seq = dpo.reference_logprobs(policy, dpo.as_forward_batch(data), token_budget=8192, device="cpu")
        r = cfg.algo.dpo_beta * (seq - data["ref_logps"])
        margins.append(r[0::2] - r[1::2])
        lengths |= set(data["response_mask"].sum(1).tolist())
    m = torch.cat(margins) if margins else torch.zeros(0)
    print(f"heldout_pairs={m.numel()}")
    print(f"heldout_lengths={len(lengths)}")
    print(f"heldout_chosen_right={sum(ordered_by_verifier) / max(1, len(ordered_by_verifier))}")
    print(f"heldout_margin={float(m.mean()) if m.numel() else float('nan')}")
    print(f"heldout_ordered={float((m > 0).float().mean()) if m.numel() else float('nan')}")


if __name__ == "__main__":
    main()
