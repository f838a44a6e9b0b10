"""Batched sampling with a static KV cache, and full-forward scoring, for the tiny Qwen3.

On a sub-million-parameter model framework overhead, not FLOPs, dominates decoding, so
:class:`Sampler` does not go through ``transformers.generate``. It runs a second, functional
Qwen3 forward whose leaves — embedding, norms, linears, activation, rotary tables — are the
model's own modules, so whatever precision the model was given (FP32, BF16 emulation and
its rounding hooks, the FP8 W8A8 rollout linears of :func:`fp8rl.numerics.make_rollout_model`)
applies unchanged; only leaves whose forward is known run as equivalent plain ops (fused
GEMMs for q/k/v and gate/up, see :func:`_linears_fn`). The glue is the composites: RoPE,
attention over a preallocated KV cache, the MLP product, residual sums. Where an emulated
model's hooks would BF16-round (FP16-round, in an FP16 model) a composite's output
(attention block, MLP, decoder layer), the glue rounds at the same points. See docs/tiny_backend.md.

Layout: prompts are left-padded to the longest prompt ``P``; KV-cache slot ``s`` of row
``b`` holds position ``s - (P - len_b)``, so every row sees exactly the positions it would
see alone. One prefill forward over the prompts, then one decode forward per token (query
heads grouped by KV head, so grouped-query attention needs no repeated keys). Rows that hit
EOS are dropped from the batch once they are half of it.

Log-probs are FP32 ``log_softmax(logits / temperature)`` of the sampled token — the
temperature-scaled *full* distribution, not the top-k/top-p renormalised one, which is what
the trainer recomputes (verl's ``logprobs_from_logits(logits / temperature)``) and what TIS
compares. :func:`score` computes the same quantity with one ordinary ``transformers``
forward; the tests hold the two equal. With FP8 *per-tensor* dynamic activation scales
(vLLM's default for online FP8) a decode step and a full forward legitimately differ: the
scale depends on which tokens share the call, exactly as in vLLM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import SiLUActivation
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from fp8rl.numerics.bf16 import emulated_half, round_half
from fp8rl.numerics.linears import Bf16Linear, native_bf16_linear
from fp8rl.numerics.rollout import Fp8RolloutLinear

__all__ = ["SampleBatch", "Sampler", "response_inputs", "response_log_probs", "score"]

log = logging.getLogger(__name__)


@dataclass
class SampleBatch:
    """What :meth:`Sampler.generate` returns; ``T`` is the longest response's length."""

    prompt_lens: torch.Tensor  # (B,) int64
    tokens: torch.Tensor  # (B, T) int64 response token ids, pad_id after the end
    logprobs: torch.Tensor  # (B, T) float32, log p(token) after temperature, 0 on pad
    mask: torch.Tensor  # (B, T) bool, True on response tokens (incl. the EOS token)
    finished: torch.Tensor  # (B,) bool, stopped on EOS (False: truncated at max_new_tokens)

    @property
    def response_lens(self) -> torch.Tensor:
        return self.mask.sum(1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    # = x * cos + rotate_half(x) * sin (transformers), bit for bit: swapping the halves gives
    # cat(x2, x1) in one kernel, sin_signed = cat(-sin1, sin2), and (-a) * b == a * (-b)
    swapped = x.unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)
    return x * cos + swapped * sin_signed


Heads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _has_hooks(mod: nn.Module) -> bool:
    return bool(mod._forward_hooks or mod._forward_pre_hooks)


def _global_hooks() -> bool:
    from torch.nn.modules import module as m

    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def _exactly(mod: nn.Module, *classes: type) -> bool:
    """``mod`` is exactly one of ``classes`` with no hooks: its forward is known."""
    return type(mod) in classes and not _has_hooks(mod)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Qwen3RMSNorm's arithmetic, bit for bit, in fewer kernels (FP32 in and out): mean(-1)
    # is sum(-1) / n on CPU, without mean's dtype round trip
    var = x.pow(2).sum(-1, keepdim=True).div_(x.shape[-1])
    return weight * (x * var.add_(eps).rsqrt_())


Fn = Callable[[torch.Tensor], torch.Tensor]


def _norm_fn(norm: nn.Module, fast: bool) -> Fn:
    if fast and _exactly(norm, Qwen3RMSNorm):
        weight, eps = norm.weight, norm.variance_epsilon
        return lambda x: _rms_norm(x, weight, eps)
    return norm


