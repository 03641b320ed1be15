"""Step time of ``trainers.fit`` against a minimal hand-written PyTorch loop.

Same model, data, seed and optimizer setup (AdamW with the same parameter
groups, cosine schedule, gradient clipping at 1.0, fp32, CPU). Each measurement
is the time per optimizer update obtained by differencing a long and a short
run (``(T(n_long) - T(n_short)) / (n_long - n_short)``), which cancels setup and
the final evaluation. Engine and hand loop alternate; the figure is the median
of the per-repeat ratios. Goal: <= 1.03.

    python bench/train_overhead.py [--task digits|charlm|both] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from trainers import create, fit
from trainers.data import epoch_order, loader, micro_batches
from trainers.optim import build_optimizer
from trainers.schedules import build_scheduler

SETTINGS = {  # task: (params, n_short, n_long)
    "digits": ({"micro_batch_size": 64, "max_epochs": None, "eval_interval": 10**9}, 40, 240),
    "charlm": ({"micro_batch_size": 16, "max_epochs": None, "eval_interval": 10**9,
                "max_eval_blocks": 8}, 6, 30),
}


def engine_seconds(task_name: str, n_updates: int) -> float:
    params, _, _ = SETTINGS[task_name]
    task, config = create(task_name, {**params, "max_updates": n_updates})
    started = time.perf_counter()
    fit(task, config)
    return time.perf_counter() - started


def hand_loop_seconds(task_name: str, n_updates: int) -> float:
    """The loop a careful person writes by hand, with the same components."""
    params, _, _ = SETTINGS[task_name]
    task, config = create(task_name, {**params, "max_updates": n_updates})
    started = time.perf_counter()
    train_set, val_set = task.datasets(config.seed)
    torch.manual_seed(config.seed)
    model = task.build_model(config)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, n_updates)
    model.train()
    step, epoch = 0, 0
    while step < n_updates:
        if hasattr(train_set, "set_epoch"):
            train_set.set_epoch(epoch)
        order = epoch_order(train_set, seed=config.seed, epoch=epoch)
        for x, y in loader(train_set, micro_batches(order, config.micro_batch_size),
                           task.collate):
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()
            step += 1
            if step == n_updates:
                break
        epoch += 1
    model.eval()
    with torch.no_grad():  # one final evaluation, as fit does
        for batch in loader(val_set, micro_batches(range(len(val_set)), 64), task.collate):
            task.eval_sums(model, batch)
    return time.perf_counter() - started


def measure(task_name: str, repeats: int) -> dict[str, float]:
    _, n_short, n_long = SETTINGS[task_name]
    engine_steps, hand_steps, ratios = [], [], []
    engine_seconds(task_name, n_short)  # warm-up: imports, corpus cache, allocator
    for _ in range(repeats):
        hand = (hand_loop_seconds(task_name, n_long) - hand_loop_seconds(task_name, n_short))
        engine = (engine_seconds(task_name, n_long) - engine_seconds(task_name, n_short))
        hand_steps.append(hand / (n_long - n_short))
        engine_steps.append(engine / (n_long - n_short))
        ratios.append(engine_steps[-1] / hand_steps[-1])
    return {"engine_ms": 1e3 * statistics.median(engine_steps),
            "hand_ms": 1e3 * statistics.median(hand_steps),
            "ratio": statistics.median(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["digits", "charlm", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    names = ["digits", "charlm"] if args.task == "both" else [args.task]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, CPU")
    print(f"{'task':8} {'engine ms/step':>15} {'hand ms/step':>13} {'median ratio':>13}")
    for name in names:
        r = measure(name, args.repeats)
        print(f"{name:8} {r['engine_ms']:15.2f} {r['hand_ms']:13.2f} {r['ratio']:13.3f}")


if __name__ == "__main__":
    main()
