"""Worker for tests/train/test_dist_eval_ckpt.py: a GRPO run of the tiny model on the synthetic task with
held-out evaluation before and after, launched by torchrun at world size 1 or 2. Every SHA-256 a rank
computes on a checkpoint file is appended to ``<output_dir>/hashed_rank<r>.txt``, and the problem ids
of each evaluation a rank generated to ``generated_rank<r>.txt``, and whether the hf engine shares the
trainer's module to ``shares_module_rank<r>.txt``, so the test can see who did what.

Usage: torchrun --nproc_per_node {1,2} _dist_eval.py MODEL_DIR OUTPUT_DIR STEPS [override ...] [method=M]
(``method=online_rft`` and the like: ``mathrl.ablate.methods.run_method`` instead of the trainer's ``run``)
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from mathrl.config import load_config  # noqa: E402
from mathrl.dist import checkpoint_io  # noqa: E402  (where checkpoint files are hashed)
from mathrl.train import run  # noqa: E402


def main() -> None:
    model_dir, out, steps, *extra = sys.argv[1:]
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", 0))
    real = checkpoint_io.sha256_file

    def recording(path, *a, **kw):
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"hashed_rank{rank}.txt"), "a") as fh:
            fh.write(f"{path}\n")
        return real(path, *a, **kw)

    checkpoint_io.sha256_file = recording
    import mathrl.eval.runner as runner

    real_generate = runner.generate_records

    def generate_records(*a, **kw):  # which problems this rank generated in each evaluation
        records = real_generate(*a, **kw)
        with open(os.path.join(out, f"generated_rank{rank}.txt"), "a") as fh:
            fh.write(" ".join(str(r["id"]) for r in records) + "\n")
        return records

    runner.generate_records = generate_records
    import mathrl.train.trainer as trainer_mod

    real_make_rollout = trainer_mod.make_rollout

    def make_rollout(cfg, models):  # whether the hf engine generates with the trainer's own module, and
        engine = real_make_rollout(cfg, models)  # whether its weights are whole in each generate call
        with open(os.path.join(out, f"shares_module_rank{rank}.txt"), "w") as fh:
            fh.write(str(getattr(engine, "model", None) is models.policy.module))
        real_generate_call = engine.generate

        def generate(*a, **kw):
            whole = all(p.numel() > 0 for p in engine.model.parameters())
            with open(os.path.join(out, f"whole_weights_rank{rank}.txt"), "a") as fh:
                fh.write(f"{whole}\n")
            return real_generate_call(*a, **kw)

        engine.generate = generate
        return engine

    trainer_mod.make_rollout = make_rollout  # every method's engine is built by the Trainer
    cfg = load_config(None, [
        f"model.name={model_dir}", "data.source=synthetic", "data.synthetic_level=1", "rollout.backend=hf",
        "rollout.max_tokens=8", "rollout.n=2", "train.batch_size=2", f"train.steps={steps}", "data.eval_limit=7",
        "eval.n=2", "eval.k=1,2", "eval.max_tokens=8", "eval.chunk_rows=4", "train.save_every=1",
        "train.keep_last=5", "train.resume=auto", f"train.output_dir={out}", "logging.tensorboard=false",
        "logging.console=plain", *(x for x in extra if not x.startswith("method="))])
    method = next((x.split("=", 1)[1] for x in extra if x.startswith("method=")), None)
    if method is None:
        sys.exit(run(cfg))
    from mathrl.ablate.methods import run_method

    sys.exit(run_method(method, cfg))


if __name__ == "__main__":
    main()