def _act_fn(act: nn.Module, fast: bool) -> Fn:
    return F.silu if fast and _exactly(act, SiLUActivation, nn.SiLU) else act


def _linears_fn(lins: list[nn.Module], fast: bool) -> Fn:
    """Linears reading the same input (q/k/v, gate/up) as one map to their concatenated
    outputs: one GEMM over the concatenated weights where their forward is known and fusing
    changes no value — stock FP32; the numerics layer's BF16 (or FP16) linears (weights rounded once
    here instead of at every call; native ones: one native BF16 GEMM over the BF16 weights,
    the same dot products as each layer's own GEMM); its FP8 rollout linears
    with one config (the input is quantised once, exactly as each layer would) — else a
    call of each module."""
    known = fast and all(m.bias is None for m in lins)
    if known and all(_exactly(m, nn.Linear) for m in lins):
        weight = torch.cat([m.weight for m in lins])
        return lambda x: F.linear(x, weight)
    half = getattr(lins[0], "half_format", None)  # fused only within one half format
    known = known and all(getattr(m, "half_format", None) == half for m in lins)
    if known and all(
        _exactly(m, Bf16Linear) or (_exactly(m, Fp8RolloutLinear) and m.high_precision)
        for m in lins
    ):
        native = [m.native_bf16 and half == "bf16" for m in lins]  # FP16 GEMMs: emulated
        if all(native):
            weight = torch.cat([m.weight for m in lins]).to(torch.bfloat16)
            return lambda x: native_bf16_linear(x, weight, None)
        if not any(native):
            weight = torch.cat([round_half(m.weight, half) for m in lins])
            return lambda x: round_half(F.linear(round_half(x, half), weight), half)
    if (
        known
        and all(_exactly(m, Fp8RolloutLinear) and not m.high_precision for m in lins)
        and all(m.cfg == lins[0].cfg for m in lins)
    ):
        # Fp8RolloutLinear.fp8_forward on the concatenated (already FP8-valued) weights,
        # the shared input quantised once with the layers' own rule
        weight, quantize = torch.cat([m.weight for m in lins]), lins[0].quantize_input
        return lambda x: round_half(F.linear(quantize(x), weight), half)
    return lambda x: torch.cat([m(x) for m in lins], -1)


def _linear_fn(lin: nn.Module, fast: bool) -> Fn:
    if fast and _exactly(lin, nn.Linear):
        weight, bias = lin.weight, lin.bias
        return lambda x: F.linear(x, weight, bias)
    return lin


@dataclass
class _LayerPlan:
    """One decoder layer as callables: the model's modules or known-equivalent fast ops."""

    attn_norm: Fn
    qkv: Fn  # x -> [q | k | v]
    q_norm: Fn  # over (N, H, D); or over the joint (N, H + KVH, D) q|k tensor
    k_norm: Fn | None  # None: q_norm normalises q and k together
    o_proj: Fn
    scaling: float
    mlp_norm: Fn
    gate_up: Fn  # x -> [gate | up]
    act: Fn
    down: Fn


def _layer_plan(layer: nn.Module, heads: int, kv_heads: int, fast: bool) -> _LayerPlan:
    a, mlp = layer.self_attn, layer.mlp
    q_norm, k_norm = _norm_fn(a.q_norm, fast), _norm_fn(a.k_norm, fast)
    if (
        fast
        and _exactly(a.q_norm, Qwen3RMSNorm)
        and _exactly(a.k_norm, Qwen3RMSNorm)
        and a.q_norm.variance_epsilon == a.k_norm.variance_epsilon
    ):  # per-head weights stacked: q and k normalised in one pass, same arithmetic
        D, eps = a.q_norm.weight.shape[0], a.q_norm.variance_epsilon
        w = torch.cat([a.q_norm.weight.expand(heads, D), a.k_norm.weight.expand(kv_heads, D)])
        q_norm, k_norm = (lambda qk: _rms_norm(qk, w, eps)), None
    return _LayerPlan(
        attn_norm=_norm_fn(layer.input_layernorm, fast),
        qkv=_linears_fn([a.q_proj, a.k_proj, a.v_proj], fast),
        q_norm=q_norm,
        k_norm=k_norm,
        o_proj=_linear_fn(a.o_proj, fast),
        scaling=float(a.scaling),
        mlp_norm=_norm_fn(layer.post_attention_layernorm, fast),
        gate_up=_linears_fn([mlp.gate_proj, mlp.up_proj], fast),
        act=_act_fn(mlp.act_fn, fast),
        down=_linear_fn(mlp.down_proj, fast),
    )


