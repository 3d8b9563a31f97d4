"""The PRM's training step and scores (mathrl/prm/model.py) on DeepSpeed with a tiny model."""

from __future__ import annotations

import pytest
import torch

from mathrl.algo.process import roc_auc
from mathrl.train.rows import ForwardBatch


def _task(n: int, seed: int, vocab: int):
    """``n`` rows of random prompts and responses of 4..8 tokens, 1..3 steps each (ends at random tokens); a step
    is labelled 1 when the token it ends on is even: the PRM must read the state at the step's last token."""
    g = torch.Generator().manual_seed(seed)
    P, T, S = 3, 8, 3
    pids = torch.randint(5, vocab, (n, P), generator=g)
    pmask = torch.ones(n, P, dtype=torch.long)
    lengths = torch.randint(4, T + 1, (n,), generator=g)
    rids = torch.randint(5, vocab, (n, T), generator=g)
    rmask = (torch.arange(T)[None] < lengths[:, None]).long()
    ends = torch.zeros(n, S, dtype=torch.long)
    smask = torch.zeros(n, S, dtype=torch.bool)
    for i in range(n):
        k = int(torch.randint(1, S + 1, (1,), generator=g))
        pos = sorted(torch.randperm(int(lengths[i]), generator=g)[:k].tolist())
        ends[i, :k] = torch.tensor(pos)
        smask[i, :k] = True
    labels = torch.where(smask, (rids.gather(1, ends) % 2 == 0).float(), torch.zeros(n, S))
    return ForwardBatch(pids, pmask, rids, rmask.bool()), ends, labels, smask


@pytest.mark.slow
def test_prm_learns_to_score_the_state_at_each_steps_end(tiny_model):
    from mathrl.dist.collectives import init_distributed
    from mathrl.dist.engines import build_engine
    from mathrl.models.value_head import ValueModel
    from mathrl.prm.model import prm_train_step
    from mathrl.train.process import prm_scores

    dist = init_distributed()
    torch.manual_seed(0)
    prm = ValueModel.from_causal_lm(tiny_model)
    engine = build_engine(prm, lr=1e-2, weight_decay=0.0, schedule="constant", warmup=0, total_steps=100, stage=1,
                          offload="none", grad_clip=1.0, dtype=torch.float32, world_size=dist.world_size)
    vocab = tiny_model.config.vocab_size
    train, held = _task(64, 0, min(vocab, 200)), _task(64, 1, min(vocab, 200))
    first = prm_train_step(engine, *train, token_budget=10_000, device="cpu")
    assert first["prm/loss"] == pytest.approx(0.6931, abs=1e-3)  # a zero head: every logit 0, BCE = log 2
    # micro-batching does not change the loss (global step normaliser)
    split = prm_train_step(engine, *train, token_budget=12, device="cpu")
    assert split["stepped"] == 1.0 and split["prm/steps"] == first["prm/steps"]
    for _ in range(100):
        last = prm_train_step(engine, *train, token_budget=10_000, device="cpu")
    assert last["prm/loss"] < 0.5 * first["prm/loss"]
    tokens, ends, labels, smask = held
    p = prm_scores(engine.module, tokens, ends, smask, token_budget=10_000, device="cpu")
    auc = roc_auc(p[smask].tolist(), (labels[smask] > 0.5).tolist())
    assert auc > 0.8, auc
    # the negative control: labels of the token *after* the step end cannot be read from the state at the end
    shifted = torch.where(smask, (tokens.response_ids.gather(1, (ends + 1).clamp(max=7)) % 2 == 0).float(), 0.0)
    assert roc_auc(p[smask].tolist(), (shifted[smask] > 0.5).tolist()) < 0.7


def _records(n: int, seed: int, vocab: int) -> list[dict]:
    """``mathrl prm label``-shaped records of :func:`_task` (labels readable from each step's last token); about
    half the steps are right."""
    tokens, ends, labels, smask = _task(n, seed, vocab)
    out = []
    for i in range(n):
        k, q = int(smask[i].sum()), int(tokens.response_mask[i].sum())
        out.append({"prompt_ids": tokens.prompt_ids[i].tolist(), "response_ids": tokens.response_ids[i, :q].tolist(),
                    "ends": ends[i, :k].tolist(), "hard": labels[i, :k].tolist(), "soft": labels[i, :k].tolist()})
    return out


def test_train_prm_warns_when_the_prm_does_not_beat_predicting_the_label_mean(tmp_path, tokenizer, capsys):
    """The study's level-3 PRM (lr 1e-5, 64 optimizer steps) ended with every score near one value and a held-out
    AUC of 0.37, and nothing said so: `train_prm` compares the last epoch's loss with the loss of predicting the
    label mean and warns, naming the settings to raise."""
    from mathrl.algo.process import constant_loss
    from mathrl.dist.collectives import init_distributed
    from mathrl.prm.pipeline import train_prm
    from mathrl.testing.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny", tokenizer)
    records = _records(48, 0, 200)
    for r in records:  # a rarer positive class, as in real labels: keep one right step in three at most
        r["hard"] = r["soft"] = [y if (j % 3 == 0) else 0.0 for j, y in enumerate(r["hard"])]
    base = constant_loss([y for r in records for y in r["soft"]])
    assert 0.3 < base < 0.6
    dist = init_distributed()

    too_small = train_prm(records, str(model), tmp_path / "small", dist=dist, epochs=1, lr=1e-7, batch=16)
    err = capsys.readouterr().err
    assert too_small["prm/constant_loss"] == pytest.approx(base)
    assert too_small["prm/loss"] > base  # a zero head: every step scores 0.5, loss ln 2
    assert "has not learned to tell steps apart (1 epoch(s) of 3 optimizer steps at lr 1e-07)" in err
    assert "raise --lr or --epochs" in err and (tmp_path / "small" / "backbone.safetensors").is_file()

    fitted = train_prm(records, str(model), tmp_path / "fitted", dist=dist, epochs=8, lr=1e-2, batch=16)
    captured = capsys.readouterr()
    assert fitted["prm/loss"] < base and "warning" not in captured.err
    assert f"(predicting the label mean at every step: {base:.4f})" in captured.out
