"""The machine as the system model sees it: the config schema (config), the memories and links and the expert-fetch
path (paths), DRAM bandwidth and latency in closed form or from the command-level calibration (dram_formula), the
PCIe link layer (pcie_link), and an operation's time and actions on the arrays in closed form (compute_formula)."""
