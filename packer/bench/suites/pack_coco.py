"""`pack coco` against `pack imagefolder` on the same images: the cost of boxes at pack time.

The images are an ImageNet-style generated folder (packer/bench/bench_data.py); a COCO file
lists the same files with 1-20 random boxes each (categories = the folder's classes). Both packs
run `--to lmdb --resize 256` with the same workers, alternating, and the ratio of the medians is
printed (>= 0.9 is the issue 23 target).

    pack bench run pack_coco --n 1000 --repeat 3 --workers 2
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
from pathlib import Path

from PIL import Image

from packer.bench.bench_data import make_bench_folder
from packer.bench.harness import code_env, run_measured


def write_coco(src: Path, seed: int = 0) -> Path:
    """``src/instances.json``: every image of the folder with 1-20 random boxes."""
    rng = random.Random(seed)
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    images: list[dict] = []
    annotations: list[dict] = []
    for label, name in enumerate(classes):
        for path in sorted((src / name).iterdir()):
            with Image.open(path) as img:
                width, height = img.size
            image_id = len(images) + 1
            images.append(
                {"id": image_id, "file_name": f"{name}/{path.name}", "width": width, "height": height}
            )
            for _ in range(rng.randint(1, 20)):
                w, h = rng.uniform(4, width / 2), rng.uniform(4, height / 2)
                box = [rng.uniform(0, width - w), rng.uniform(0, height - h), w, h]
                annotations.append(
                    {"id": len(annotations) + 1, "image_id": image_id, "category_id": label + 1, "bbox": box}
                )
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(classes)]
    path = src / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000, help="images in the generated folder")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench/pack-coco"))
    args = parser.parse_args()
    src = make_bench_folder(Path(f"/tmp/imgpack-bench/n{args.n}"), args.n)
    coco_dir = args.work / "coco"
    shutil.rmtree(coco_dir, ignore_errors=True)
    coco_dir.mkdir(parents=True)
    annotations = write_coco(src)
    env = code_env()
    common = ["--to", "lmdb", "--resize", "256", "--workers", str(args.workers), "-q"]
    runs = {
        "imagefolder": lambda out: ["imagefolder", str(src), "-o", str(out)],
        "coco": lambda out: ["coco", str(annotations), "--root", str(src), "-o", str(out)],
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(args.repeat):
        order = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
        for name in order:
            out = args.work / name
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "packer.cli", *runs[name](out), *common]
            seconds[name].append(run_measured(cmd, env=env).seconds)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in median.items():
        print(f"{name:12s} median {value:6.2f} s  ({args.n / value:6.0f} img/s)  runs {seconds[name]}")
    print(f"pack coco / pack imagefolder throughput: {median['imagefolder'] / median['coco']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