class _Qwen3Glue:
    """A functional Qwen3 forward over a static KV cache, built from a model's own modules.

    Leaves — embedding, norms, linears, the activation, the rotary tables — are the model's
    modules, called as they are, unless their forward is known and can run as plain ops with
    the same values (stock FP32 modules without hooks; groups of linears sharing an input,
    fused into one GEMM, see :func:`_linears_fn`). Composites — attention, MLP, decoder
    layer — are this glue, which rounds their outputs to BF16 where an emulated model's
    hooks would (the composites' own hooks do not run). Built at each ``generate`` call,
    so it sees current weights. Hidden states are 2-D (tokens, hidden) throughout.
    """

    def __init__(self, model: nn.Module, inner: nn.Module):
        cfg = model.config
        self.num_heads = H = int(cfg.num_attention_heads)
        self.num_kv_heads = KVH = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // H)
        half = emulated_half(model)
        self.round = None if half is None else (lambda x: round_half(x, half))
        fast = not _global_hooks()
        self.embed = inner.embed_tokens
        self.final_norm = _norm_fn(inner.norm, fast)
        self.lm_head = _linear_fn(model.lm_head, fast)
        self.layers = [_layer_plan(layer, H, KVH, fast) for layer in inner.layers]

    def _heads(self, L: _LayerPlan, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Heads:
        """Projections, q/k norms and RoPE: q (N, H, D), k and v (N, KVH, D)."""
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = L.qkv(x)
        v = qkv[:, (H + KVH) * D :].view(-1, KVH, D)
        if L.k_norm is None:  # q and k normalised and rotated as one tensor
            qk = _rope(L.q_norm(qkv[:, : (H + KVH) * D].view(-1, H + KVH, D)), cos, sin)
            return qk[:, :H], qk[:, H:], v
        q = L.q_norm(qkv[:, : H * D].view(-1, H, D))
        k = L.k_norm(qkv[:, H * D : (H + KVH) * D].view(-1, KVH, D))
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _mlp(self, L: _LayerPlan, x: torch.Tensor) -> torch.Tensor:
        gate, up = L.gate_up(x).chunk(2, -1)
        return self._round(L.down(L.act(gate) * up))

    def prefill(
        self,
        ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        kv: list[torch.Tensor],
    ) -> torch.Tensor:
        """Run left-padded prompts ``ids`` (B, P) through the model, filling KV-cache slots
        [0, P). ``cos``/``sin`` (B * P, 1, D), ``mask`` (B, 1, P, P) bool. Returns the last
        position's logits (B, V)."""
        B, P = ids.shape
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        h = self.embed(ids.view(-1))
        for i, L in enumerate(self.layers):
            q, k, v = self._heads(L, L.attn_norm(h), cos, sin)
            q, k, v = (t.view(B, P, -1, D).transpose(1, 2) for t in (q, k, v))
            kv[2 * i][:, :, :P] = k
            kv[2 * i + 1][:, :, :P] = v
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=L.scaling, enable_gqa=H != KVH
            )
            h = h + self._round(L.o_proj(o.transpose(1, 2).reshape(B * P, H * D)))
            h = self._round(h + self._mlp(L, L.mlp_norm(h)))
        return self.lm_head(self.final_norm(h.view(B, P, -1)[:, -1]))

    def decode(
        self,
        tok: torch.Tensor,
        s: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        add_mask: torch.Tensor,
        kv: list[torch.Tensor],
    ) -> torch.Tensor:
        """One token per row: ``tok`` (b,) goes into KV-cache slot ``s`` and attends to slots
        [0, s]. ``cos``/``sin`` (b, 1, D); ``add_mask`` (b * KVH, 1, s + 1) is 0 / -inf.
        Returns the logits (b, V)."""
        b = tok.shape[0]
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        h = self.embed(tok)
        for i, L in enumerate(self.layers):
            q, k, v = self._heads(L, L.attn_norm(h), cos, sin)
            k_cache, v_cache = kv[2 * i], kv[2 * i + 1]  # (b, KVH, slots, D)
            k_cache[:, :, s] = k
            v_cache[:, :, s] = v
            # query heads grouped by their KV head: (b * KVH, H / KVH, D), one small GEMM per
            # row and KV head, no repeated keys
            q = q.reshape(b * KVH, H // KVH, D)
            keys = k_cache.view(b * KVH, -1, D)[:, : s + 1]
            scores = torch.baddbmm(add_mask, q, keys.mT, alpha=L.scaling)
            o = torch.bmm(scores.softmax(-1), v_cache.view(b * KVH, -1, D)[:, : s + 1])
            h = h + self._round(L.o_proj(o.view(b, H * D)))
            h = self._round(h + self._mlp(L, L.mlp_norm(h)))
        return self.lm_head(self.final_norm(h))

    def _round(self, x: torch.Tensor) -> torch.Tensor:
        # where a transformers module boundary rounds to BF16 in an emulated model: the
        # decoder layer's output, and the attention block's (a no-op after an o_proj that
        # rounds its output, as the numerics layer's linears do; kept for any that do not)
        return x if self.round is None else self.round(x)


def _qwen3_parts(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        raise TypeError(
            f"Sampler needs a Qwen3ForCausalLM-shaped model (model.embed_tokens/layers/norm/"
            f"rotary_emb, lm_head); got {type(model).__name__}"
        )
    return inner


def _check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[int]:
    if len(prompts) == 0:
        raise ValueError("prompts is empty")
    lens = []
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        lo, hi = min(p), max(p)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}): {lo}..{hi}")
        lens.append(len(p))
    return lens


