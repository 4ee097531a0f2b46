"""The tensor-parallel section of RuntimeConfig (`RuntimeConfig.tp`): how many ranks an engine
runs, and where the second one sits. Its own module so config.py stays one screenful per section."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

TP_SIZES = (1, 2)


@dataclass(frozen=True, slots=True)
class TensorParallelConfig:
    """`ranks` 2 splits every layer's MLP over two processes (runtime/model/tensor_parallel.py:
    a broadcast and an all_reduce of T x C per layer, the volume of Megatron's two all-reduces),
    so the model's own traffic rides the latency-critical lane (on the testbed
    deploy/testbed/tp_hosts.py puts it in class 1:10; `dualpath bench tp-lanes` measures what that buys).
    2 is the smallest split; the paper's engines span 8 GPUs (docs/paper.md §1.2). CPU only (gloo);
    NCCL, the CUDA path, is not wired."""

    ranks: int = 1
    # Seconds an engine waits for rank 1 to load the model and join: ~3 s for tiny, ~10 s for
    # SmolLM2 on CI's loaded 2-core machine (tests/runtime/model/test_tensor_parallel.py); 6x that.
    rendezvous_timeout_s: float = 60.0
    # Each rank binds its gloo sockets to its own address; rank 1 starts in follower_netns when set
    # (the testbed gives it an emulated host of its own), else beside the engine. Loopback default.
    leader_host: str = "127.0.0.1"
    follower_host: str = "127.0.0.1"
    follower_netns: str | None = None

    def __post_init__(self) -> None:
        if self.ranks not in TP_SIZES:
            raise InputError(f"tp must be 1 or 2 (tensor-parallel ranks per engine), got {self.ranks}")
        if self.rendezvous_timeout_s <= 0:
            raise InputError(f"tp rendezvous_timeout_s must be positive, got {self.rendezvous_timeout_s}")

    def check_device(self, device: str) -> None:
        if self.ranks > 1 and device != "cpu":
            raise InputError(f"tp=2 runs its collectives with gloo on the cpu, not on {device!r} (NCCL is not wired)")

    @property
    def follower_prefix(self) -> tuple[str, ...]:
        """argv before rank 1's python: enter its namespace (the testbed), or nothing."""
        return () if self.follower_netns is None else ("ip", "netns", "exec", self.follower_netns)
