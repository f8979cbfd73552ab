"""Address mapping as data: how a memory controller splits a burst address into the channel, the standard's
levels, the row and the column, and which bank bits it hashes.

A mapping is an order of fields from the least significant: `channel`, a level name of the standard (below the
channel), `column`, `row`, or `column:N` (the low N columns, N dividing the row's columns; a later `column` takes
the rest). Every level, the channel, the row and the column appear once. The burst address is read in that mixed
radix: field k takes (address // the product of the sizes before it) % its size.

`xor` names levels (and `channel`), or `banks` for every level below the data level (`none`: no hash), whose index
is then XOR-ed with the row folded to the field's width
(row ^ row >> b ^ row >> 2b ...; b = log2 of the field's size, a power of two): the permutation-based interleaving
of Zhang, Zhu and Zhang (MICRO 2000), which production controllers use in the form of XORs of row bits into bank
and channel bits (Pessl et al., "DRAMA", USENIX Security 2016, reverse-engineered Intel's). Two streams whose rows
differ then meet in different banks instead of conflicting in the same ones.

Presets:
- `interleaved` (chipsim's default): the channel, the data-level node (pseudo-channel) and the bank group change
  fastest, then the column, then the bank, the other levels (rank, stack ID) and the row;
- `RoBaRaCoCh` (Ramulator 2.1's default): the channel, the column, the levels below the channel from the first
  (pseudo-channel, rank) to the bank, then the row;
- `MOP4CL` (Ramulator 2.1's MOP4CLXOR without its XOR): four columns, the levels below the channel, the rest of the
  column, the row.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.errors import InputError

PRESETS = ("interleaved", "RoBaRaCoCh", "MOP4CL")


@dataclass(frozen=True)
class Mapping:
    """A resolved mapping: the fields from the least significant with their sizes, and the fields to hash."""

    name: str
    fields: tuple[tuple[str, int], ...]  # (field, size) from the least significant; a split column appears twice
    xor: tuple[str, ...] = ()

    def decode(self, address: int) -> dict[str, int]:
        """The field values of a burst address (a split column put back together; hashed fields XOR-ed)."""
        value: dict[str, int] = {}
        scale: dict[str, int] = {}
        for name, size in self.fields:
            digit = address % size
            address //= size
            value[name] = value.get(name, 0) + digit * scale.get(name, 1)
            scale[name] = scale.get(name, 1) * size
        row = value["row"]
        for name in self.xor:
            value[name] ^= fold(row, scale[name])
        return value


def fold(row: int, size: int) -> int:
    """The row folded to a field of `size` values (a power of two): the XOR of its successive log2(size)-bit slices."""
    bits = size.bit_length() - 1
    if bits == 0:
        return 0
    out = 0
    while row:
        out ^= row & (size - 1)
        row >>= bits
    return out


def preset_order(name: str, levels: tuple[str, ...], data_level: int, where: str = "address_mapping") -> list[str]:
    """A preset's field order (from the least significant) for a standard's levels (the channel first)."""
    below = list(levels[1:])
    if name == "interleaved":
        fast = [lvl for lvl in below if lvl in (levels[data_level], "bankgroup") and lvl != levels[0]]
        slow = [lvl for lvl in reversed(below) if lvl not in fast and lvl != "bank"]
        return ["channel"] + fast + ["column", "bank"] + slow + ["row"]
    if name == "RoBaRaCoCh":
        return ["channel", "column"] + below + ["row"]
    if name == "MOP4CL":
        return ["channel", "column:4"] + below + ["column", "row"]
    raise InputError(f"{where}: '{name}' is not a preset (presets: {', '.join(PRESETS)}; or a comma-separated "
                     "field order)")


def resolve(spec: str, xor: str, levels: tuple[str, ...], data_level: int, sizes: dict[str, int],
            where: str = "address_mapping", where_xor: str = "address_xor") -> Mapping:
    """A mapping from its spelling: a preset name or a comma-separated field order, and `xor` a comma-separated
    list of fields to hash ('' for none). `sizes`: the channel's, every level's, the row's and the column's count."""
    order = preset_order(spec, levels, data_level, where) if "," not in spec else [f.strip() for f in spec.split(",")]
    names = ["channel", *levels[1:], "column", "row"]
    fields, seen = [], []
    column_left = sizes["column"]
    for field in order:
        name, _, part = field.partition(":")
        if name not in names:
            raise InputError(f"{where}: '{name}' is not a field of this standard ({', '.join(names)})")
        if part:
            if name != "column" or not part.isdigit() or int(part) < 1 or column_left % int(part):
                raise InputError(f"{where}: '{field}' must be column:N with N dividing the row's {sizes['column']} "
                                 "columns")
            fields.append((name, int(part)))
            column_left //= int(part)
            continue
        if name in seen:
            raise InputError(f"{where}: '{name}' appears twice")
        seen.append(name)
        fields.append((name, column_left if name == "column" else sizes[name]))
    missing = [n for n in names if n not in seen]
    if missing:
        raise InputError(f"{where}: the order leaves out {', '.join(missing)}")
    if xor.strip() == "banks":  # every bank-address level: those below the data level (stack ID, bank group, bank)
        xor = ",".join(levels[data_level + 1:])
    elif xor.strip() == "none":
        xor = ""
    hashed = tuple(f.strip() for f in xor.split(",") if f.strip())
    for name in hashed:
        if name not in names[:-2]:
            raise InputError(f"{where_xor}: '{name}' is not a level or the channel ({', '.join(names[:-2])})")
        if sizes[name] & (sizes[name] - 1):
            raise InputError(f"{where_xor}: '{name}' has {sizes[name]} values; hashing needs a power of two")
    return Mapping(spec, tuple(fields), hashed)
