"""The GPU validation: a policy's simulated decisions as an ordered action list (plan), replayed with real CUDA
copies and kernels on a GPU (harness, run, ops, triton_kernels, cudart), single-op and single-copy microbenchmarks
(microbench) and the config they calibrate (gpuconfig), the board's energy counter (nvml, energy_table), and the
comparison of simulated and measured runs that writes VALIDATION.md (compare, probe_tables, pcie_check).

The replay needs a CUDA torch (and nvidia-ml-py for energy: the `hwreplay` extra); plan, compare and gpuconfig run
anywhere. `chipsim run` never imports this package."""
