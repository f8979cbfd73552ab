"""Memories and links as data: a new tier on the fetch path is a YAML change (hwconfigs/thor-cxl.yaml), checked
by hand like the built-in path; the arrays' SRAM is a shared resource when experts are staged there."""

from pathlib import Path

import pytest
import yaml
from conftest import IN_PLACE, tiny_shape

from chipsim import cli
from chipsim.errors import InputError
from chipsim.hw.config import load_config
from chipsim.hw.paths import components, fetch_components, fetch_path_timing, package_link
from chipsim.runner import prepare, simulate, summarize_result
from chipsim.sim.energy import EnergyTable
from chipsim.sim.engine import Simulation
from chipsim.sim.work import cost_of
from chipsim.units import PS_PER_S, gbps_to_bytes_per_s, ns_to_ps

ROOT = Path(__file__).resolve().parents[1]
THOR = str(ROOT / "hwconfigs" / "thor.yaml")
CXL = str(ROOT / "hwconfigs" / "thor-cxl.yaml")
TINY = tiny_shape()


def cxl_yaml() -> str:
    """thor-cxl.yaml's new tier, link and path as a config section (the tiny configs start from thor.yaml)."""
    data = yaml.safe_load(open(CXL))
    return yaml.safe_dump({k: data[k] for k in ("memory", "links", "paths")}) + "expert_buffer:\n  capacity_mib: 4\n"


def test_the_cxl_config_adds_a_memory_and_a_link_and_routes_fetches_over_them():
    hw = load_config(CXL).hw
    comps = components(hw)
    assert list(comps) == ["lpddr5x", "pcie", "ucie", "hbm", "cxl_ddr5", "cxl"]
    assert fetch_components(hw) == ("cxl_ddr5", "cxl", "ucie", "hbm")
    assert package_link(hw) == "cxl"
    path = fetch_path_timing(hw)
    # CXL x8 at 64 GT/s: 59 GB/s after FLITs, 64 B of data per 80 B -> 47.2 GB/s; the DDR5 side 4 x 4 B x 6.4 GT/s
    assert path.bottleneck == "cxl" and path.bandwidth_gbps == pytest.approx(59 * 64 / 80)
    assert comps["cxl_ddr5"].gbps < 4 * 4 * 6.4 and comps["cxl_ddr5"].gbps > path.bandwidth_gbps
    ddr5 = hw.memory["cxl_ddr5"]
    first_byte = ddr5.trcd_ns + ddr5.tcl_ns + 16 / 6400 * 1e3  # tRCD + CL + one BL16 burst
    assert comps["cxl_ddr5"].latency_ns == pytest.approx(first_byte)
    assert path.latency_ns == pytest.approx(first_byte + 200 + hw.links["ucie"].latency_ns + comps["hbm"].latency_ns)


