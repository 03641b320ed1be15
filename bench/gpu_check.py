"""GPU check of the training loop: charlm in fp32, bf16 and fp16 on one CUDA device.

Prints, per precision, the step time (median over the measured window, after
warm-up), tokens/s, peak CUDA memory, skipped fp16 updates and the final
validation loss, plus the bf16/fp32 speed ratio (goal >= 2 on a modern GPU).

    python bench/gpu_check.py [--updates 120] [--device cuda:0]

Exits with status 2 and a message when no CUDA device is available.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from trainers import Decision, create, fit

MODEL = {"d_model": 512, "n_layer": 6, "n_head": 8, "block_size": 256, "micro_batch_size": 64,
         "max_epochs": None, "max_eval_blocks": 64}


class StepTimer:
    """Records wall time between consecutive evaluations (evaluated every ``interval`` updates)."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float]] = []
        self.last: dict = {}

    def report(self, metrics, save_checkpoint):
        torch.cuda.synchronize()
        self.marks.append((metrics["step"], time.perf_counter()))
        self.last = dict(metrics)
        return Decision.CONTINUE

    def step_ms(self) -> float:
        (s0, t0), (s1, t1) = self.marks[1], self.marks[-1]  # skip the warm-up interval
        return 1e3 * (t1 - t0) / (s1 - s0)


def run(precision: str, updates: int, device: str) -> dict:
    task, config = create("charlm", {**MODEL, "precision": precision, "device": device,
                                     "max_updates": updates, "eval_interval": updates // 4})
    torch.cuda.reset_peak_memory_stats(device)
    timer = StepTimer()
    fit(task, config, timer)
    m = timer.last
    return {"precision": precision, "step_ms": timer.step_ms(), "tokens_per_s": m["tokens_per_s"],
            "peak_gib": m["peak_memory_bytes"] / 2**30, "skipped": m["skipped_updates"],
            "val_loss": m["val_loss"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=120)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device available; nothing measured", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    print(f"device: {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}")
    rows = [run(p, args.updates, args.device) for p in ("fp32", "bf16", "fp16")]
    print(f"{'precision':9} {'ms/step':>8} {'tokens/s':>11} {'peak GiB':>9} {'skipped':>8} "
          f"{'val_loss':>9}")
    for r in rows:
        print(f"{r['precision']:9} {r['step_ms']:8.1f} {r['tokens_per_s']:11,.0f} "
              f"{r['peak_gib']:9.2f} {r['skipped']:8d} {r['val_loss']:9.4f}")
    print(f"bf16 speed-up over fp32: {rows[0]['step_ms'] / rows[1]['step_ms']:.2f}x (goal >= 2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
