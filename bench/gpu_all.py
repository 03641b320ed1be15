"""Every GPU check in one run, with one summary table (for a machine with CUDA GPUs).

1. the trainers GPU check (``bench/gpu_check.py``): charlm step time and peak memory in
   fp32, bf16 and fp16; goal bf16 >= 2x fp32;
2. a short ``digits`` study of 4 trials sharing one GPU at 0.25 GPU each (Ray Tune through
   ``hpo``'s ``run_study``): how many ran at once, their states, the best accuracy;
3. with 2+ GPUs: one DDP trial with 2 workers on NCCL;
4. with 2+ GPUs: the same trial with FSDP2 (``resources.parallelism: fsdp``: the model
   sharded by ``fully_shard``, sharded DCP checkpoints).

    python bench/gpu_all.py [--updates 120]

Without a CUDA device it prints why and exits with status 2 (nothing else runs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]


def precision_rows(updates: int) -> list[tuple[str, str, str]]:
    import gpu_check

    rows, results = [], {}
    for precision in ("fp32", "bf16", "fp16"):
        r = gpu_check.run(precision, updates, "cuda:0")
        results[precision] = r
        rows.append((f"charlm {precision}", f"{r['step_ms']:.1f} ms/step, "
                     f"{r['tokens_per_s']:.0f} tok/s, peak {r['peak_gib']:.2f} GiB",
                     f"val_loss {r['val_loss']:.3f}, skipped {r['skipped']}"))
    speedup = results["fp32"]["step_ms"] / results["bf16"]["step_ms"]
    rows.append(("bf16 / fp32 speed", f"{speedup:.2f}x", "goal >= 2: " +
                 ("met" if speedup >= 2 else "NOT met")))
    return rows


def study_row(name: str, resources: dict, n_trials: int, concurrency: int,
              workdir: Path) -> tuple[str, str, str]:
    from hpo.spec import parse_spec
    from hpo.storage import open_storage
    from hpo.tune.driver import run_study

    spec = parse_spec({"name": name, "task": "digits",
                       "config": {"max_epochs": 3, "micro_batch_size": 64},
                       "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.3,
                                               "log": True}},
                       "objective": {"metric": "val_accuracy"},
                       "sampler": {"name": "random", "seed": 0}, "resources": resources,
                       "budget": {"n_trials": n_trials, "max_concurrent_trials": concurrency}})
    url = f"sqlite:///{workdir / 'gpu.db'}"
    t0 = time.perf_counter()
    outcome = run_study(spec, url, results_dir=workdir / "runs")
    wall = time.perf_counter() - t0
    import optuna

    trials = optuna.load_study(study_name=name, storage=open_storage(url)).trials
    spans = [(t.user_attrs.get("started_at"), t.user_attrs.get("ended_at")) for t in trials]
    overlap = max(sum(1 for s, e in spans if s and e and s <= a < e) for a, _ in spans if a)
    states = ", ".join(sorted({t.state.name for t in trials}))
    best = f"{outcome.best_value:.4f}" if outcome.best_value is not None else "-"
    return (name, f"{len(trials)} trials in {wall:.0f} s, up to {overlap} at once",
            f"{states}; best val_accuracy {best}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=120)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here (torch.cuda.is_available() is False): nothing to measure; "
              "run this on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    n_gpus = torch.cuda.device_count()
    rows = [("device", f"{n_gpus} x {torch.cuda.get_device_name(0)}",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}")]
    rows += precision_rows(args.updates)
    import ray

    ray.init(num_gpus=n_gpus, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(study_row("gpu-shared-4x0.25", {"cpus": 1, "gpus": 0.25}, 4, 4, Path(tmp)))
        if n_gpus >= 2:
            rows.append(study_row("gpu-ddp-2-nccl", {"cpus": 1, "gpus": 1, "workers": 2}, 1, 1,
                                  Path(tmp)))
            rows.append(study_row("gpu-fsdp2-2-nccl", {"cpus": 1, "gpus": 1, "workers": 2,
                                                       "parallelism": "fsdp"}, 1, 1, Path(tmp)))
        else:
            rows.append(("gpu-ddp-2-nccl", "skipped", "needs 2+ GPUs"))
            rows.append(("gpu-fsdp2-2-nccl", "skipped", "needs 2+ GPUs"))
    ray.shutdown()
    width = max(len(r[0]) for r in rows)
    print(f"{'check':{width}}  result  |  notes")
    for check, result, notes in rows:
        print(f"{check:{width}}  {result}  |  {notes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