def _left_pad(prompts: Sequence[Sequence[int]], lens: list[int], pad_id: int) -> torch.Tensor:
    ids = torch.full((len(prompts), max(lens)), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, ids.shape[1] - lens[i] :] = torch.as_tensor(p, dtype=torch.long)
    return ids


class Sampler:
    """Batched generation for a ``Qwen3ForCausalLM`` in whatever precision it carries.

    The model is read at every :meth:`generate` call (no weight copies), so a rollout copy
    refreshed in place by :func:`fp8rl.numerics.sync_rollout_weights` is sampled with its
    new weights. ``eos_id=None`` never stops early (benchmarks). The KV cache is kept
    between calls and grown when a call needs more.
    """

    def __init__(self, model: nn.Module, *, eos_id: int | None, pad_id: int, max_seq_len: int):
        self.model = model
        self._inner = _qwen3_parts(model)
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        for name, tid in (("eos_id", eos_id), ("pad_id", pad_id)):
            if tid is not None and not 0 <= tid < self.vocab_size:
                raise ValueError(f"{name}={tid} is outside the vocabulary [0, {self.vocab_size})")
        if max_seq_len <= 1:
            raise ValueError(f"max_seq_len must be at least 2, got {max_seq_len}")
        if max_seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.max_seq_len = max_seq_len
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads)
        self._kv_storage: list[torch.Tensor] = []

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        greedy: bool = False,
        seed: int = 0,
    ) -> SampleBatch:
        """Sample up to ``max_new_tokens`` tokens after each prompt (token-id lists).

        ``greedy`` takes the argmax (``top_k``/``top_p`` ignored); otherwise sampling from
        ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens
        (0: all) and then to the smallest set with probability >= ``top_p`` (transformers'
        order and tie rules). Log-probs are always those of the temperature-scaled full
        distribution (see the module docstring). Deterministic for ``seed``.
        """
        lens = _check_prompts(prompts, self.vocab_size)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if max(lens) + max_new_tokens > self.max_seq_len:
            raise ValueError(
                f"longest prompt ({max(lens)} tokens) + max_new_tokens ({max_new_tokens}) "
                f"exceeds max_seq_len={self.max_seq_len}"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no top-k), got {top_k}")
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self._generate(
                _left_pad(prompts, lens, self.pad_id),
                torch.tensor(lens),
                max_new_tokens,
                float(temperature),
                float(top_p),
                min(int(top_k), self.vocab_size),
                greedy,
                seed,
            )
        # clone outside inference mode: callers may modify the results in place
        out = SampleBatch(*(t.clone() for t in out))
        n = int(out.mask.sum())
        dt = time.perf_counter() - t0
        log.debug("sampled %d tokens in %d rows in %.3fs (%.0f tok/s)", n, len(lens), dt, n / dt)
        return out

    # ------------------------------------------------------------------ internals
    def _kv_cache(self, batch: int, slots: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Per layer a K and a V buffer of shape (batch, kv_heads, slots, head_dim), reusing
        the previous call's memory when it is large enough."""
        shape = (batch, self.num_kv_heads, slots, self.head_dim)
        numel = batch * self.num_kv_heads * slots * self.head_dim
        n = 2 * len(self._inner.layers)
        st = self._kv_storage
        if len(st) != n or st[0].numel() < numel or st[0].dtype != dtype:
            self._kv_storage = st = [torch.empty(numel, dtype=dtype) for _ in range(n)]
        return [t[:numel].view(shape) for t in st]

    def _generate(
        self,
        ids: torch.Tensor,
        lens: torch.Tensor,
        max_new: int,
        temperature: float,
        top_p: float,
        top_k: int,
        greedy: bool,
        seed: int,
    ) -> tuple[torch.Tensor, ...]:
        inner = self._inner
        glue = _Qwen3Glue(self.model, inner)
        B, P = ids.shape
        S = P + max_new  # KV-cache slots
        D = self.head_dim
        dtype = inner.embed_tokens.weight.dtype
        kv = self._kv_cache(B, S, dtype)

        # slot s of row b holds position s - (P - len_b); left-pad slots are masked out
        offset = (P - lens)[:, None]
        slots = torch.arange(S)[None, :]
        key_valid = slots >= offset  # (B, S)
        slot_pos = (slots - offset).clamp_(min=0)
        # rotary tables from the model's own rotary module (BF16-rounded by its hook when
        # emulated), rotate_half's sign folded into sin, gathered per row and slot
        cos_t, sin_t = inner.rotary_emb(inner.embed_tokens.weight[:1], slots)
        sin_t = torch.cat([-sin_t[..., : D // 2], sin_t[..., D // 2 :]], -1)
        cos_rows, sin_rows = cos_t[0][slot_pos], sin_t[0][slot_pos]  # (B, S, D)

        # prefill: causal + key-padding mask; a pad query sees itself (no all-masked row)
        mask = torch.ones(P, P, dtype=torch.bool).tril_()[None] & key_valid[:, None, :P]
        mask |= torch.eye(P, dtype=torch.bool)
        cos, sin = (r[:, :P].reshape(B * P, 1, D) for r in (cos_rows, sin_rows))
        logits = glue.prefill(ids, cos, sin, mask[:, None], kv)
        KVH = glue.num_kv_heads
        add_mask = torch.zeros(B, KVH, 1, S, dtype=dtype).masked_fill_(
            ~key_valid[:, None, None], -torch.inf
        )

        gen = None if greedy else torch.Generator().manual_seed(seed)
        out_tok = torch.full((max_new, B), self.pad_id, dtype=torch.long)
        out_lp = torch.zeros(max_new, B)
        rows = torch.arange(B)  # original row of each row still in the batch
        done = torch.zeros(B, dtype=torch.bool)  # rows that ended but are still in the batch
        ended_at = torch.full((B,), max_new + 1)  # response length of rows that hit EOS
        compacted = False
        steps = 0
        for t in range(max_new):
            tok, lp = _sample(logits, temperature, top_p, top_k, greedy, gen)
            hit = None if self.eos_id is None else (tok == self.eos_id) & ~done
            if done.any():
                tok = tok.masked_fill(done, self.pad_id)
                lp = lp.masked_fill(done, 0.0)
            if compacted:
                out_tok[t].index_copy_(0, rows, tok)
                out_lp[t].index_copy_(0, rows, lp)
            else:
                out_tok[t] = tok
                out_lp[t] = lp
            steps = t + 1
            if hit is not None and hit.any():
                done |= hit
                ended_at[rows[hit]] = t + 1
                n_live = int((~done).sum())
                if n_live == 0:
                    break
                if n_live <= done.numel() // 2:  # drop the ended rows from the batch
                    live = (~done).nonzero().squeeze(1)
                    rows, tok, done = rows[live], tok[live], done[live]
                    kv = [c[live] for c in kv]
                    add_mask, cos_rows, sin_rows = (r[live] for r in (add_mask, cos_rows, sin_rows))
                    compacted = True
            if t == max_new - 1:
                break
            s = P + t  # the token just sampled goes into slot s
            b = tok.shape[0]
            logits = glue.decode(
                tok,
                s,
                cos_rows[:, s : s + 1],
                sin_rows[:, s : s + 1],
                add_mask.view(b * KVH, 1, S)[..., : s + 1],
                kv,
            )

        finished = ended_at <= max_new
        resp_len = torch.where(finished, ended_at, steps)
        mask = torch.arange(steps)[None, :] < resp_len[:, None]
        return lens, out_tok[:steps].t(), out_lp[:steps].t(), mask, finished


def _sample(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    top_k: int,
    greedy: bool,
    gen: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its log-prob under ``softmax(logits / temperature)``."""
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    logp = torch.log_softmax(scores, -1)
    if greedy:
        tok = scores.argmax(-1)
    else:
        if 0 < top_k < scores.shape[-1]:  # transformers' TopKLogitsWarper (ties kept)
            kth = torch.topk(scores, top_k, -1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, -torch.inf)
        if top_p < 1.0:  # transformers' TopPLogitsWarper: drop the tail of mass <= 1 - top_p
            srt, idx = torch.sort(scores, -1)
            tail = srt.softmax(-1).cumsum(-1) <= 1 - top_p
            tail[:, -1] = False  # keep at least one token
            scores = scores.masked_fill(tail.scatter(1, idx, tail), -torch.inf)
        probs = logp.exp() if scores is logp or (top_k == 0 and top_p == 1.0) else None
        tok = _inverse_cdf(scores.softmax(-1) if probs is None else probs, gen)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)


def _inverse_cdf(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One categorical draw per row from one uniform per row (``torch.multinomial`` costs
    ~3 us per row on this CPU). ``v`` is kept strictly below the total so the chosen index
    always has positive probability."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    v = torch.rand(total.shape, generator=gen, dtype=cdf.dtype).mul_(total)
    v = torch.minimum(v, total.nextafter(torch.zeros(())))
    return torch.searchsorted(cdf, v, right=True).squeeze(1)


def response_inputs(
    prompts: Sequence[Sequence[int]], tokens: torch.Tensor, mask: torch.Tensor, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(input_ids, attention_mask, position_ids, P)`` of prompt + response rows for one
    ordinary forward: prompts left-padded to width ``P``, responses ``tokens`` (B, T) after
    them (``pad_id`` where ``mask`` is False), positions counting real tokens only."""
    lens = [len(p) for p in prompts]
    prompt_ids = _left_pad(prompts, lens, pad_id)
    P = prompt_ids.shape[1]
    prompt_valid = torch.arange(P)[None, :] >= (P - torch.tensor(lens))[:, None]
    attn = torch.cat([prompt_valid, mask.bool()], 1)
    position_ids = (attn.long().cumsum(1) - 1).clamp_(min=0)
    return torch.cat([prompt_ids, tokens], 1), attn.long(), position_ids, P


def response_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_width: int,
    tokens: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the response tokens and the token entropy, after temperature.

    verl's ``logprobs_from_logits(logits / temperature)`` and ``entropy_from_logits``
    (``logsumexp(z) - sum softmax(z) z``), FP32, one forward over the layout of
    :func:`response_inputs`. Gradients flow unless the caller disables them (the trainer's
    updates use this; :func:`score` is its no-gradient form). Returns ``(log_prob,
    entropy)``, each ``(B, T)``.
    """
    P, T = prompt_width, tokens.shape[1]
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    z = logits[:, P - 1 : P + T - 1].float() / temperature
    logp_all = torch.log_softmax(z, -1)
    log_prob = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    entropy = torch.logsumexp(z, -1) - (logp_all.exp() * z).sum(-1)
    return log_prob, entropy


def score(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    tokens: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    pad_id: int = 0,
) -> torch.Tensor:
    """FP32 ``log_softmax(logits / temperature)`` of each response token, by one ordinary
    ``transformers`` forward over prompt + response (left-padded, explicit positions).

    ``tokens``/``mask`` are (B, T) as in :class:`SampleBatch`; the result is (B, T) and 0
    where ``mask`` is False. No gradient (old log-probs, health checks, tests).
    """
    if tokens.dim() != 2 or tokens.shape != mask.shape or tokens.shape[0] != len(prompts):
        raise ValueError(
            f"tokens {tuple(tokens.shape)} and mask {tuple(mask.shape)} must both be "
            f"(len(prompts)={len(prompts)}, T)"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = int(model.config.vocab_size)
    _check_prompts(prompts, vocab)
    mask = mask.bool()
    tokens = tokens.masked_fill(~mask, pad_id)
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
        raise ValueError(f"response tokens outside [0, {vocab})")
    input_ids, attn, position_ids, P = response_inputs(prompts, tokens, mask, pad_id)
    if input_ids.shape[1] > model.config.max_position_embeddings:
        raise ValueError(
            f"prompt ({P}) + response ({tokens.shape[1]}) tokens exceed "
            f"max_position_embeddings={model.config.max_position_embeddings}"
        )
    with torch.no_grad():
        lp, _ = response_log_probs(model, input_ids, attn, position_ids, P, tokens, temperature)
    return lp.masked_fill(~mask, 0.0)
