"""Non-dominated sorting over objective values already read (all objectives minimized)."""

from __future__ import annotations

import numpy as np

from hpo.storage import pareto_front_mask


def nondomination_ranks(losses):
    """The front of each row of ``losses`` by non-dominated sorting (all objectives minimized).

    Front 0 is :func:`pareto_front_mask`'s front; front ``k`` is the front of the rows
    left after removing fronts ``0`` to ``k - 1``.

    Args:
        losses: float array of shape ``(n_rows, n_objectives)``, finite or ``inf``.

    Returns:
        int array of shape ``(n_rows,)``: each row's front, 0-based.
    """
    losses = np.asarray(losses, dtype=float)
    ranks = np.full(len(losses), -1, dtype=int)
    left = np.arange(len(losses))
    front = 0
    while left.size:
        on_front = pareto_front_mask(losses[left])
        ranks[left[on_front]] = front
        left, front = left[~on_front], front + 1
    return ranks
