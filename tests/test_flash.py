"""A flash device as the expert store (chipsim/hw/flash.py) and the phone that streams its experts from UFS 4.0 into
LPDDR5X (hwconfigs/phone-ufs.yaml), checked by hand: the device's long-read rate at a shallow and a deep queue, a
fetch's end on an idle path, the ledger's charges, the roles a flash memory may play and its bad input."""

import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from chipsim import cli
from chipsim.errors import InputError
from chipsim.hw.config import load_config
from chipsim.hw.flash import flash_timing
from chipsim.hw.paths import components, fetch_components, fetch_path_timing, package_link
from chipsim.runner import prepare, simulate, summarize_result
from chipsim.sim.energy import EnergyTable
from chipsim.sim.observe import Observer
from chipsim.units import PS_PER_S, ns_to_ps

PHONE = os.path.join(ROOT, "hwconfigs", "phone-ufs.yaml")
# the phone's UFS 4.0 device as its config gives it (numbers repeated here, so a change to the config shows)
IO, PAGE, TR_US, OVERHEAD_US, INTERNAL, INTERFACE = 1 << 20, 16384, 50, 10, 4.2, 2 * 23.32 * 0.8 / 8


def test_a_long_read_at_queue_depth_one_runs_one_command_at_a_time():
    """One command in flight: io_bytes every overhead + tR + io_bytes / internal rate (309.7 us for 1 MiB),
    3.39 GB/s, below the NAND's 4.2 and the interface's 4.664; the first byte after overhead + tR + one page
    over the interface."""
    hw = load_config(PHONE, ["memory.ufs.queue_depth=1"]).hw
    command_ns = (OVERHEAD_US + TR_US) * 1000 + IO / INTERNAL
    assert command_ns == pytest.approx(309_661.0, abs=0.1)
    ufs = components(hw)["ufs"]
    assert ufs.gbps == pytest.approx(IO / command_ns, rel=1e-12) and ufs.gbps == pytest.approx(3.3862, abs=1e-4)
    assert ufs.latency_ns == pytest.approx((OVERHEAD_US + TR_US) * 1000 + PAGE / INTERFACE, rel=1e-12)
    assert (ufs.turnaround, ufs.shared_gbps, ufs.in_package) == (0.0, 0.0, False)
    assert flash_timing(hw.memory["ufs"]).limit == "queue"


@pytest.mark.parametrize("depth", [2, 32])
def test_a_deep_queue_reaches_the_slower_of_the_nand_and_the_interface(depth):
    """Two 1 MiB commands in flight already ask 6.8 GB/s: the NAND's 4.2 GB/s limits; with a faster NAND, the
    interface's 4.664 (2 lanes x 23.32 Gb/s x 8/10)."""
    hw = load_config(PHONE, [f"memory.ufs.queue_depth={depth}"]).hw
    assert components(hw)["ufs"].gbps == INTERNAL and flash_timing(hw.memory["ufs"]).limit == "internal"
    hw = load_config(PHONE, [f"memory.ufs.queue_depth={depth}", "memory.ufs.internal_gbps=6.0"]).hw
    assert components(hw)["ufs"].gbps == pytest.approx(INTERFACE, rel=1e-12)
    assert flash_timing(hw.memory["ufs"]).limit == "interface"


def test_the_phone_fetches_from_the_flash_over_the_ufs_link_into_lpddr5x():
    hw = load_config(PHONE).hw
    assert fetch_components(hw) == ("ufs", "mphy", "lpddr5x")
    assert package_link(hw) == "mphy"
    path = fetch_path_timing(hw)
    comps = components(hw)
    assert path.bottleneck == "ufs" and path.bandwidth_gbps == INTERNAL
    assert comps["mphy"].gbps == pytest.approx(INTERFACE * 1144 / 1152, rel=1e-12)  # UniPro v2.0 frames
    assert path.latency_ns == pytest.approx(comps["ufs"].latency_ns + 200 + comps["lpddr5x"].latency_ns, rel=1e-12)


class _Fetches(Observer):
    """Each fetch's (issue, landing) time, ps."""

    def __init__(self):
        self.fetches = []

    def landed(self, layer, expert, demand, issue_ps, end_ps):
        self.fetches.append((issue_ps, end_ps))