def test_a_fetch_over_the_cxl_tier_takes_the_hand_computed_time_and_charges_its_components(tiny):
    """No-prefetch on the tiny model with thor-cxl's path: each layer's two experts are fetched together over the
    CXL link (the bottleneck), so a token takes the same hand sum as over PCIe with the CXL path's bandwidth and
    latency; the bytes cross the expander and the CXL link, not LPDDR5X or PCIe, and are charged at their energy
    per bit (the link's per wire bit: each 64 B with its 16 B header slot), their static power over the token."""
    cfg = tiny.config(tiny.routing(), extra_yaml=cxl_yaml())
    prep = prepare(cfg, policy_specs=["no-prefetch"])
    wl, hw = prep.workload, prep.config.hw
    path = fetch_path_timing(hw)
    assert path.bottleneck == "cxl"
    bandwidth = gbps_to_bytes_per_s(path.bandwidth_gbps)
    fetch_ps = ns_to_ps(hw.dma.setup_ns) + -(-2 * wl.expert_bytes * PS_PER_S // bandwidth) + ns_to_ps(path.latency_ns)
    expected = wl.token_head.duration_ps + sum(
        c.attention.duration_ps + c.router.duration_ps + fetch_ps + 2 * c.expert.duration_ps + c.combine.duration_ps
        for c in wl.layers)
    result = simulate(prep, prep.policies[0])
    tok = result.per_token
    assert (tok.latency_ps == expected).all()
    fetched = 3 * TINY.top_k * wl.expert_bytes
    assert (tok.bytes["cxl_ddr5"] == fetched).all() and (tok.bytes["cxl"] == fetched).all()
    assert (tok.bytes["lpddr5x"] == 0).all() and (tok.bytes["pcie"] == 0).all()
    row = summarize_result(prep, result, prep.policies[0])
    by = row["energy_by_component_mj"]
    assert by["cxl"] == pytest.approx(fetched * 8 * 5.0 * (64 + 16) / 64 / 1e9, rel=1e-12)  # per wire bit: 16 B a 64
    assert by["cxl_ddr5"] == pytest.approx(fetched * 8 * 3.0 / 1e9, rel=1e-12)
    assert by["static_cxl"] == pytest.approx(expected * 0.75 / 1e9, rel=1e-12)
    assert by["static_cxl_ddr5"] == pytest.approx(expected * 2.0 / 1e9, rel=1e-12)
    table = EnergyTable.from_config(hw)
    assert table.category_of["cxl"] == table.category_of["cxl_ddr5"] == "offchip_io"
    offchip = sum(v for c, v in by.items() if table.category_of[c] == "offchip_io")
    assert row["energy_offchip_io_mj"] == pytest.approx(offchip, rel=1e-12)
    assert row["offchip_bytes_per_token"] == fetched  # the link into the package is now CXL
    assert row["pcie_utilization"] == pytest.approx(fetched / (expected * 1e-12 * bandwidth), rel=1e-9)


@pytest.mark.parametrize("overrides, message", [
    (["paths.fetch=[lpddr5x, nvlink, ucie]"], "paths.fetch: 'nvlink' is neither a memory"),
    (["paths.fetch=[pcie, ucie]"], "paths.fetch: must start with the memory that stores the experts"),
    (["paths.fetch=[hbm, pcie, ucie]"], "paths.fetch: must start with the memory that stores the experts (not hbm)"),
    (["paths.fetch=[lpddr5x, pcie]"], "paths.fetch: must end with a link into the package, then ucie"),
    (["paths.fetch=[lpddr5x, ucie]"], "paths.fetch: must end with a link into the package, then ucie"),
    (["paths.fetch=[lpddr5x, pcie, pcie, ucie]"], "crosses a component twice"),
    (["paths.fetch=[cxl_ddr5, lpddr5x, cxl, ucie]"], "paths.fetch: 'lpddr5x' is a memory"),
    (["memory.extra.pcie.channels=4"], "memory.extra.pcie: the name is taken"),
    (["links.extra.Cxl-2.latency_ns=4"], "links.extra.Cxl-2: a name is lower-case letters"),
    (["memory.extra.cxl_ddr5.tlp_overhead_bytes=4"], "memory.extra.cxl_ddr5.tlp_overhead_bytes: unknown key"),
    (["links.extra.cxl.bandwidth_gbps=-1"], "links.extra.cxl.bandwidth_gbps: must be positive"),
    (["memory.extra.cxl_ddr5.trfc_ns=5000"], "memory.extra.cxl_ddr5.trfc_ns: refresh time must be shorter"),
    (["links.pcie.modules=4"], "links.pcie: has a serial link's keys (bandwidth_gbps, max_payload_bytes, "
                               "tlp_overhead_bytes) and a die-to-die link's (modules); a link is one or the other"),
    (["links={}", "paths.fetch=[cxl_ddr5]"], "roles.operand_link: not given, and the default 'ucie' is not a link "
                                             "of this machine (links: none)"),
    (["roles.fetch_links=[cxl, ucie]"], "paths.fetch: give roles.expert_store and roles.fetch_links, or paths.fetch, "
                                        "not both"),
    (["roles.expert_staging=lpddr5x"], "roles.expert_staging: 'lpddr5x' is neither the operand memory ('hbm'), sram "
                                       "nor in-place"),
    (["roles.in_package=[hbm, nvlink]"], "roles.in_package: 'nvlink' is neither a memory"),
    (["memory.sram.channels=4"], "memory.sram: the name is reserved"),
    (["paths.fetch=[cxl_ddr5, cxl, ucie]", "roles.in_package=[hbm, cxl, ucie]"],
     "paths.fetch: the experts' store 'cxl_ddr5' is outside the package, so a fetch crosses a link outside it"),
    (["roles.in_package=[hbm, cxl]"], "paths.fetch: 'ucie' is outside the package (roles.in_package) but comes "
                                      "after 'cxl', inside it; a fetch enters the package once"),
    (["roles.in_package=[hbm]", "roles.operand_link=cxl"],
     "paths.fetch: must end with a link into the package, then cxl"),
])
def test_a_bad_path_or_component_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(InputError) as exc:
        load_config(CXL, overrides)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_experts_store_must_hold_every_expert_and_the_message_names_its_key():
    with pytest.raises(InputError) as exc:
        prepare(CXL, ["memory.extra.cxl_ddr5.capacity_gib=1"], ["no-prefetch"])
    assert str(exc.value).startswith("memory.extra.cxl_ddr5.capacity_gib: 1.0 GiB cannot hold")


def test_chipsim_keys_documents_the_named_sections_and_the_path(capsys):
    assert cli.main(["keys"]) == 0
    out = capsys.readouterr().out
    for key in ("memory.<name>.channels", "links.<serial link>.bandwidth_gbps", "links.<die-to-die link>.gtps",
                "paths.fetch", "roles.operand_memory", "roles.fetch_links", "roles.in_package"):
        assert key in out


RENAMED = {"hbm": "stack", "lpddr5x": "host_dram", "pcie": "host_link", "ucie": "d2d", "cxl_ddr5": "expander",
           "cxl": "fabric"}


def _renamed_config(tmp_path, source: str) -> str:
    """`source` written out whole with every memory and link renamed (memory.extra / links.extra read as the
    others) and a roles section saying which is which."""
    cfg = load_config(source)
    data = dict(cfg.raw)
    for section in ("memory", "links"):
        named = {k: v for k, v in data[section].items() if k != "extra"}
        named.update(data[section].get("extra", {}))
        data[section] = {RENAMED[k]: v for k, v in named.items()}
    path = [RENAMED[c] for c in data.pop("paths", {}).get("fetch", ["lpddr5x", "pcie", "ucie"])]
    data["roles"] = {"operand_memory": "stack", "operand_link": "d2d", "expert_store": path[0],
                     "fetch_links": path[1:], "host_memory": "host_dram", "host_link": "host_link"}
    data["workload"] = dict(data["workload"], trace=cfg.trace_path)
    out = tmp_path / "renamed.yaml"
    out.write_text(yaml.safe_dump(data))
    return str(out)


def _renamed_entry(entry: str) -> str:
    """An energy breakdown entry under the renamed components: 'hbm' -> 'stack', 'static_hbm' -> 'static_stack'."""
    static, _, name = entry.rpartition("static_")
    return f"{static}static_{RENAMED[name]}" if _ == "static_" and name in RENAMED else RENAMED.get(entry, entry)


@pytest.mark.parametrize("source", [THOR, CXL], ids=["thor", "thor-cxl"])
def test_renaming_every_component_changes_no_result(tmp_path, source):
    """The engine, the ledger and the metrics read roles, not names: thor (and thor-cxl) with every memory and
    link renamed give the same numbers, every component's energy under its new name."""
    renamed = _renamed_config(tmp_path, source)
    overrides = ["workload.max_tokens=48"]
    specs = ["no-prefetch", "apex", "spice", "lru"]
    before, after = prepare(source, overrides, specs), prepare(renamed, overrides, specs)
    assert list(components(after.config.hw)) == [RENAMED[n] for n in components(before.config.hw)]
    for p_before, p_after in zip(before.policies, after.policies):
        row = summarize_result(before, simulate(before, p_before), p_before)
        new = summarize_result(after, simulate(after, p_after), p_after)
        by_component = row.pop("energy_by_component_mj")
        new_by_component = new.pop("energy_by_component_mj")
        assert new.pop("expert_link") == RENAMED[row.pop("expert_link")]
        assert new_by_component == {_renamed_entry(k): v for k, v in by_component.items()}
        assert new == row


def test_an_expert_read_from_sram_shares_it_with_a_fetch_landing_there(tiny):
    """Experts staged in SRAM of total bandwidth S = 2P (P: the PCIe data rate): a fetch (no setup) starts at 0
    at P, the arrays start reading 3 experts from SRAM after their fixed time F. While both run each gets P (the
    fetch is held to P by PCIe, the stream gets the rest of S); once the fetch's data is through the stream runs
    at S. So the stream ends at N_f/P + (N_s - (N_f - F·P)) / S instead of F + N_s / S alone."""
    cfg = tiny.config(tiny.routing())
    hw0 = load_config(cfg).hw
    p_gbps = hw0.links["pcie"].data_gbps
    overrides = ["expert_buffer.location=sram", "compute.sram_mib_per_array=64", "dma.setup_ns=0",
                 f"compute.sram_read_gbps_per_array={2 * p_gbps / hw0.compute.arrays!r}"]
    prep = prepare(cfg, overrides=overrides, policy_specs=["no-prefetch"])

    def run(with_fetch: bool) -> tuple[int, int, int]:
        sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0])
        work = sim._layer_costs()[0].expert.times(3)
        ends = {}

        def proc():
            if with_fetch:
                sim.context.prefetch(0, 0)
            yield from sim._compute(work, "experts", 0, 3, [0, 1, 2])
            ends["stream"] = sim.env.now

        sim.env.process(proc())
        sim.env.run()
        return ends["stream"], work.fixed, work.sram_bytes

    alone, fixed, n_s = run(False)
    shared, _, _ = run(True)
    P = gbps_to_bytes_per_s(p_gbps)
    R = -(-n_s * PS_PER_S // (alone - fixed))  # the stream's own rate (its cap): S or, with SFU work, a little less
    assert P < R <= 2 * P
    n_f = prep.workload.expert_bytes
    assert n_s > n_f and fixed * P < n_f * PS_PER_S  # the stream outlasts the fetch, which is still moving at F
    expected = n_f * PS_PER_S / P + (n_s - (n_f - fixed * P / PS_PER_S)) * PS_PER_S / R
    assert shared == pytest.approx(expected, abs=3)
    assert shared - alone > 0.3 * (n_f * PS_PER_S / R)  # a real slow-down, not rounding


def test_the_results_name_the_expert_link_and_keep_the_old_names_as_aliases():
    """thor-cxl brings experts in over its CXL link: the expert link's bytes and energy are the cxl component's;
    energy_pcie_mj stays the PCIe (host) link's, as before roles."""
    prep = prepare(CXL, ["workload.max_tokens=8"], ["no-prefetch"])
    row = summarize_result(prep, simulate(prep, prep.policies[0]), prep.policies[0])
    by_component = row["energy_by_component_mj"]
    assert row["expert_link"] == "cxl" and row["energy_expert_link_mj"] == by_component["cxl"] > 0
    assert row["energy_pcie_mj"] == by_component["pcie"] < row["energy_expert_link_mj"]
    assert row["expert_link_bytes_per_token"] == row["offchip_bytes_per_token"] > 0
    assert row["expert_link_utilization"] == row["pcie_utilization"] > 0


def test_run_and_check_print_the_machine_one_line_per_role(capsys):
    assert cli.main(["check", CXL, "--policy", "apex"]) == 0
    out = capsys.readouterr().out.splitlines()
    machine = out[out.index(next(line for line in out if line.startswith("machine:"))):][:4]
    assert [line.split()[0 if i else 1] for i, line in enumerate(machine)] == ["compute", "operands", "experts",
                                                                               "host"]
    assert "operands  hbm (2 GiB, in package), read over ucie (in package)" in machine[1]
    assert ("experts   stored in cxl_ddr5 (256 GiB, off package), fetched over cxl -> ucie into hbm (buffer 192 MiB); "
            "expert link cxl") in machine[2]
    assert "reads lpddr5x, activations over pcie" in machine[3]
    assert out[-1] == "check:  ok (1 policy: apex); nothing simulated"


def test_check_refuses_a_role_no_component_fills_in_one_line(tmp_path, capsys):
    assert cli.main(["check", THOR, "--set", "roles.operand_link=nvlink"]) == 2
    assert capsys.readouterr().err == ("chipsim: error: roles.operand_link: 'nvlink' is not a link of this machine "
                                       "(links: pcie, ucie)\n")
    renamed = _renamed_config(tmp_path, THOR)
    data = yaml.safe_load(open(renamed))
    del data["roles"]  # renamed components, and no word on which is which: thor's names are not there
    Path(renamed).write_text(yaml.safe_dump(data))
    assert cli.main(["check", renamed]) == 2
    assert capsys.readouterr().err == ("chipsim: error: roles.operand_memory: not given, and the default 'hbm' is not "
                                       "a memory of this machine (memories: host_dram, stack)\n")


def test_experts_read_in_place_never_wait_and_a_token_is_the_sum_of_its_work(tiny):
    """One unified memory, the experts read where they are stored: nothing is fetched, no policy stalls, and with
    every operation alone on the memory a token lasts exactly the sum of its work: the head, then per layer
    attention and router, and one batch of the shared FFN, the top-k experts and the weighted sum."""
    cfg = tiny.config(tiny.routing(), extra_yaml=IN_PLACE)
    prep = prepare(cfg, ["dma.setup_ns=0"], ["no-prefetch", "apex", "lru", "spice"])
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0])
    costs = sim._layer_costs()
    k = prep.workload.model.top_k
    by_hand = sim._launched(cost_of(prep.workload.token_head)).ps + sum(
        c.pre.ps + (c.dense + c.expert.times(k) + c.combine).ps for c in costs)
    for policy in prep.policies:
        result = simulate(prep, policy)
        row = summarize_result(prep, result, policy)
        assert (row["stall_ms_per_token"], row["fetches_total"], row["overlap"]) == (0.0, 0, 1.0)
        assert row["host_experts_per_token"] == row["surrogate_experts_per_token"] == 0  # no miss, even for SPICE
        assert row["expert_link"] == "" and row["expert_link_bytes_per_token"] == row["energy_expert_link_mj"] == 0
        assert set(result.per_token.latency_ps.tolist()) == {by_hand}
        assert row["energy_by_component_mj"]["ucie"] == 0 and row["energy_by_component_mj"]["lpddr5x"] > 0


