"""Every committed H100 replay of ProMoE's 4-bit plan (Granite-3B, a quarter of the experts on the GPU): how it was
enqueued, its mean token latency after warm-up, the board's mean power and SM clock over it, and where the replay
timed it (--dispatch-tokens: once per plan, after the first replay) the host's own time to enqueue a token on an
idle GPU.

    python validation/h100/promoe_modes.py

The replays of one plan run near 7.5 ms a token or, some of those enqueued through PyTorch, 8.4-11.8 ms
(validation/NOTES.md: ProMoE's slow replays)."""
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "regimes"


def promoe_q4_runs():
    """(folder, enqueue, ms per token, watts, SM MHz, host alone ms or None) per replay, first and repeats."""
    for path in sorted(ROOT.rglob("h100-pcie5.json")):
        data = json.loads(path.read_text())
        if "model.expert_bits=4" not in data.get("overrides", []):
            continue
        warm = data["warmup_tokens"]
        for case in data["cases"]:
            if case["policy"] != "promoe":
                continue
            alone = statistics.median(case["host_dispatch_ms"]) if case.get("host_dispatch_ms") else None
            runs = [case["latency_ms"], *case["repeat_latency_ms"]]
            energies = [case["energy"], *case["repeat_energy"]]
            for i, (latency, energy) in enumerate(zip(runs, energies)):
                yield (str(path.parent.relative_to(ROOT)), case["enqueue"], statistics.fmean(latency[warm:]),
                       energy["power_w"], energy["sm_clock_mhz"][0], alone if i == 0 else None)


def main() -> None:
    print(f"{'replays':<26} {'enqueue':<7} {'ms/token':>8} {'W':>7} {'SM MHz':>6} {'host alone ms':>13}")
    for folder, enqueue, ms, watts, mhz, alone in promoe_q4_runs():
        host = f"{alone:13.2f}" if alone is not None else ""
        print(f"{folder:<26} {enqueue:<7} {ms:>8.2f} {watts:>7.1f} {mhz:>6} {host}")


if __name__ == "__main__":
    main()
