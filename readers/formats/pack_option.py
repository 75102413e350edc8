"""A format's pack option as data: its name, its type and its help, declared in the format's
``Format`` (``pack_options=``). The ``pack`` CLI makes one flag of each (``shard_size`` ->
``--shard-size``), ``PackSpec`` parses and checks the values with ``parse``, before the output is
touched. A leaf: it imports nothing of imgpack but the errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from readers.errors import OptionError

SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
# count: a whole number >= 1; size: bytes, a number or text like 512MB / 1GiB; choice: one of choices.
OptionKind = Literal["count", "size", "choice"]


def parse_size(text: str | int | None) -> int | None:
    """'512MB' -> 512_000_000; '1GiB' -> 1_073_741_824; plain numbers are bytes."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in SIZE_UNITS:
        raise OptionError(f"{text!r} is not a size like 512MB or 1GiB")
    try:
        return int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])
    except ValueError:
        raise OptionError(f"{text!r} is not a size like 512MB or 1GiB") from None


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class PackOption:
    name: str  # the keyword (pack_folder(options={name: ...}), PackSpec.options)
    kind: OptionKind
    help: str  # the CLI flag's help text
    choices: tuple[str, ...] = ()  # kind "choice" only

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise OptionError(f"pack option {self.name!r}: the name must be a Python identifier")
        if (self.kind == "choice") != bool(self.choices):
            raise OptionError(f"pack option {self.name!r}: choices go with kind 'choice' (and only with it)")

    @property
    def flag(self) -> str:
        return option_flag(self.name)

    def parse(self, value: Any) -> int | str:
        """``value`` (as typed on a command line or given from Python) as this option's type;
        an ``OptionError`` naming the flag and what to pass instead."""
        if self.kind == "choice":
            if value not in self.choices:
                raise OptionError(f"{self.flag} {value}: use one of {', '.join(self.choices)}")
            return str(value)
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise OptionError(f"{self.flag} {value!r}: give a whole number")
        if self.kind == "size":
            try:
                number = parse_size(value)
            except OptionError as exc:
                raise OptionError(f"{self.flag}: {exc}") from None
        else:
            number = int(value) if isinstance(value, int) or value.strip().isdigit() else None
        if number is None or number < 1:
            raise OptionError(f"{self.flag} {value!r}: give a whole number of 1 or more")
        return number


SHARDS = PackOption("shards", "count", "Split the source into N parts of ceil(files/N) source files each.")
SAMPLES_PER_SHARD = PackOption(
    "samples_per_shard", "count", "N kept samples a part (the last holds the rest), whatever is skipped."
)
SHARD_SIZE = PackOption("shard_size", "size", "Roll over to a new shard at this size, e.g. 512MB.")