def test_an_expert_fetch_on_the_idle_phone_ends_at_setup_plus_first_byte_plus_bytes_over_the_flash_rate():
    """The first fetch of the run finds the path idle: it lands setup + (flash first byte + UFS link + LPDDR5X
    first byte) + N / 4.2 GB/s after it was issued, N = one Granite-3B expert at BF16."""
    prep = prepare(PHONE, ["workload.max_tokens=1"], ["no-prefetch"])
    hw, n = prep.config.hw, prep.workload.expert_bytes
    watch = _Fetches()
    simulate(prep, prep.policies[0], observers=[watch])
    issue, end = min(watch.fetches)
    first_byte_ns = (OVERHEAD_US + TR_US) * 1000 + PAGE / INTERFACE
    latency_ns = first_byte_ns + 200 + components(hw)["lpddr5x"].latency_ns
    assert fetch_path_timing(hw).latency_ns == pytest.approx(latency_ns, rel=1e-12)
    by_hand = ns_to_ps(5000) + ns_to_ps(fetch_path_timing(hw).latency_ns) + -(-n * PS_PER_S // 4_200_000_000)
    assert end - issue == by_hand
    assert (end - issue) / 1e6 == pytest.approx(5 + 63.513 + 0.2 + n / 4.2e3, abs=0.1)  # us


def test_the_ledger_charges_the_flash_per_bit_read_and_its_idle_power_over_the_token():
    """Every fetched byte is read from the flash (52 pJ/bit), crosses the UFS link (2 pJ per wire bit, 1152 wire
    bytes per 1144) and is written into LPDDR5X; the flash draws its 0.05 W idle power over the whole token. Both
    are off-chip I/O (nothing is in a package), their static power idle/leakage."""
    prep = prepare(PHONE, ["workload.max_tokens=3"], ["no-prefetch"])
    result = simulate(prep, prep.policies[0])
    tok = result.per_token
    row = summarize_result(prep, result, prep.policies[0])
    by = row["energy_by_component_mj"]
    read = tok.bytes["ufs"].mean()
    assert read == tok.bytes["mphy"].mean() > 0
    assert by["ufs"] == pytest.approx(read * 8 * 52 / 1e9, rel=1e-9)
    assert by["mphy"] == pytest.approx(read * 8 * 2.0 * 1152 / 1144 / 1e9, rel=1e-9)
    assert by["static_ufs"] == pytest.approx(tok.latency_ps.mean() * 0.05 / 1e9, rel=1e-9)
    table = EnergyTable.from_config(prep.config.hw)
    assert table.category_of["ufs"] == table.category_of["mphy"] == "offchip_io"
    assert table.category_of["static_ufs"] == "idle_leakage"
    assert row["expert_link"] == "mphy" and row["expert_link_bytes_per_token"] == read


RENAMED = {"lpddr5x": "dram", "ufs": "nand", "mphy": "ufs_link"}


def _renamed_phone(tmp_path) -> str:
    cfg = load_config(PHONE)
    data = dict(cfg.raw)
    for section in ("memory", "links"):
        data[section] = {RENAMED[k]: v for k, v in data[section].items()}
    data["roles"] = {key: ([RENAMED[n] for n in value] if isinstance(value, list) else RENAMED.get(value, value))
                     for key, value in data["roles"].items()}
    data["workload"] = dict(data["workload"], trace=cfg.trace_path)
    out = tmp_path / "renamed.yaml"
    out.write_text(yaml.safe_dump(data))
    return str(out)


def _entry(name: str) -> str:
    return f"static_{RENAMED[name[7:]]}" if name.startswith("static_") and name[7:] in RENAMED else \
        RENAMED.get(name, name)


def test_renaming_the_phones_flash_link_and_dram_changes_no_result(tmp_path):
    renamed = _renamed_phone(tmp_path)
    overrides, specs = ["workload.max_tokens=24"], ["no-prefetch", "apex", "lru"]
    before, after = prepare(PHONE, overrides, specs), prepare(renamed, overrides, specs)
    assert list(components(after.config.hw)) == [RENAMED[n] for n in components(before.config.hw)]
    for p_before, p_after in zip(before.policies, after.policies):
        row = summarize_result(before, simulate(before, p_before), p_before)
        new = summarize_result(after, simulate(after, p_after), p_after)
        by, new_by = row.pop("energy_by_component_mj"), new.pop("energy_by_component_mj")
        assert new.pop("expert_link") == RENAMED[row.pop("expert_link")]
        assert new_by == {_entry(k): v for k, v in by.items()}
        assert new == row


@pytest.mark.parametrize("overrides, message", [
    (["roles.operand_memory=ufs"], "roles.operand_memory: 'ufs' is a flash memory; a flash memory can only be "
                                   "roles.expert_store"),
    (["roles.host_memory=ufs"], "roles.host_memory: 'ufs' is a flash memory"),
    (["roles.expert_staging=ufs"], "roles.expert_staging: 'ufs' is a flash memory"),
    (["memory.ufs.channels=4"], "memory.ufs: has a DRAM's keys (channels) and a flash device's (interface_gbps, "
                                "internal_gbps, page_read_us, io_bytes, ...); a memory is one or the other"),
    (["memory.ufs.io_bytes=20000"], "memory.ufs.io_bytes: 20000 B is not a whole number of pages of 16384 B "
                                    "(memory.ufs.page_bytes)"),
    (["memory.ufs.io_bytes=4096"], "memory.ufs.io_bytes: 4096 B is smaller than one page (memory.ufs.page_bytes "
                                   "16384)"),
    (["memory.ufs.queue_depth=0"], "memory.ufs.queue_depth: must be positive"),
    (["memory.ufs.page_read_us=0"], "memory.ufs.page_read_us: must be positive"),
    (["memory.ufs.queue_depth=2.5"], "memory.ufs.queue_depth: expected an integer"),
])
def test_a_bad_flash_memory_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(InputError) as exc:
        load_config(PHONE, overrides)
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("setting, key", [("memory.ufs.queue_depth=0", "memory.ufs.queue_depth"),
                                          ("memory.ufs.io_bytes=24576", "memory.ufs.io_bytes"),
                                          ("roles.operand_memory=ufs", "roles.operand_memory")])
def test_chipsim_check_refuses_a_bad_flash_memory_in_one_line_with_exit_2(setting, key):
    proc = subprocess.run([sys.executable, "-m", "chipsim.cli", "check", PHONE, "--set", setting],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"chipsim: error: {key}: ")


def test_chipsim_keys_and_check_show_the_flash(capsys):
    assert cli.main(["keys"]) == 0
    out = capsys.readouterr().out
    for key in ("memory.<flash>.queue_depth", "memory.<flash>.page_read_us", "memory.<flash>.io_bytes"):
        assert key in out
    assert cli.main(["check", PHONE]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.strip().startswith("experts   stored in ufs (238 GiB, off package), fetched over mphy into "
                                       "lpddr5x (buffer 192 MiB); expert link mphy") for line in out)
    memory = next(line for line in out if line.startswith("memory:"))
    assert ("ufs flash: long reads 4.20 GB/s = min(interface 4.664, NAND 4.2, 32 reads of 1024 KiB in flight / 309.7 "
            "us each = 108): internal-bound, first byte 63.5 us") in memory
