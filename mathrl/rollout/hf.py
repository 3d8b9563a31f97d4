"""The transformers backend: a small sampling loop over the model's KV cache.

Why not ``model.generate(num_return_sequences=G)``: it repeats every prompt G times *before* the
prefill, so the prompt is encoded G times. Here the B prompts are prefilled once (left-padded),
the KV cache is repeated G times along the batch (``DynamicCache.batch_repeat_interleave``) and
the G samples decode from it. Rows that finish (EOS or a stop string) are dropped from the cache,
so the batch shrinks as responses end. Logprobs are those of the distribution sampled from
(`mathrl.rollout.sampling.sampling_logprobs`), the same convention as the vllm backend.

Host syncs. The decode loop keeps its state on the model's device (the block's tokens and logprobs,
which rows hit EOS) and reads it back once every ``sync_every`` tokens (:data:`SYNC_EVERY`); there
it records the tokens, reports finished rows to ``on_row`` and drops them from the cache. A finished
row so rides along for at most ``sync_every - 1`` more steps (its extra tokens are discarded) and is
reported that many steps late. On a GPU each readback stalls the launch queue (issue 37 measured
770 tokens/s with one per token against 3,173 for ``model.generate``). Stop strings need the
text, so with stop strings the loop syncs after every token.

Reproducibility: one ``torch.Generator`` seeded by ``SamplingConfig.seed`` drives all draws of a
call, so the same prompts, n, config and weights give the same batch on the same machine.
A row's sample depends on the whole call (batch composition, chunking), as in vLLM. Each step the
unfinished rows take the next uniforms of the generator's stream in row order, as a loop that
dropped finished rows at once would draw them: a block's uniforms are drawn at its start and the
generator is re-advanced by the number used at the sync. On CPU (whose generator's stream does not
depend on how it is split into draws) the batch is bitwise that of a per-token loop for any
``sync_every`` (tests/rollout/test_hf_decode.py); on CUDA it is reproducible but not the same stream.
"""

from __future__ import annotations

import contextlib
import inspect
import secrets
import time
from typing import Iterable, Sequence

import torch

from mathrl.rollout.base import OnRow, Prompts, RolloutEngine, check_n
from mathrl.rollout.batch import RolloutBatch, Sample, SamplingConfig, collate
from mathrl.rollout.sampling import sample_tokens, sampling_logprobs
from mathrl.models.precision import without_autocast
from mathrl.models import load_causal_lm, load_tokenizer


#: Default tokens decoded between two host syncs of the decode loop. 8 amortises a GPU readback
#: (and its Python bookkeeping) over 8 decode steps while a finished row rides along for at most 7
#: steps. On CPU (tiny model, 64 rows, 128 tokens, `scripts/bench_gpu.py --device cpu`, a loaded
#: machine) the engine went from 117 to 286 tokens/s against 83 and 113 for ``model.generate``.
SYNC_EVERY = 8


def _eos_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id):
        if src is None:
            continue
        ids.update([src] if isinstance(src, int) else list(src))
    if not ids:
        raise ValueError("the model and tokenizer define no eos_token_id; set one in generation_config.json")
    return sorted(ids)


