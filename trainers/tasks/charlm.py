"""``charlm``: a small GPT-style character-level language model.

Corpus: by default the top-level ``.py`` files of the running Python's standard
library (about 4.7 MB for CPython 3.11), or any UTF-8 text file given as
``corpus``. The text is tokenized once (one token per character, the vocabulary
is the corpus's sorted set of characters) into a memory-mapped ``uint16`` file
in a cache directory, then read as random windows (``trainers.data.TokenWindows``).
The last ``val_fraction`` of the stream is held out and evaluated as contiguous
blocks. Metrics: ``val_loss`` (mean cross entropy per character, nats) and
``val_bpc`` (bits per character, ``val_loss / ln 2``).

Model: token + learned position embeddings, pre-LayerNorm transformer blocks
(causal ``scaled_dot_product_attention``, GELU MLP of width 4D), final
LayerNorm, output head tied to the token embedding (Radford et al., GPT-2, 2019;
Karpathy's nanoGPT).

Shapes: B batch, T time (<= block_size), D d_model, V vocabulary size;
tokens int64 (B, T); logits float (B, T, V).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sysconfig
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset

from trainers.config import TrainConfig
from trainers.data import ContiguousBlocks, TokenWindows
from trainers.errors import ConfigError
from trainers.fields import option, require
from trainers.tasks.base import Task

MAX_WINDOWS_PER_EPOCH = 10_000_000  # 40 billion tokens an epoch at block_size 4096


@dataclasses.dataclass(frozen=True, kw_only=True)
class CharLMOptions:
    """Options of the ``charlm`` task."""

    corpus: str | None = option(None, "UTF-8 text file; null: the Python stdlib's .py files",
                                path=True)
    cache_dir: str | None = option(None, "token cache; null: $XDG_CACHE_HOME/hpo or ~/.cache/hpo",
                                   path=True)
    block_size: int = option(128, "context length in characters (8..4096)")
    n_layer: int = option(2, "transformer blocks (1..48)")
    n_head: int = option(4, "attention heads; must divide d_model")
    d_model: int = option(128, "model width (8..8192)")
    dropout: float = option(0.0, "dropout on embeddings, attention and residuals, [0, 1)")
    windows_per_epoch: int = option(4096, "random training windows per epoch (1..10,000,000)")
    val_fraction: float = option(0.05, "fraction of the token stream held out, (0, 0.5]")
    max_eval_blocks: int = option(256, "validation blocks evaluated (>= 1)")

    def __post_init__(self) -> None:
        require(8 <= self.block_size <= 4096, "block_size",
                f"must be in 8..4096, got {self.block_size}")
        require(1 <= self.n_layer <= 48, "n_layer", f"must be in 1..48, got {self.n_layer}")
        require(8 <= self.d_model <= 8192, "d_model", f"must be in 8..8192, got {self.d_model}")
        require(self.n_head >= 1 and self.d_model % self.n_head == 0, "n_head",
                f"must be >= 1 and divide d_model={self.d_model}, got {self.n_head}")
        require(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        # each epoch draws every window's offset up front (8 bytes each): the bound keeps
        # that under 80 MB, as a spec or a model file could otherwise ask for exabytes
        require(1 <= self.windows_per_epoch <= MAX_WINDOWS_PER_EPOCH, "windows_per_epoch",
                f"must be in 1..{MAX_WINDOWS_PER_EPOCH:,}, got {self.windows_per_epoch}")
        require(0 < self.val_fraction <= 0.5, "val_fraction",
                f"must be in (0, 0.5], got {self.val_fraction}")
        require(self.max_eval_blocks >= 1, "max_eval_blocks",
                f"must be >= 1, got {self.max_eval_blocks}")
        if self.corpus is not None:
            require(Path(self.corpus).is_file(), "corpus", f"no such file: {self.corpus}")
            # UTF-8 needs at least one byte per character: a smaller file is surely too small
            need = min_corpus_chars(self.block_size, self.val_fraction)
            size = Path(self.corpus).stat().st_size
            require(size >= need, "corpus", f"{size} bytes is too small for block_size "
                                            f"{self.block_size} and val_fraction "
                                            f"{self.val_fraction}: need {need} characters")


COUNTED_VOCAB = 256
"""The vocabulary :meth:`CharLMTask.parameter_count` assumes before the corpus is read (the
default corpus, the standard library's sources, has about 170 distinct characters)."""


def min_corpus_chars(block_size: int, val_fraction: float) -> int:
    """Characters a corpus needs: one training window and one validation block."""
    return math.ceil((block_size + 2) / val_fraction) + block_size + 2


# -- corpus ----------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """The top-level ``.py`` files of the running Python's standard library, sorted."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hpo"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A tokenized corpus: ``tokens`` (memory-mapped uint16, one per character) and ``vocab``."""

    tokens: np.ndarray
    vocab: str

    def unigram_entropy_nats(self) -> float:
        """Entropy of the character frequencies, nats per character."""
        counts = np.bincount(np.asarray(self.tokens), minlength=len(self.vocab))
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())


