"""A stand-in for transformers.generation.utils in CI: `_speculative_sampling` with 5.18's
signature, written against `torch` (the stand-in). STANDIN_BROKEN=1 in the environment makes
it accept every draft: the negative control of the README's commands."""

import os

import torch


def _speculative_sampling(
    candidate_input_ids,
    candidate_logits,
    candidate_length,
    new_logits,
    is_done_candidate,
    assistant_ensemble_weight=None,
):
    """Keep draft i w.p. min(1, p/q), then a token from the residual (or p after γ kept)."""
    gamma = candidate_length
    drafts = candidate_input_ids[:, -gamma:]  # (1, γ)
    q, p = candidate_logits.softmax(dim=-1), new_logits.softmax(dim=-1)
    at = torch.arange(gamma)
    ratio = p[0, at, drafts[0]] / q[0, at, drafts[0]]
    if os.environ.get("STANDIN_BROKEN") == "1":
        ratio = ratio * 0 + 1
    kept = torch.rand_like(ratio) <= ratio
    n = int(((~kept).cumsum(dim=-1) < 1).sum())
    if is_done_candidate and n == gamma:
        return drafts[:, :n], n - 1
    weights = (p[:, n] - q[:, n]).clamp(min=0) if n < gamma else p[:, n]
    final = torch.multinomial(weights / weights.sum(), num_samples=1)  # (1, 1)
    return torch.cat((drafts[:, :n], final), dim=-1), torch.tensor(n)
