"""Driver for tests/rollout/test_vllm_colocated.py, run by the vLLM environment's python (directly, or
under torchrun for two ranks): ``mathrl train`` itself (``mathrl.cli.main``), with vLLM built in this
process (``rollout.vllm_python=inprocess``).

Two additions, neither changing what the trainer does: ``mathrl.testing.digits`` is imported so that
the ``first_digit`` reward (the digit task a tiny model learns in three steps) is registered, and the
engine the trainer builds (``mathrl.train.trainer.make_rollout``) is recorded, so that the test can see what
ran: after the run each rank writes ``<output_dir>/engine_rank<r>.json`` with the engine's mode and
info, the ``vllm.LLM`` arguments `mathrl.rollout.vllm_core.build_llm_kwargs` gave, the weight-loading
path vLLM took, and the process id (an in-process engine lives in the trainer's process).

Usage: python _colocated_train.py OUTPUT_DIR key=value ...
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import mathrl.testing.digits  # noqa: E402,F401  (registers the first_digit reward)
import mathrl.train.trainer as trainer_mod  # noqa: E402
from mathrl.cli import main as mathrl_main  # noqa: E402

built = []


def main() -> int:
    out, *overrides = sys.argv[1:]
    real = trainer_mod.make_rollout

    def make_rollout(cfg, models):
        engine = real(cfg, models)
        built.append(engine)
        return engine

    trainer_mod.make_rollout = make_rollout
    rc = mathrl_main(["train", f"train.output_dir={out}", *overrides])
    rank = int(os.environ.get("RANK", 0))
    for engine in built:
        core = getattr(engine, "_core", None)
        record = {"pid": os.getpid(), "mode": getattr(engine, "mode", None), "info": getattr(engine, "info", None),
                  "llm_kwargs": getattr(core, "llm_kwargs", None), "weight_loader": getattr(core, "weight_loader", None),
                  "engine_class": f"{type(core).__module__}.{type(core).__name__}"}
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"engine_rank{rank}.json"), "w") as fh:
            json.dump(record, fh, default=str)
    return rc


if __name__ == "__main__":
    sys.exit(main())
