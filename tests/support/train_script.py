"""A small real training loop that checkpoints every step, for the kill-and-resume tests.

    python tests/support/train_script.py DATASET OUT --mode batch|sample --workers 2 --persistent
        --epochs 2 --kill-at 5 11 [--world 2] [--resume-from rank0.pt] [--auto-epoch]
        [--buckets AREA,MULTIPLE[,GROUP[,LEFTOVER]]] [--mix-with DATASET2] [--tokens PATCH,BUDGET,L1:L2...]

Each step records the identity (sha1 of the pixels) of every sample it trained on; the checkpoint
(model, optimiser, loader state, step, the record so far) is written atomically after the step.
With ``--kill-at S`` the process SIGKILLs itself while holding batch S, before that step's
checkpoint, if it did not start at or after S (so a resumed run goes past it). With ``--world N``
the ranks form a real gloo group and every rank kills itself at the same step. With
``--auto-epoch`` the loop never calls ``set_epoch``: each pass over the loader is the next epoch.
With ``--mix-with`` it reads ``mix([DATASET, DATASET2])`` (equal weights) instead.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from readers import AspectBuckets, TokenBudget, make_loader, mix, open_iterable

BATCH = 4


def sample_ids(images: torch.Tensor) -> list[str]:
    return [hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest()[:12] for img in images]


def run_rank(rank: int, args: argparse.Namespace) -> None:
    if args.world > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{args.out}/store-{args.attempt}", rank=rank, world_size=args.world
        )
    ckpt_path = Path(args.out) / f"rank{rank}.pt"
    batch_options: dict = {"batch_size": BATCH} if args.mode == "batch" else {}
    if args.buckets:  # AREA,MULTIPLE[,GROUP[,LEFTOVER]]: a bucketed read (readers/bucketing/buckets.py)
        area, multiple, group, leftover = (args.buckets.split(",") + ["", ""])[:4]
        batch_options["buckets"] = AspectBuckets(
            area=int(area), multiple=int(multiple), group=int(group) if group else None,
            leftover=leftover or "pad",
        )
    # PATCH,BUDGET,L1:L2...: a token-budget read (readers/bucketing/token_budget.py), its own sizes
    if args.tokens:
        patch, budget, lens = args.tokens.split(",")
        lengths = tuple(int(n) for n in lens.split(":"))
        batch_options = {"buckets": TokenBudget(patch=int(patch), budget=int(budget), seq_lens=lengths)}
    options = dict(seed=3, block_size=4, buffer_size=16, **batch_options)
    if args.mix_with:
        it = mix([args.dataset, args.mix_with], **options)
    else:
        it = open_iterable(args.dataset, **options)
    loader_options = {} if args.mode == "batch" else {"batch_size": BATCH}
    persistent = args.persistent and args.workers > 0
    loader = make_loader(it, num_workers=args.workers, persistent_workers=persistent, **loader_options)
    model = torch.nn.Linear(3, max(5, len(it.classes)))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    step, record, first_epoch = 0, [], 0
    source = Path(args.resume_from) if args.resume_from else ckpt_path
    if source.exists():
        ckpt = torch.load(source, weights_only=False)
        loader.load_state_dict(ckpt["loader"])
        if source == ckpt_path:  # same run: model, step and record carry on
            model.load_state_dict(ckpt["model"])
            optimiser.load_state_dict(ckpt["optimiser"])
            step, record = ckpt["step"], ckpt["record"]
        first_epoch = ckpt["epoch"]
    started_at = step
    for epoch in range(first_epoch, args.epochs):
        if not args.auto_epoch:
            it.set_epoch(epoch)
        for images, labels in loader:
            if step in args.kill_at and step > started_at:
                os.kill(os.getpid(), signal.SIGKILL)
            loss = torch.nn.functional.cross_entropy(model(images.float().mean(dim=(2, 3))), labels)
            optimiser.zero_grad()
            loss.backward()
            if args.world > 1:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
            optimiser.step()
            record.append([loader.epoch, *sample_ids(images)])
            step += 1
            state = {
                "model": model.state_dict(),
                "optimiser": optimiser.state_dict(),
                "step": step,
                "record": record,
                "loader": loader.state_dict(),
                "epoch": epoch,
            }
            torch.save(state, ckpt_path.with_suffix(".tmp"))
            os.replace(ckpt_path.with_suffix(".tmp"), ckpt_path)
            if args.world > 1:
                dist.barrier()  # every rank's checkpoint is on disk before any goes on
    (Path(args.out) / f"rank{rank}.done").write_text(str(step))
    if args.world > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out")
    parser.add_argument("--mode", choices=("batch", "sample"), default="batch")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--kill-at", type=int, nargs="*", default=[])
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--auto-epoch", action="store_true")
    parser.add_argument("--buckets", default=None)
    parser.add_argument("--mix-with", default=None)
    parser.add_argument("--tokens", default=None)
    args = parser.parse_args()
    os.environ.pop("RANK", None)
    os.environ.pop("WORLD_SIZE", None)
    if args.world == 1:
        run_rank(0, args)
    else:
        mp.spawn(run_rank, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
