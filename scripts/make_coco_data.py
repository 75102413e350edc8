"""A generated COCO detection set (boxes drawn into the pixels; see tests/cocodata.py).

python scripts/make_coco_data.py coco --count 300    # coco/instances.json + coco/images/
python scripts/make_coco_data.py coco --segmentation # each box's rectangle as a polygon too
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cocodata import add_rectangle_polygons, make_coco  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--segmentation", action="store_true", help="rectangle polygons as segmentations")
    args = parser.parse_args()
    coco = make_coco(args.out, count=args.count, seed=args.seed)
    print(add_rectangle_polygons(coco) if args.segmentation else coco)
    return 0


if __name__ == "__main__":
    sys.exit(main())
