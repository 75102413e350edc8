"""The Ray engine: one task per part, each preprocessing and writing its own part files.

Workers must see ``out`` at the same path (a shared filesystem on a real cluster). Tasks return
plain dicts, so nothing but JSON-able data crosses back to the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from packer.formats import FormatWriter, PartResult
from packer.preprocess import PreprocessSpec
from readers.errors import ImgpackError
from readers.manifest import Shard


def _pack_part(
    writer: FormatWriter, part: int, items: list, spec: PreprocessSpec, on_error: str
) -> dict[str, Any]:
    from packer.engine import _preprocess_chunk, write_part

    return asdict(write_part(writer, part, _preprocess_chunk(items, spec), on_error))


def run_ray(
    writer: FormatWriter,
    parts: list,
    spec: PreprocessSpec,
    on_error: str,
    bar: Any,
    done: dict[int, PartResult],
    save: Callable[[], None],
    address: str | None,
) -> None:
    try:
        import ray
    except ImportError:
        raise ImgpackError('--engine ray needs Ray: pip install "imgpack[ray]"') from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            address=address,
            ignore_reinit_error=True,
            log_to_driver=False,
            include_dashboard=False,
            configure_logging=False,
        )
    try:
        task = ray.remote(_pack_part)
        pending = {
            task.remote(writer, p, items, spec, on_error): (p, len(items))
            for p, items in parts
            if p not in done
        }
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            p, n = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                cause = exc.as_instanceof_cause()
                if isinstance(cause, ImgpackError):
                    raise ImgpackError(str(cause).splitlines()[0]) from None
                raise
            done[p] = PartResult(
                result["part"],
                [Shard(**s) for s in result["shards"]],
                result["skipped"],
                result.get("extra", {}),
            )
            save()
            bar.update(n)
    finally:
        if started_here:
            ray.shutdown()