@contextlib.contextmanager
def _eval_mode(model):
    """Eval mode for generation (dropout off; transformers turns the KV cache off in training mode
    with gradient checkpointing), restoring the caller's mode afterwards (the module may be the
    trainer's own)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the earliest occurrence of any stop string, and whether one occurred."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class HFRolloutEngine(RolloutEngine):
    """Rollout with a transformers causal LM in this process.

    Args:
        model_path: a model spec for `mathrl.models` (``embedded``, a local folder, a hub id).
            Ignored when ``model`` is given.
        model: an already loaded ``PreTrainedModel``. Passing the trainer's own module shares
            it (then `update_weights` has nothing to copy); otherwise the engine owns a copy.
        tokenizer: the tokenizer (loaded from ``model_path`` when omitted).
        dtype: dtype of the engine's model when it loads one (float32 on CPU).
        device: where the engine's model runs.
        max_batch_rows: most rows (prompts x n) decoded at once; larger calls are split by prompt.
        add_special_tokens: passed to the tokenizer for string prompts (False: the chat template
            already holds them).
        sync_every: tokens decoded between two host syncs (default :data:`SYNC_EVERY`); 1 with stop
            strings, which are checked on the host's text after every token.
    """

    def __init__(self, model_path: str | None = None, *, model=None, tokenizer=None,
                 dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
                 max_batch_rows: int = 256, add_special_tokens: bool = False, sync_every: int | None = None) -> None:
        if model is None and model_path is None:
            raise ValueError("HFRolloutEngine needs model_path or model")
        if model is None or tokenizer is None:
            if tokenizer is None:
                tokenizer = load_tokenizer(model_path if model_path is not None else model.name_or_path)
            if model is None:
                model = load_causal_lm(model_path, dtype=dtype).to(device)
        self.model = model  # a shared (trainer's) module keeps its train/eval mode between calls
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_token_ids = _eos_ids(model, tokenizer)
        if not isinstance(max_batch_rows, int) or max_batch_rows < 1:
            raise ValueError(f"max_batch_rows={max_batch_rows!r}: must be an integer >= 1")
        self.max_batch_rows = max_batch_rows
        self.add_special_tokens = add_special_tokens
        if sync_every is None:
            sync_every = SYNC_EVERY
        if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
            raise ValueError(f"sync_every={sync_every!r}: must be an integer >= 1 (tokens between host syncs)")
        self.sync_every = sync_every
        self.host_syncs = 0  # host syncs of the decode loop in the last generate call
        # transformers >= 5.2x names the forward's cache argument `cache` (older: `past_key_values`)
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._closed = False

    # ---- generation -------------------------------------------------------------------------
    def generate(self, prompts: Prompts, n: int, sampling: SamplingConfig,
                 on_row: OnRow | None = None) -> RolloutBatch:
        check_n(n)
        if self._closed:
            raise RuntimeError("HFRolloutEngine.generate called after close()")
        prompt_ids, prompt_text = self.encode_prompts(prompts)
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(62)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        per_chunk = max(1, self.max_batch_rows // n)
        samples: list[list[Sample]] = []
        engine_s = 0.0
        self.host_syncs = 0
        with _eval_mode(self.model), without_autocast(self.model):  # decode in float32 (faster on CPU)
            for start in range(0, len(prompt_ids), per_chunk):
                groups, fwd_s = self._generate_chunk(prompt_ids[start:start + per_chunk], n, sampling, gen,
                                                     on_row, start * n)
                samples.extend(groups)
                engine_s += fwd_s
        # engine_s: the model's own forward passes (a plain KV-cache decode loop over the same rows); the
        # rest of the call is sampling, stop checks and bookkeeping
        return collate(prompt_ids, samples, prompt_text, self.pad_token_id,
                       meta={"backend": "hf", "seed": seed, "engine_s": engine_s})

    @torch.inference_mode()
    def _to_host(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The decode loop's one way back from the device (a host sync on a GPU), counted."""
        self.host_syncs += 1
        return tuple(x.cpu() for x in tensors)

    @torch.inference_mode()  # no autograd graph: without it every decoded token's activations stay alive
    def _generate_chunk(self, prompt_ids: list[list[int]], n: int, sp: SamplingConfig, gen: torch.Generator,
                        on_row: OnRow | None = None, row0: int = 0) -> tuple[list[list[Sample]], float]:
        """The chunk's groups, and the seconds spent in the model's forward passes."""
        from transformers import DynamicCache

        dev = self.device
        b = len(prompt_ids)
        lp = max(len(p) for p in prompt_ids)
        ids = torch.full((b, lp), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((b, lp), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, lp - len(p):] = torch.as_tensor(p)
            attn[i, lp - len(p):] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)

        # prefill: B prompts, once
        cache = DynamicCache(config=self.model.config)
        fwd_s = 0.0

        def forward(**kw):  # the model, timed
            nonlocal fwd_s
            t0 = time.perf_counter()
            out = self.model(use_cache=True, **{self._cache_kw: cache}, **kw)  # the cache is updated in place
            fwd_s += time.perf_counter() - t0
            return out

        out = forward(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=1)
        logits = out.logits[:, -1, :]
        next_pos = pos[:, -1] + 1
        if n > 1:  # expand to G samples after the prefill
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attn = attn.repeat_interleave(n, dim=0)
            next_pos = next_pos.repeat_interleave(n, dim=0)

        rows = b * n
        t_max = sp.max_tokens
        tokens = torch.full((rows, t_max), self.pad_token_id, dtype=torch.long)  # host copies, filled at syncs
        logps = torch.zeros((rows, t_max), dtype=torch.float32)
        lengths = [0] * rows
        finish = ["length"] * rows
        alive = torch.arange(rows)  # original row of each cache row (host)
        eos = torch.as_tensor(self.eos_token_ids, device=dev)
        eos_host = torch.as_tensor(self.eos_token_ids)
        greedy = sp.temperature == 0
        stops = list(sp.stop)
        window = (max(len(s) for s in stops) + 3) if stops else 0
        final_text: list[str | None] = [None] * rows
        # stop strings need the text, so they are checked on the host after every token
        k = 1 if stops else self.sync_every

        def finished(r: int) -> None:  # row r is complete: its text, streamed to on_row
            text = self.tokenizer.decode(tokens[r, :lengths[r]].tolist(), skip_special_tokens=True)
            final_text[r] = cut_at_stop(text, stops)[0] if stops and finish[r] == "stop" else text
            if on_row is not None:
                on_row(row0 + r, final_text[r], finish[r])

        t0 = 0  # first step of the current block of <= k steps (between two host syncs)
        for t in range(t_max):
            j = t - t0
            if j == 0:  # a new block: device buffers for its tokens, and its uniforms drawn at once
                span = min(k, t_max - t)
                n_cur = alive.numel()
                live = torch.ones(n_cur, dtype=torch.bool, device=dev)  # not finished (EOS) yet
                blk_tok = torch.empty((n_cur, span), dtype=torch.long, device=dev)
                blk_lp = torch.empty((n_cur, span), dtype=torch.float32, device=dev)
                if not greedy:
                    rng_state = gen.get_state()
                    u_blk = torch.rand(span * n_cur, generator=gen, dtype=torch.float64, device=dev)
                    used = torch.zeros((), dtype=torch.long, device=dev)
            lprobs = sampling_logprobs(logits, sp.temperature, sp.top_k, sp.top_p)
            if greedy:
                tok = sample_tokens(lprobs, True, None)
            else:
                # the live rows take the block's next uniforms in row order, as if the finished rows had
                # left the batch already (finished rows get some value: their tokens are discarded)
                rank = torch.cumsum(live, 0) - 1
                u = u_blk[(used + rank).clamp(min=0)]
                used = used + live.sum()
                tok = sample_tokens(lprobs, False, None, uniforms=u[:, None])
            blk_tok[:, j] = tok
            blk_lp[:, j] = lprobs.gather(-1, tok[:, None]).squeeze(-1)
            live = live & ~(tok[:, None] == eos).any(-1)
            if j == span - 1:  # sync: the block's tokens to the host, finished rows out
                tok_h, lp_h = self._to_host(blk_tok, blk_lp)
                tokens[alive, t0:t + 1] = tok_h
                logps[alive, t0:t + 1] = lp_h
                hit = torch.isin(tok_h, eos_host)
                done = hit.any(1)
                last_col = torch.where(done, hit.int().argmax(1), span - 1)  # a row's last token in the block
                if stops:  # span == 1: the per-token stop-string check
                    cand = [i for i in range(n_cur) if not done[i]]
                    if cand:
                        lo = max(0, t + 1 - window)
                        texts = self.tokenizer.batch_decode(tokens[alive[cand], lo:t + 1].tolist())
                        for i, txt in zip(cand, texts):
                            if any(s in txt for s in stops):
                                done[i] = True
                ends = (t0 + last_col + 1).tolist()
                for r, end in zip(alive.tolist(), ends):
                    lengths[r] = end
                if not greedy:  # the generator as a per-token loop leaves it: one uniform per live row and step
                    gen.set_state(rng_state)
                    torch.rand(sum(e - t0 for e in ends), generator=gen, dtype=torch.float64, device=dev)
                for _, i in sorted((ends[i], i) for i in torch.nonzero(done).flatten().tolist()):
                    finish[int(alive[i])] = "stop"  # in the order a per-token loop reports them
                    finished(int(alive[i]))
                if t == t_max - 1:
                    break
                keep = ~done
                if not keep.any():
                    break
                if done.any():  # drop finished rows from the cache and the batch
                    keep_idx = torch.nonzero(keep).flatten()
                    keep_dev = keep_idx.to(dev)
                    cache.batch_select_indices(keep_dev)
                    alive = alive[keep_idx]
                    tok = tok[keep_dev]
                    attn = attn[keep_dev]
                    next_pos = next_pos[keep_dev]
                t0 = t + 1
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            out = forward(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None])
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1

        for r in range(rows):  # the rows that ran to the length limit
            if final_text[r] is None:
                finished(r)
        groups: list[list[Sample]] = []
        for i in range(b):
            grp = []
            for j in range(n):
                r = i * n + j
                grp.append(Sample(tokens[r, :lengths[r]].tolist(), logps[r, :lengths[r]].tolist(), finish[r],
                                  final_text[r]))
            groups.append(grp)
        return groups, fwd_s

    # ---- weights ----------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        targets = dict(self.model.state_dict(keep_vars=True))
        count = 0
        for name, tensor in named_tensors:
            dst = targets.get(name)
            if dst is None and name.startswith("module."):  # DDP / DeepSpeed wrapper prefix
                dst = targets.get(name[len("module."):])
            if dst is None:
                raise KeyError(f"update_weights: parameter {name!r} is not in the rollout model "
                               f"({type(self.model).__name__}; e.g. {list(targets)[:3]})")
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                                 f"the rollout model expects {tuple(dst.shape)}")
            if dst.data_ptr() != tensor.data_ptr():  # shared module: nothing to copy
                dst.data.copy_(tensor.detach().to(dst.device, dst.dtype))
            count += 1
        return count

    @torch.inference_mode()
    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[torch.Tensor]:
        if len(prompt_ids) != len(response_ids):
            raise ValueError("score: prompt_ids and response_ids differ in length")
        res = []
        with _eval_mode(self.model):
            for p, r in zip(prompt_ids, response_ids):
                res.append(self._score_one(p, r, temperature))
        return res

    def _score_one(self, p: Sequence[int], r: Sequence[int], temperature: float) -> torch.Tensor:
        seq = torch.as_tensor([list(p) + list(r)], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=seq).logits[0, len(p) - 1:-1].float()
        if temperature > 0:
            logits = logits / temperature
        return torch.log_softmax(logits, -1).gather(-1, seq[0, len(p):, None]).squeeze(-1).cpu()

    def close(self) -> None:
        self._closed = True
