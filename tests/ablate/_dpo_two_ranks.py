"""Worker for tests/ablate/test_dpo.py: offline DPO of the digit model at world size 2 (torchrun), each rank
with its own share of the problems and so its own number of pairs (one rank may have none).

Usage: torchrun --nproc_per_node 2 _dpo_two_ranks.py MODEL_DIR OUTPUT_DIR
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from _ablate_tasks import digit_problems  # noqa: E402

from mathrl.ablate import Task  # noqa: E402
from mathrl.ablate.methods import run_method  # noqa: E402
from mathrl.config import load_config  # noqa: E402


def main() -> None:
    model_dir, out = sys.argv[1:]
    torch.set_num_threads(1)
    cfg = load_config(None, [f"model.name={model_dir}", "rollout.backend=hf", "rollout.max_tokens=3", "rollout.n=4",
                             "train.batch_size=4", "train.steps=4", "train.lr=1e-2", "algo.kl_coef=0", "algo.dpo_pairs=2",
                             "algo.dpo_beta=0.5", "data.template=chat_boxed", "deepspeed.zero_stage=2",
                             f"train.output_dir={out}", "logging.tensorboard=false", "logging.console=plain",
                             "train.save_every=1", "train.keep_last=3"])
    sys.exit(run_method("dpo", cfg, task=Task(train_problems=digit_problems(32), reward_terms={"first_digit": {}})))


if __name__ == "__main__":
    main()
