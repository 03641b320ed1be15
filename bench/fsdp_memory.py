"""Per-rank model state and step time of charlm under DDP and FSDP2, 2 ranks (gloo, CPU).

For each width, both runs are built by ``trainers.components.build_run`` (so
with the loop's own wrappers: DDP, or ``fully_shard`` per transformer block then
the root) and take a few AdamW updates of the same micro-batch; then each rank
counts the bytes it holds of

* parameters (FSDP: its ``DTensor`` shards, ``to_local()``),
* gradients (``.grad`` of those parameters, after the last update),
* optimizer state (AdamW's ``exp_avg``, ``exp_avg_sq`` and ``step``).

DDP's gradient buckets (another copy of the gradients while they are reduced)
are not counted, so DDP's figure is its floor. Goal: FSDP's per-rank model
state (the sum of the three) at most 0.55x DDP's. Step time: the median of the
updates after two warm-up ones, the slower rank's; the FSDP/DDP ratio is
printed without a goal (on CPU with gloo FSDP's extra all-gathers cost more
than they would with NCCL on GPUs).

    python bench/fsdp_memory.py [--widths 128 256 512] [--layers 4] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 0.55
REPO = Path(__file__).resolve().parents[1]


def _local_bytes(t) -> int:
    from trainers.fsdp import is_dtensor

    t = t.to_local() if is_dtensor(t) else t
    return t.numel() * t.element_size()


def _measure(width: int, layers: int, steps: int, parallelism: str) -> dict:
    import torch

    from trainers import TrainConfig
    from trainers.components import build_run
    from trainers.fsdp import clip_grad_norm
    from trainers.tasks.charlm import CharLMOptions, CharLMTask

    task = CharLMTask(CharLMOptions(d_model=width, n_layer=layers, n_head=4, block_size=64))
    config = TrainConfig(micro_batch_size=8, max_updates=steps, lr=1e-3,
                         parallelism=parallelism, device="cpu")
    run = build_run(task, config)
    batch = task.collate([run.train_set[i] for i in range(8)])
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        with run.grad_sync(True):
            (task.loss_sum(run.train_model, batch) / task.n_items(batch)).backward()
        clip_grad_norm(run.model, 1.0)
        run.optimizer.step()
        if i < steps - 1:
            run.optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    params = list(run.model.parameters())
    state = [v for s in run.optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    return {"param_bytes": sum(_local_bytes(p) for p in params),
            "grad_bytes": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
            "optim_bytes": sum(_local_bytes(v) for v in state),
            "n_params": task.parameter_count(config),
            "step_s": statistics.median(times[2:])}


def worker(out: Path, widths: list[int], layers: int, steps: int) -> None:
    """Under torchrun: measure every width under DDP and FSDP; rank 0 writes ``out``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    rows = []
    for width in widths:
        for parallelism in ("ddp", "fsdp"):
            mine = _measure(width, layers, steps, parallelism)
            ranks: list = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, mine)
            rows.append({"width": width, "parallelism": parallelism, "ranks": ranks})
    if dist.get_rank() == 0:
        out.write_text(json.dumps(rows))
    dist.destroy_process_group()


def _state(rank: dict) -> int:
    return rank["param_bytes"] + rank["grad_bytes"] + rank["optim_bytes"]


def report(rows: list[dict]) -> bool:
    """Print the table and one goal line per width; True if every width meets the goal."""
    mib = 2**20
    print(f"{'width':>5} {'params':>9} {'mode':>4} {'rank':>4} {'param MiB':>9} {'grad MiB':>9}"
          f" {'optim MiB':>9} {'state MiB':>9} {'step ms':>8}")
    by = {(r["width"], r["parallelism"]): r for r in rows}
    all_met = True
    for width in sorted({r["width"] for r in rows}):
        for mode in ("ddp", "fsdp"):
            for k, rank in enumerate(by[width, mode]["ranks"]):
                print(f"{width:>5} {rank['n_params']:>9} {mode:>4} {k:>4} "
                      f"{rank['param_bytes'] / mib:>9.2f} {rank['grad_bytes'] / mib:>9.2f} "
                      f"{rank['optim_bytes'] / mib:>9.2f} {_state(rank) / mib:>9.2f} "
                      f"{rank['step_s'] * 1e3:>8.1f}")
        ddp, fsdp = by[width, "ddp"]["ranks"], by[width, "fsdp"]["ranks"]
        ratio = max(_state(r) for r in fsdp) / max(_state(r) for r in ddp)
        time_ratio = max(r["step_s"] for r in fsdp) / max(r["step_s"] for r in ddp)
        met = ratio <= GOAL
        all_met &= met
        print(f"width {width}: FSDP/DDP per-rank model state {ratio:.3f} (goal <= {GOAL}: "
              f"{'met' if met else 'NOT met'}); step time FSDP/DDP {time_ratio:.2f} (CPU, gloo; "
              f"no goal)")
    return all_met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.widths, args.layers, args.steps)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(Path(__file__).resolve()), "--worker", str(out),
               "--widths", *map(str, args.widths), "--layers", str(args.layers),
               "--steps", str(args.steps)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, env=env, cwd=REPO, timeout=1800)
        rows = json.loads(out.read_text())
    return 0 if report(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