def load_corpus(files: list[Path], cache_dir: Path) -> Corpus:
    """Tokenize ``files`` once into ``cache_dir`` (keyed by their paths, sizes and mtimes).

    Concurrent callers (parallel trials) are safe: each builds in a private
    temporary directory and renames it into place; the first rename wins.

    Raises:
        ConfigError: ``corpus``: a file cannot be read or is empty; ``cache_dir``: the
            cache cannot be created, written or read there (not a directory, no space,
            no permission).
    """
    try:
        key = hashlib.sha256(json.dumps([[str(f), f.stat().st_size, f.stat().st_mtime_ns]
                                         for f in files]).encode()).hexdigest()
    except OSError as e:
        raise _corpus_error(e) from None
    final = cache_dir / f"charlm-{key[:16]}"
    if not (final / "vocab.json").is_file():
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = cache_dir / f".tmp-{uuid.uuid4().hex}"
            tmp.mkdir()
        except OSError as e:
            raise _cache_error(cache_dir, e) from None
        try:
            _tokenize(files, tmp)
            os.rename(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (final / "vocab.json").is_file():  # else another process finished first
                raise _cache_error(cache_dir, e) from None
        except ConfigError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        vocab = json.loads((final / "vocab.json").read_text())
        return Corpus(np.memmap(final / "tokens.u16", dtype=np.uint16, mode="r"), vocab)
    except (OSError, ValueError) as e:
        raise _cache_error(cache_dir, e) from None


def _corpus_error(e: OSError) -> ConfigError:
    return ConfigError("corpus", f"cannot read the corpus: {type(e).__name__}: {e}")


def _cache_error(cache_dir: Path, e: Exception) -> ConfigError:
    return ConfigError("cache_dir", f"cannot keep the token cache in {cache_dir}: "
                                    f"{type(e).__name__}: {e}")


def _tokenize(files: list[Path], out: Path) -> None:
    try:
        text = "".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    except OSError as e:
        raise _corpus_error(e) from None
    if not text:
        raise ConfigError("corpus", "the corpus is empty")
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    vocab_codes = np.unique(codes)
    if len(vocab_codes) > 65535:
        raise ConfigError("corpus", f"{len(vocab_codes)} distinct characters; at most 65535")
    np.searchsorted(vocab_codes, codes).astype(np.uint16).tofile(out / "tokens.u16")
    (out / "vocab.json").write_text(json.dumps("".join(map(chr, vocab_codes.tolist()))))


# -- model -----------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attn_proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model), nn.Dropout(dropout))
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(self.ln_1(x_BTD)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x_BTD = x_BTD + self.resid_dropout(self.attn_proj(y.transpose(1, 2).reshape(B, T, D)))
        return x_BTD + self.mlp(self.ln_2(x_BTD))


class CharGPT(nn.Module):
    """A GPT over characters (see module doc).

    With ``activation_checkpointing`` each block is recomputed during backward
    (``torch.utils.checkpoint``, ``use_reentrant=False``), trading compute for
    activation memory; gradients are unchanged.
    """

    def __init__(self, vocab_size: int, o: CharLMOptions, activation_checkpointing: bool) -> None:
        super().__init__()
        self.block_size = o.block_size
        self.activation_checkpointing = activation_checkpointing
        self.tok_emb = nn.Embedding(vocab_size, o.d_model)
        self.pos_emb = nn.Embedding(o.block_size, o.d_model)
        self.drop = nn.Dropout(o.dropout)
        self.blocks = nn.ModuleList(Block(o.d_model, o.n_head, o.dropout) for _ in range(o.n_layer))
        self.ln_f = nn.LayerNorm(o.d_model)
        self.head = nn.Linear(o.d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("attn_proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * o.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx_BT: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of token ids (B, T), T <= block_size."""
        T = idx_BT.shape[1]
        pos_T = torch.arange(T, device=idx_BT.device)
        x_BTD = self.drop(self.tok_emb(idx_BT) + self.pos_emb(pos_T))
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                x_BTD = checkpoint(block, x_BTD, use_reentrant=False)
            else:
                x_BTD = block(x_BTD)
        return self.head(self.ln_f(x_BTD))


# -- task ------------------------------------------------------------------------------


class CharLMTask(Task):
    """Character-level language modelling (see module doc)."""

    name = "charlm"
    Options = CharLMOptions
    metrics: Mapping[str, str] = {"val_loss": "minimize", "val_bpc": "minimize"}
    objective = "val_loss"
    item_unit = "token"
    mutable_options = frozenset({"dropout"})
    supports_activation_checkpointing = True
    default_config = {"micro_batch_size": 32, "lr": 3e-3, "weight_decay": 0.1,
                      "max_updates": 300, "max_epochs": None, "warmup_steps": 30,
                      "eval_interval": 100, "schedule": "cosine", "adam_beta2": 0.99}

    def corpus(self) -> Corpus:
        o = self.options
        files = [Path(o.corpus)] if o.corpus else stdlib_files()
        return load_corpus(files, Path(o.cache_dir) if o.cache_dir else default_cache_dir())

    def datasets(self, seed: int) -> tuple[Dataset, Dataset]:
        o = self.options
        corpus = self.corpus()
        self.vocab_size = len(corpus.vocab)
        need = min_corpus_chars(o.block_size, o.val_fraction)
        if len(corpus.tokens) < need:
            raise ConfigError("corpus", f"{len(corpus.tokens)} characters is too small for "
                                        f"block_size {o.block_size} and val_fraction "
                                        f"{o.val_fraction}: need {need}")
        split = int(len(corpus.tokens) * (1 - o.val_fraction))
        train = TokenWindows(corpus.tokens[:split], o.block_size, o.windows_per_epoch, seed)
        val = ContiguousBlocks(corpus.tokens[split:], o.block_size, o.max_eval_blocks)
        return train, val

    def build_model(self, config: TrainConfig) -> nn.Module:
        if not hasattr(self, "vocab_size"):
            self.vocab_size = len(self.corpus().vocab)
        return CharGPT(self.vocab_size, self.options, config.activation_checkpointing)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The transformer blocks: FSDP shards each on its own (``Task.blocks``)."""
        return list(model.blocks)

    def parameter_count(self, config: TrainConfig) -> int:
        """The parameters of :class:`CharGPT`, by formula (no model built, no corpus read):
        embeddings ``(V + block_size) * D``, per block ``12 D^2 + 13 D``, the final
        LayerNorm ``2 D``; the head is tied to the token embedding. ``V`` is the corpus's
        vocabulary once it has been read, else :data:`COUNTED_VOCAB`."""
        o, d = self.options, self.options.d_model
        vocab = getattr(self, "vocab_size", COUNTED_VOCAB)
        return (vocab + o.block_size) * d + o.n_layer * (12 * d * d + 13 * d) + 2 * d

    def loss_sum(self, model: nn.Module, batch) -> torch.Tensor:
        x_BT, y_BT = batch
        logits_BTV = model(x_BT)
        return F.cross_entropy(logits_BTV.flatten(0, 1).float(), y_BT.flatten(), reduction="sum")

    def n_items(self, batch) -> int:
        return int(batch[1].numel())

    def eval_sums(self, model: nn.Module, batch) -> dict[str, torch.Tensor]:
        return {"loss": self.loss_sum(model, batch), "tokens": torch.tensor(batch[1].numel())}

    def eval_metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
        loss = sums["loss"] / sums["tokens"]
        return {"val_loss": loss, "val_bpc": loss / math.log(2)}
