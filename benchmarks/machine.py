"""The machine a benchmark ran on, in one line: wall times on this shared 2-core VM have differed by up to 4x
between sessions (different processors behind the same kind of machine), so every figure names its machine."""

import os


def describe() -> str:
    """e.g. "AMD EPYC (family 26 model 2), 2 cores"; what /proc/cpuinfo says of the first core."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first core's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return f"unknown processor, {os.cpu_count()} cores"
    name = fields.get("model name", "unknown processor")
    return f"{name} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')}), {os.cpu_count()} cores"
