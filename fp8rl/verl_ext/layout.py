"""Where each row of a step's batch goes with several data-parallel ranks, so that every PPO
mini-batch holds the rows it holds with one rank.

verl's dispatch hands rank ``r`` of ``W`` the ``r``-th contiguous ``1/W`` of the update
batch, and each rank cuts its share into the step's ``M`` mini-batches, in order. With one
rank, mini-batch ``m`` is rows ``[m B/M, (m+1) B/M)`` of the batch in draw order
(``fp8rl.verl_ext.actor_trainer``). verl's own ``_balance_batch`` reorders the batch to even
out the ranks' tokens, which changes which rows share a mini-batch, and so every number of
the update, with the number of ranks. fp8rl's trainer lays the draw-ordered batch out
instead as :func:`rank_layout` says: rank ``r``'s ``m``-th mini-batch is the ``r``-th
``1/W`` of one-rank mini-batch ``m``. Global mini-batch ``m`` is then the same rows for any
``W`` (what differs is only how the ranks' sums are reassociated, and how a token-mean loss
weighs the ranks' halves: ``fp8rl.verl_ext.agreement.compare_ranks`` measures it). The
token dump (``fp8rl.verl_ext.token_dump``) numbers its rows back in draw order with the
same function. Pure Python: the driver and the actor workers import it alike.
"""

from __future__ import annotations

__all__ = ["LAYOUT_KEY", "rank_layout"]

#: The update batch's key that says the trainer laid it out (its value: the mini-batches M).
LAYOUT_KEY = "fp8rl_rank_layout"


def rank_layout(rows: int, ranks: int, mini_batches: int) -> list[int]:
    """The draw-order row at each position of the batch verl dispatches (the module
    docstring); ValueError when ``rows`` does not split into ``ranks x mini_batches`` equal
    parts (verl would pad the batch with dummy rows)."""
    if ranks < 1 or mini_batches < 1:
        raise ValueError(f"ranks ({ranks}) and mini-batches ({mini_batches}) must be >= 1")
    if rows % (ranks * mini_batches):
        raise ValueError(
            f"a batch of {rows} rows does not split into {ranks} data-parallel ranks x "
            f"{mini_batches} mini-batches: make rollout.prompts_per_step x rollout.n_samples "
            f"a multiple of {ranks * mini_batches}"
        )
    per, size = rows // (ranks * mini_batches), rows // mini_batches
    return [m * size + r * per + i
            for r in range(ranks) for m in range(mini_batches) for i in range(per)]  # fmt: skip