def test_in_place_needs_the_experts_in_the_operand_memory_and_no_fetch_link(tiny):
    cfg = tiny.config(tiny.routing(), extra_yaml=IN_PLACE)
    with pytest.raises(InputError, match=r"^roles.expert_staging: in-place reads the experts from the operand memory "
                                         r"\('lpddr5x'\), but roles.expert_store is 'hbm'$"):
        load_config(cfg, ["roles.expert_store=hbm"])
    with pytest.raises(InputError, match=r"^roles.fetch_links: experts read in place .* cross no link$"):
        load_config(cfg, ["roles.fetch_links=[pcie]"])


def test_a_link_named_like_the_operand_links_inner_resources_changes_nothing(tmp_path):
    """The operand link is two resources of the flow network (fetch side, operand side); a component named as
    they would be with an underscore is another component, and thor with an unused one runs thor's tokens."""
    extra = tmp_path / "extra.yaml"
    extra.write_text(f"base: {THOR}\nlinks:\n  ucie_io: {{bandwidth_gbps: 1, max_payload_bytes: 256, "
                     "tlp_overhead_bytes: 12, latency_ns: 1000, energy_pj_per_bit: 1, static_power_w: 0}\n")
    overrides = ["workload.max_tokens=16"]
    thor, more = prepare(THOR, overrides, ["no-prefetch"]), prepare(str(extra), overrides, ["no-prefetch"])
    assert (simulate(thor, thor.policies[0]).per_token.latency_ps.tolist()
            == simulate(more, more.policies[0]).per_token.latency_ps.tolist())
