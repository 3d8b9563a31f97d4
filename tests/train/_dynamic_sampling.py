"""Worker for tests/train/test_grpo_family.py: a GRPO run of the digit model with dynamic sampling,
launched by torchrun at world size 2. Every rank appends, per step, the number of sampling rounds it ran
and how many of the groups it trains on have rewards that differ, to ``<output_dir>/ds_rank<r>.jsonl``, and
the informative groups every rank found in each round (as the pooled selection sees them) to
``found_rank<r>.jsonl``, and the right and sampled
responses of each round to ``graded_rank<r>.jsonl``.

Usage: torchrun --nproc_per_node 2 _dynamic_sampling.py MODEL_DIR OUTPUT_DIR [override ...]
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

import mathrl.train.loop as loop  # noqa: E402
from mathrl.algo.filtering import informative_groups  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.testing.digits import FIRST_DIGIT, digit_problems  # noqa: E402
from mathrl.train import run  # noqa: E402


def main() -> None:
    model_dir, out, *extra = sys.argv[1:]
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", 0))
    real = loop.sample_step

    def recording(cfg, dist, tokenizer, rollout, problems, state):
        s = real(cfg, dist, tokenizer, rollout, problems, state)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"ds_rank{rank}.jsonl"), "a") as fh:
            fh.write(json.dumps({"step": state.step + 1, "rows": len(s.correct),
                                 "informative": int(informative_groups(s.scores, cfg.rollout.n).sum()),
                                 **s.stats}) + "\n")
        return s

    loop.sample_step = recording
    import mathrl.train.sampling as sampling

    real_select = sampling.select_pooled

    def select(masks, per_rank):  # how many informative groups each rank found, per round (every rank's view)
        with open(os.path.join(out, f"found_rank{rank}.jsonl"), "a") as fh:
            fh.write(json.dumps([[int(m.sum()) for m in ms] for ms in masks]) + "\n")
        return real_select(masks, per_rank)

    sampling.select_pooled = select  # where the sampler looks it up (mathrl.algo.filtering's is imported there)

    real_sample = sampling.sample_and_grade

    def sample_and_grade(*a, **kw):  # every round's responses: [right, sampled] on this rank
        s = real_sample(*a, **kw)
        with open(os.path.join(out, f"graded_rank{rank}.jsonl"), "a") as fh:
            fh.write(json.dumps([int(sum(map(bool, s.correct))), len(s.correct)]) + "\n")
        return s

    sampling.sample_and_grade = sample_and_grade
    cfg = load_config(None, [f"model.name={model_dir}", "rollout.backend=hf", "rollout.max_tokens=3", "rollout.n=4",
                             "train.batch_size=4", "train.lr=1e-2", "algo.kl_coef=0.04", "data.template=chat_boxed",
                             f"train.output_dir={out}", FIRST_DIGIT, "logging.tensorboard=false", *extra])
    sys.exit(run(cfg, problems=digit_problems(40)))


if __name__ == "__main__":
    main()
