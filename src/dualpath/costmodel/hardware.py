"""Hardware presets (shared by the simulator and the runtime's emulated rates) (docs/hardware.md; GB = 1e9 bytes, Gbps line rate / 8 = GB/s).

A node is 8 GPUs, each paired with its own compute NIC (CNIC), plus one storage NIC (SNIC) and a
host-DRAM buffer (docs/paper.md §1.2, §5). Every number names its source.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    fp8_flops_per_s: float  # dense tensor-core peak
    bf16_flops_per_s: float
    hbm_bytes: float
    hbm_bytes_per_s: float


# docs/hardware.md §1.1: H800 SXM 989 / 1,979 TFLOPS dense BF16 / FP8, 80 GB HBM3 at 3.35 TB/s. The paper
# says only "Hopper"; H800 is DeepSeek's fleet (docs/hardware.md §7.1).
H800 = GpuSpec("h800", fp8_flops_per_s=1979e12, bf16_flops_per_s=989e12, hbm_bytes=80 * GB, hbm_bytes_per_s=3.35e12)
H100 = GpuSpec("h100", fp8_flops_per_s=1978.9e12, bf16_flops_per_s=989.4e12, hbm_bytes=80 * GB, hbm_bytes_per_s=3.35e12)
H200 = GpuSpec("h200", fp8_flops_per_s=1979e12, bf16_flops_per_s=989e12, hbm_bytes=141 * GB, hbm_bytes_per_s=4.8e12)
GPUS = {g.name: g for g in (H800, H100, H200)}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    gpus_per_node: int = 8  # docs/paper.md §1.2
    cnic_bytes_per_s: float = 50 * GB  # per GPU per direction: 400 Gbps ConnectX-7 (docs/hardware.md §2.1)
    snic_bytes_per_s: float = 50 * GB  # per node per direction: 1 x 400 Gbps (docs/paper.md §1.2)
    dram_buffer_bytes: float = 80 * GB  # PE/DE buffer per node: 80 GB for DeepSeek models (docs/paper.md §1.1)
    # What one node's storage client actually reads from 3FS; None = the SNIC line rate. 3FS's
    # KVCache clients peak at 40 GiB/s per node on a 400 Gbps NIC (docs/hardware.md §3.1, [S-3FS]).
    storage_read_bytes_per_s: float | None = 40 * 2**30

    @property
    def snic_read_bytes_per_s(self) -> float:
        if self.storage_read_bytes_per_s is None:
            return self.snic_bytes_per_s
        return min(self.snic_bytes_per_s, self.storage_read_bytes_per_s)

    def __post_init__(self) -> None:
        if self.gpus_per_node <= 0 or min(self.cnic_bytes_per_s, self.snic_bytes_per_s, self.dram_buffer_bytes) <= 0:
            raise ValueError(f"node spec values must be positive: {self}")
