""""Did you mean ...?" for names a spec gets wrong: unknown spec fields, task options and
search-space parameters.

A name is matched against the names allowed where it stands: first a table of the
names other tools use for the same thing (``learning_rate`` is ``lr`` here, ``epochs``
is ``max_epochs``), then the closest spelling (:func:`difflib.get_close_matches`, so
``n_trails`` finds ``n_trials``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# names from other tools (PyTorch, Keras, Ray Tune, Optuna, Hugging Face) -> ours
ALIASES = {
    "learning_rate": "lr", "learningrate": "lr", "lr_rate": "lr",
    "batch_size": "micro_batch_size", "batchsize": "micro_batch_size",
    "train_batch_size": "micro_batch_size", "per_device_train_batch_size": "micro_batch_size",
    "epochs": "max_epochs", "n_epochs": "max_epochs", "num_epochs": "max_epochs",
    "num_train_epochs": "max_epochs", "max_steps": "max_updates", "steps": "max_updates",
    "num_samples": "n_trials", "num_trials": "n_trials", "trials": "n_trials",
    "n_trial": "n_trials", "max_trials": "n_trials", "max_concurrent": "max_concurrent_trials",
    "gradient_accumulation_steps": "grad_accum_steps", "accumulation_steps": "grad_accum_steps",
    "grad_clip": "max_grad_norm", "clip_grad_norm": "max_grad_norm",
    "gradient_clipping": "max_grad_norm", "max_norm": "max_grad_norm",
    "wd": "weight_decay", "l2": "weight_decay", "dropout_rate": "dropout",
    "warmup": "warmup_steps", "num_warmup_steps": "warmup_steps", "hidden_size": "width",
    "hidden_dim": "width", "num_layers": "depth", "n_layers": "depth",
    "mixed_precision": "precision", "amp": "precision", "random_seed": "seed",
    "mode": "direction", "search_alg": "sampler", "algorithm": "sampler",
}


def closest(name: str, allowed: Iterable[str]) -> str | None:
    """The allowed name ``name`` most likely meant, or ``None``."""
    allowed = list(allowed)
    alias = ALIASES.get(name.lower())
    if alias in allowed and alias != name:
        return alias
    match = difflib.get_close_matches(name.lower(), allowed, n=1, cutoff=0.7)
    return match[0] if match and match[0] != name else None


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """``" (did you mean 'lr'?)"``, or ``""`` when nothing is close."""
    best = closest(name, allowed)
    return f" (did you mean {best!r}?)" if best else ""
