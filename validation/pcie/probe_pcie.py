"""Read the PCIe protocol settings of the GPU's link from PCI config space (the device machine, no root needed
for the first 256 bytes): max payload size and max read request size in force (DevCtl), 10-bit tags, the read
completion boundary (LnkCtl), of the GPU and of the port above it; and the negotiated link.

    python validation/pcie/probe_pcie.py > validation/pcie/h200-host-pcie.json
"""

import glob
import json
import os
import struct
import subprocess


def pcie_capability(path: str) -> dict:
    if not os.path.exists(os.path.join(path, "config")):
        return {"error": f"{path}: no config space (a root bus: the port above is not visible, e.g. in a VM)"}
    with open(os.path.join(path, "config"), "rb") as f:
        cfg = f.read()
    ptr = cfg[0x34] if len(cfg) > 0x34 else 0
    while ptr and ptr < len(cfg) - 0x2C:
        cap_id, nxt = cfg[ptr], cfg[ptr + 1]
        if cap_id == 0x10:  # PCI Express capability
            devcap, = struct.unpack_from("<I", cfg, ptr + 0x04)
            devctl, = struct.unpack_from("<H", cfg, ptr + 0x08)
            lnkcap, = struct.unpack_from("<I", cfg, ptr + 0x0C)
            lnkctl, lnksta = struct.unpack_from("<HH", cfg, ptr + 0x10)
            devcap2, = struct.unpack_from("<I", cfg, ptr + 0x24)
            devctl2, = struct.unpack_from("<H", cfg, ptr + 0x28)
            return {"mps_supported_bytes": 128 << (devcap & 7), "mps_bytes": 128 << ((devctl >> 5) & 7),
                    "mrrs_bytes": 128 << ((devctl >> 12) & 7), "extended_tags_enabled": bool(devctl & 1 << 8),
                    "tag10_completer_supported": bool(devcap2 & 1 << 16),
                    "tag10_requester_supported": bool(devcap2 & 1 << 17), "tag10_requester_enabled": bool(devctl2 & 1 << 12),
                    "rcb_bytes": 128 if lnkctl & 1 << 3 else 64, "link_speed_code": lnksta & 0xF,
                    "link_width": (lnksta >> 4) & 0x3F, "max_speed_code": lnkcap & 0xF, "max_width": (lnkcap >> 4) & 0x3F}
        ptr = nxt
    return {"error": f"no PCIe capability in {len(cfg)} readable bytes"}


out = {}
for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
    if open(os.path.join(dev, "vendor")).read().strip() != "0x10de":
        continue
    real = os.path.realpath(dev)
    out[os.path.basename(dev)] = {"gpu": pcie_capability(real), "upstream_port": os.path.basename(os.path.dirname(real)),
                                  "upstream": pcie_capability(os.path.dirname(real))}
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,pcie.link.gen.current,pcie.link.width.current",
                      "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"nvidia_smi": smi, "functions": out}, indent=1))
