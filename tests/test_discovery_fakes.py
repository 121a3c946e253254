"""A fake NVML for tests (never shipped): reports the GPUs of a node's facts as the real NVML would."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from eks_dra.devices import NodeFacts
from eks_dra.drivers.gpu.nvml import NvmlEvent, NvmlGpu, NvmlHealth, NvmlMig


@dataclass
class FakeNvml:
    gpu_list: list[NvmlGpu]
    version: str = "580.95.05"
    events: list[NvmlEvent] = field(default_factory=list)
    health_by_uuid: dict[str, NvmlHealth] = field(default_factory=dict)
    fail_with: Exception | None = None

    @classmethod
    def from_facts(cls, facts: NodeFacts) -> FakeNvml:
        it = facts.instance_type
        assert it.gpu is not None
        gpus = []
        for g in facts.gpus:
            migs = tuple(
                NvmlMig(m.uuid, m.profile, m.placement + 1, 0, m.placement * it.gpu.mig_profile(m.profile).slices,
                        m.memory_mib, m.multiprocessors)
                for m in facts.migs if m.parent.minor == g.minor)
            gpus.append(NvmlGpu(g.minor, g.uuid, g.product_name, g.architecture, g.cuda_compute_capability,
                                g.pci.address, it.gpu.pci_device_id, g.memory_mib,
                                g.multiprocessors if it.gpu.mig_capable else None, bool(migs), migs))
        return cls(gpus, version=facts.gpus[0].driver_version)

    def driver_version(self) -> str:
        if self.fail_with:
            raise self.fail_with
        return self.version

    def gpus(self) -> list[NvmlGpu]:
        if self.fail_with:
            raise self.fail_with
        return list(self.gpu_list)

    def poll_events(self) -> list[NvmlEvent]:
        out, self.events = self.events, []
        return out

    def health(self, uuid: str) -> NvmlHealth:
        return self.health_by_uuid.get(uuid, NvmlHealth(0, False, False))

    def replace_gpu(self, minor: int, **changes) -> None:
        self.gpu_list = [replace(g, **changes) if g.minor == minor else g for g in self.gpu_list]
