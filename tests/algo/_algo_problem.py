"""Shared fixture for the gradient-accumulation invariance tests (imported by the
pytest module and by the gloo worker processes it spawns)."""

from __future__ import annotations

import torch

from mathrl.algo.advantages import broadcast_to_tokens, gae, grpo, token_level_rewards
from mathrl.algo.kl import estimate
from mathrl.algo.logprobs import entropy_from_logits, logprobs_from_logits
from mathrl.algo.losses import agg_loss, policy_loss, value_loss

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
N, T, D, V = 8, 7, 5, 11
LENGTHS = [5, 1, 3, 7, 2, 4, 6, 3]  # very unequal, so a wrong normaliser shows
NORM_CONST = 16.0  # Dr. GRPO's constant (e.g. max response length): fixed for the step


def make_problem(seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny 'model' (linear policy head W and value head w on fixed features) and one
    rollout batch with GRPO and GAE advantages, all in float32."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, T, D, generator=g)
    w_pi = torch.randn(D, V, generator=g) * 0.5
    w_v = torch.randn(D, generator=g) * 0.5
    ids = torch.randint(0, V, (N, T), generator=g)
    mask = torch.zeros(N, T)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    with torch.no_grad():
        logp0 = logprobs_from_logits(h @ w_pi, ids)
        # behaviour policy a little different, so that some ratios leave the clip range
        old_logp = logp0 + 0.5 * torch.randn(N, T, generator=g)
        ref_logp = logp0 + 0.2 * torch.randn(N, T, generator=g)
        old_values = h @ w_v + 0.3 * torch.randn(N, T, generator=g)
        scores = torch.randint(0, 2, (N,), generator=g).float()
        group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        seq_adv = broadcast_to_tokens(grpo(scores, group), mask)
        tok_adv, returns = gae(token_level_rewards(scores, mask), old_values, mask, gamma=1.0, lam=0.95)
        adv = seq_adv + tok_adv  # any fixed advantages will do; mix both kinds
    return dict(h=h, w_pi=w_pi, w_v=w_v, ids=ids, mask=mask, old_logp=old_logp,
                ref_logp=ref_logp, old_values=old_values, adv=adv, returns=returns)


def micro_loss(p: dict[str, torch.Tensor], rows: torch.Tensor, w_pi: torch.Tensor,
               w_v: torch.Tensor, mode: str, norm_tokens, norm_seqs) -> torch.Tensor:
    """Full PPO/GRPO loss (policy + value + KL - entropy) of the micro-batch ``rows``,
    trimmed to its own longest response (dynamic padding, so T differs per micro-batch)."""
    mask = p["mask"][rows]
    t = int(mask.sum(1).max())
    sl = (rows, slice(0, t))
    mask = mask[:, :t]
    h = p["h"][rows, :t]
    logits = h @ w_pi
    logp = logprobs_from_logits(logits, p["ids"][sl], mask=mask)
    kw = dict(agg=mode, norm_tokens=norm_tokens, norm_seqs=norm_seqs, norm_const=NORM_CONST)
    pg, _ = policy_loss(logp, p["old_logp"][rows, :t], p["adv"][rows, :t], mask,
                        clip_low=0.2, clip_high=0.28, dual_clip=1.5, **kw)
    vl, _ = value_loss(h @ w_v, p["old_values"][rows, :t], p["returns"][rows, :t], mask, clip=0.2, **kw)
    kl = agg_loss(estimate(logp, p["ref_logp"][rows, :t], "k3", mask=mask), mask, **kw)
    ent = agg_loss(entropy_from_logits(logits, mask), mask, **kw)
    return pg + 0.5 * vl + 0.1 * kl - 0.01 * ent


def full_batch_grads(p: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
    """Gradient of the whole batch as one micro-batch with its own (= global) counts."""
    w_pi = p["w_pi"].clone().requires_grad_()
    w_v = p["w_v"].clone().requires_grad_()
    loss = micro_loss(p, torch.arange(N), w_pi, w_v, mode, None, None)
    loss.backward()
    return torch.cat([w_pi.grad.flatten(), w_v.grad.flatten()])


def accumulated_grads(p: dict[str, torch.Tensor], mode: str, micro_rows: list[torch.Tensor],
                      norms) -> torch.Tensor:
    """Sum of the micro-batch gradients, each loss normalised by ``norms`` (tokens, seqs)
    or, with ``norms=None``, by its own counts and divided by the number of
    micro-batches (what naive gradient accumulation does)."""
    w_pi = p["w_pi"].clone().requires_grad_()
    w_v = p["w_v"].clone().requires_grad_()
    for rows in micro_rows:
        if norms is None:
            loss = micro_loss(p, rows, w_pi, w_v, mode, None, None) / len(micro_rows)
        else:
            loss = micro_loss(p, rows, w_pi, w_v, mode, norms.tokens, norms.seqs)
        loss.backward()
    return torch.cat([w_pi.grad.flatten(), w_v.grad.flatten()])


def gloo_worker(rank: int, world: int, port: int, out_path: str) -> None:
    """One of ``world`` gloo ranks: takes every world-th row of a shuffled batch, splits
    it into 2 micro-batches, uses the all-reduced global normalisers, sums gradients
    over ranks, and (rank 0) saves them per mode."""
    import os

    import torch.distributed as dist

    from mathrl.algo.losses import global_normalizers
    from mathrl.dist.collectives import global_sum

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        p = make_problem()
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(1))
        mine = perm[rank::world]
        micro = [mine[: len(mine) // 2 + rank], mine[len(mine) // 2 + rank:]]  # unequal sizes
        micro = [m for m in micro if len(m)]
        result = {}
        for mode in MODES:
            norms = global_normalizers([p["mask"][m] for m in micro], reduce=global_sum)
            g = accumulated_grads(p, mode, micro, norms)
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            result[mode] = g
            result[mode + "/norms"] = torch.tensor([norms.tokens, norms.seqs])
        if rank == 0:
            torch.save(result, out_path)
    finally:
        dist.destroy_process_group()


def whiten_worker(rank: int, world: int, port: int, out_path: str) -> None:
    """One of ``world`` gloo ranks whitening its share of a batch (rows with unequal token counts per
    rank) with the trainer's global reduction and without it; rank 0 saves both results and its rows."""
    import os

    import torch.distributed as dist

    from mathrl.algo.advantages import masked_whiten, reinforce_pp
    from mathrl.dist.collectives import all_reduce

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        x, mask = whiten_batch()
        mine = torch.arange(N)[WHITEN_SPLIT[rank]]
        glob = lambda t: all_reduce(t, "sum")  # noqa: E731
        out = {
            "rows": mine,
            "whiten_global": masked_whiten(x[mine], mask[mine], reduce=glob),
            "whiten_local": masked_whiten(x[mine], mask[mine]),
            "rpp_global": reinforce_pp(x[mine], mask[mine], gamma=0.9, reduce=glob),
        }
        gathered = [None] * world
        dist.all_gather_object(gathered, out)
        if rank == 0:
            torch.save(gathered, out_path)
    finally:
        dist.destroy_process_group()


WHITEN_SPLIT = ([0, 1, 2], [3, 4, 5, 6, 7])  # rank 0: 3 rows, rank 1: 5 rows (unequal token counts)


def whiten_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, T, generator=g) * 2 + torch.arange(N)[:, None] * 0.7  # rows with different means
    mask = torch.zeros(N, T, dtype=torch.bool)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = True
    return x, mask
