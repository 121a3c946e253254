"""The embedded instance catalog.

EC2-level fields (vCPUs, memory, accelerator count and memory, EFA support, network cards) are the values
of EC2 DescribeInstanceTypes (checked against moto's copy of that data by tests/test_catalog.py; refreshed
with `eks-dra catalog refresh`). PCIe roots and NUMA placement follow the per-instance topology published
by aws/karpenter-provider-aws (drametadata) and the dranet example slices, and the Neuron-to-EFA wiring
follows aws-neuron/connected-device-maps-over-efa-for-neuron (its per-instance maps of which EFA card each
Neuron device reaches). Bus numbers below a root are laid out by eks-dra (the first free buses under each root): they are
stable and unique per node, which is all that discovery, fixtures and the planner rely on.
"""

from __future__ import annotations

from .model import (
    Accelerator,
    EfaInterface,
    GpuModel,
    InstanceType,
    MigProfile,
    NeuronModel,
    PciLocation,
)

# --- accelerator models -----------------------------------------------------------------------

def _mig(*rows: tuple[str, int, int, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, count, mem, sms, slices) for name, count, mem, sms, slices in rows)


_MIG_A100_40 = _mig(("1g.5gb", 7, 4864, 14, 1), ("1g.10gb", 4, 9984, 14, 1), ("2g.10gb", 3, 9984, 28, 2),
                    ("3g.20gb", 2, 19968, 42, 3), ("4g.20gb", 1, 19968, 56, 4), ("7g.40gb", 1, 40192, 98, 7))
_MIG_A100_80 = _mig(("1g.10gb", 7, 9728, 14, 1), ("1g.20gb", 4, 19968, 14, 1), ("2g.20gb", 3, 19968, 28, 2),
                    ("3g.40gb", 2, 40192, 42, 3), ("4g.40gb", 1, 40192, 56, 4), ("7g.80gb", 1, 80384, 98, 7))
_MIG_H100_80 = _mig(("1g.10gb", 7, 9856, 16, 1), ("1g.20gb", 4, 19968, 26, 1), ("2g.20gb", 3, 19968, 32, 2),
                    ("3g.40gb", 2, 40192, 60, 3), ("4g.40gb", 1, 40192, 64, 4), ("7g.80gb", 1, 80384, 132, 7))
_MIG_H200 = _mig(("1g.18gb", 7, 16384, 16, 1), ("1g.35gb", 4, 32768, 26, 1), ("2g.35gb", 3, 32768, 32, 2),
                 ("3g.71gb", 2, 70656, 60, 3), ("4g.71gb", 1, 70656, 64, 4), ("7g.141gb", 1, 143360, 132, 7))
_MIG_B200 = _mig(("1g.23gb", 7, 23040, 18, 1), ("1g.45gb", 4, 46080, 18, 1), ("2g.45gb", 3, 46080, 36, 2),
                 ("3g.90gb", 2, 92160, 54, 3), ("4g.90gb", 1, 92160, 72, 4), ("7g.180gb", 1, 184320, 144, 7))

GPU_MODELS: dict[str, GpuModel] = {
    "A100-40": GpuModel("A100", "NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 0x20B0, 40960, 108, _MIG_A100_40),
    "A100-80": GpuModel("A100", "NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 0x20B2, 81920, 108, _MIG_A100_80),
    "H100": GpuModel("H100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0", 0x2330, 81920, 132, _MIG_H100_80),
    "H200": GpuModel("H200", "NVIDIA H200", "Hopper", "9.0", 0x2335, 144384, 132, _MIG_H200),
    "B200": GpuModel("B200", "NVIDIA B200", "Blackwell", "10.0", 0x2901, 183359, 148, _MIG_B200),
    # GB200 on p6e runs the 580 driver with CDMM (coherent driver-based memory management), which
    # does not support MIG.
    "GB200": GpuModel("GB200", "NVIDIA GB200", "Blackwell", "10.0", 0x2941, 189471, 152),
    "A10G": GpuModel("A10G", "NVIDIA A10G", "Ampere", "8.6", 0x2237, 22888, 80),
    "L4": GpuModel("L4", "NVIDIA L4", "Ada Lovelace", "8.9", 0x27B8, 22888, 58),
    "L40S": GpuModel("L40S", "NVIDIA L40S", "Ada Lovelace", "8.9", 0x26B9, 45776, 142),
}

# Per-device memory: AWS documents 32 GiB (Trainium, Inferentia2) and 96 GiB (Trainium2).
NEURON_MODELS: dict[str, NeuronModel] = {
    "Trainium": NeuronModel("Trainium", 0x7164, 2, 2, 32768),
    "Trainium2": NeuronModel("Trainium2", 0x7364, 8, 3, 98304),
    "Inferentia2": NeuronModel("Inferentia2", 0x7264, 2, 2, 32768),
}

# --- EC2 fields (DescribeInstanceTypes) -------------------------------------------------------
# name, architecture, vCPUs, memory MiB, accelerator (EC2 name), count, EFA supported, max EFA,
# network cards, max network interfaces
_EC2: tuple[tuple[str, str, int, int, str, int, bool, int, int, int], ...] = (
    ("p4d.24xlarge", "x86_64", 96, 1179648, "A100-40", 8, True, 4, 4, 60),
    ("p4de.24xlarge", "x86_64", 96, 1179648, "A100-80", 8, True, 4, 4, 60),
    ("p5.4xlarge", "x86_64", 16, 262144, "H100", 1, True, 1, 1, 4),
    ("p5.48xlarge", "x86_64", 192, 2097152, "H100", 8, True, 32, 32, 64),
    ("p5e.48xlarge", "x86_64", 192, 2097152, "H200", 8, True, 32, 32, 64),
    ("p5en.48xlarge", "x86_64", 192, 2097152, "H200", 8, True, 16, 16, 64),
    ("p6-b200.48xlarge", "x86_64", 192, 2097152, "B200", 8, True, 8, 8, 32),
    # Not in moto's data; vCPU/memory/EFA from the EKS UltraServer guide, UNVERIFIED.
    ("p6e-gb200.36xlarge", "arm64", 144, 983040, "GB200", 4, True, 4, 17, 17),
    ("g5.xlarge", "x86_64", 4, 16384, "A10G", 1, False, 0, 1, 4),
    ("g5.2xlarge", "x86_64", 8, 32768, "A10G", 1, False, 0, 1, 4),
    ("g5.4xlarge", "x86_64", 16, 65536, "A10G", 1, False, 0, 1, 8),
    ("g5.8xlarge", "x86_64", 32, 131072, "A10G", 1, True, 1, 1, 8),
    ("g5.12xlarge", "x86_64", 48, 196608, "A10G", 4, True, 1, 1, 15),
    ("g5.16xlarge", "x86_64", 64, 262144, "A10G", 1, True, 1, 1, 8),
    ("g5.24xlarge", "x86_64", 96, 393216, "A10G", 4, True, 1, 1, 15),
    ("g5.48xlarge", "x86_64", 192, 786432, "A10G", 8, True, 1, 1, 7),
    ("g6.xlarge", "x86_64", 4, 16384, "L4", 1, False, 0, 1, 4),
    ("g6.2xlarge", "x86_64", 8, 32768, "L4", 1, False, 0, 1, 4),
    ("g6.4xlarge", "x86_64", 16, 65536, "L4", 1, False, 0, 1, 8),
    ("g6.8xlarge", "x86_64", 32, 131072, "L4", 1, True, 1, 1, 8),
    ("g6.12xlarge", "x86_64", 48, 196608, "L4", 4, True, 1, 1, 8),
    ("g6.16xlarge", "x86_64", 64, 262144, "L4", 1, True, 1, 1, 15),
    ("g6.24xlarge", "x86_64", 96, 393216, "L4", 4, True, 1, 1, 15),
    ("g6.48xlarge", "x86_64", 192, 786432, "L4", 8, True, 1, 1, 15),
    ("g6e.xlarge", "x86_64", 4, 32768, "L40S", 1, False, 0, 1, 4),
    ("g6e.2xlarge", "x86_64", 8, 65536, "L40S", 1, False, 0, 1, 4),
    ("g6e.4xlarge", "x86_64", 16, 131072, "L40S", 1, False, 0, 1, 8),
    ("g6e.8xlarge", "x86_64", 32, 262144, "L40S", 1, True, 1, 1, 8),
    ("g6e.12xlarge", "x86_64", 48, 393216, "L40S", 4, True, 1, 1, 10),
    ("g6e.16xlarge", "x86_64", 64, 524288, "L40S", 1, True, 1, 1, 15),
    ("g6e.24xlarge", "x86_64", 96, 786432, "L40S", 4, True, 2, 2, 20),
    ("g6e.48xlarge", "x86_64", 192, 1572864, "L40S", 8, True, 4, 4, 40),
    ("trn1.2xlarge", "x86_64", 8, 32768, "Trainium", 1, False, 0, 1, 4),
    ("trn1.32xlarge", "x86_64", 128, 524288, "Trainium", 16, True, 8, 8, 40),
    ("trn1n.32xlarge", "x86_64", 128, 524288, "Trainium", 16, True, 16, 16, 80),
    ("trn2.3xlarge", "x86_64", 12, 131072, "Trainium2", 1, True, 1, 1, 2),
    ("trn2.48xlarge", "x86_64", 192, 2097152, "Trainium2", 16, True, 16, 16, 32),
    ("inf2.xlarge", "x86_64", 4, 16384, "Inferentia2", 1, False, 0, 1, 4),
    ("inf2.8xlarge", "x86_64", 32, 131072, "Inferentia2", 1, False, 0, 1, 8),
    ("inf2.24xlarge", "x86_64", 96, 393216, "Inferentia2", 6, False, 0, 1, 15),
    ("inf2.48xlarge", "x86_64", 192, 786432, "Inferentia2", 12, False, 0, 1, 15),
)

# --- topology ---------------------------------------------------------------------------------
# Each entry: accelerator roots in device order, EFA roots in interface order, NUMA node per root,
# EFA PCI device id (generation: efa0 p4d/g5, efa1 p5/p5e/g6/g6e, efa2 p5en, efa3 p6).

_P5_ROOTS = (0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB)
_G6E_ROOTS = (0x9D, 0x9F, 0xA1, 0xA3, 0xC5, 0xC7, 0xC9, 0xCB)
_G6_ROOTS = (0x9E, 0xA0, 0xA2, 0xA4, 0xAE, 0xB0, 0xB2, 0xB3)
# The EFA function (BDF) wired to each Neuron device, by device id: lookup/neuron/{trn1,trn1n,trn2}.json of
# aws-neuron/connected-device-maps-over-efa-for-neuron @ 2eb56e48a3f8af8e13478e3d48df2a1874f04fd7 (the tables
# DRANET and the Neuron driver hash into resource.aws.com/devicegroupN_id). Its efa-enabled-instances.json
# lists trn1.32xlarge, trn1n.32xlarge and trn2.48xlarge (not trn1.2xlarge or trn2.3xlarge).
NEURON_EFA_BDFS: dict[str, tuple[str, ...]] = {
    "trn1": (
        "0000:10:1a.0", "0000:10:1a.0", "0000:a0:1a.0", "0000:a0:1a.0", "0000:20:19.0", "0000:20:19.0",
        "0000:90:19.0", "0000:90:19.0", "0000:20:1a.0", "0000:20:1a.0", "0000:90:1a.0", "0000:90:1a.0",
        "0000:10:19.0", "0000:10:19.0", "0000:a0:19.0", "0000:a0:19.0",
    ),
    "trn1n": (
        "0000:10:17.0", "0000:10:1a.0", "0000:a0:17.0", "0000:a0:1a.0", "0000:20:19.0", "0000:20:18.0",
        "0000:90:19.0", "0000:90:18.0", "0000:20:17.0", "0000:20:1a.0", "0000:90:17.0", "0000:90:1a.0",
        "0000:10:19.0", "0000:10:18.0", "0000:a0:19.0", "0000:a0:18.0",
    ),
    "trn2": (
        "0000:c9:00.0", "0000:b4:00.0", "0000:b3:00.0", "0000:ca:00.0", "0000:6c:00.0", "0000:57:00.0",
        "0000:56:00.0", "0000:6d:00.0", "0000:98:00.0", "0000:83:00.0", "0000:82:00.0", "0000:99:00.0",
        "0000:f5:00.0", "0000:e0:00.0", "0000:df:00.0", "0000:f6:00.0",
    ),
}
NEURON_EFA_INSTANCE_TYPES = ("trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge")
_TRN1_ROOTS = (0x10, 0x20, 0x90, 0xA0)
_TRN1_NUMA = {0x10: 0, 0x20: 0, 0x90: 1, 0xA0: 1}


def _split_numa(roots: tuple[int, ...], nodes: int) -> dict[int, int]:
    """Assign NUMA nodes to distinct roots in order, in equal contiguous blocks."""
    distinct = list(dict.fromkeys(roots))
    per = max(1, -(-len(distinct) // nodes))
    return {root: min(i // per, nodes - 1) for i, root in enumerate(distinct)}


class _BusAllocator:
    """Hands out the next free bus under a root, so that every PCI function gets a unique address."""

    def __init__(self) -> None:
        self._next: dict[int, int] = {}

    def take(self, root: int) -> int:
        bus = self._next.get(root, root + 1)
        self._next[root] = bus + 1
        return bus


def _loc(bus: int, root: int, numa: int, function_device: int = 0) -> PciLocation:
    return PciLocation(f"0000:{bus:02x}:{function_device:02x}.0", f"pci0000:{root:02x}", numa)


def _gpu_topology(acc_roots, efa_roots, numa: dict[int, int], efa_dev: int):
    buses = _BusAllocator()
    accs = tuple(Accelerator(i, _loc(buses.take(r), r, numa[r])) for i, r in enumerate(acc_roots))
    efas = tuple(EfaInterface(i, i, _loc(buses.take(r), r, numa[r]), efa_dev) for i, r in enumerate(efa_roots))
    return accs, efas


def _topology(name: str, count: int, efa_count: int):
    """Return (accelerators, efa_interfaces, neuron_efa_map, numa_nodes, notes) for an instance type."""
    fam, size = name.split(".")
    notes: list[str] = []
    if fam in ("p4d", "p4de"):
        roots = (0x10, 0x10, 0x20, 0x20, 0x90, 0x90, 0xA0, 0xA0)
        efa = (0x10, 0x20, 0x90, 0xA0)
        numa = _split_numa(roots, 2)
        return (*_gpu_topology(roots, efa, numa, 0xEFA0), (), 2, ())
    if fam in ("p5", "p5e") and count == 8:
        nodes = 2 if fam == "p5" else 4
        numa = _split_numa(_P5_ROOTS, nodes)
        efa = tuple(r for r in _P5_ROOTS for _ in range(4))
        return (*_gpu_topology(_P5_ROOTS, efa, numa, 0xEFA1), (), nodes, ())
    if fam == "p5":  # p5.4xlarge: one GPU and one EFA; we place them on one root (UNVERIFIED).
        numa = {0x44: 0}
        notes.append("p5.4xlarge: GPU/EFA sharing one PCIe root is assumed, not published")
        return (*_gpu_topology((0x44,), (0x44,), numa, 0xEFA1), (), 1, tuple(notes))
    if fam == "p5en":
        roots = (0x44, 0x44, 0x5D, 0x5D, 0x76, 0x76, 0x8F, 0x8F)
        efa = tuple(r for r in (0x44, 0x5D, 0x76, 0x8F) for _ in range(4))
        return (*_gpu_topology(roots, efa, _split_numa(roots, 2), 0xEFA2), (), 2, ())
    if fam == "p6-b200":
        roots = (0x44, 0x44, 0x55, 0x55, 0x66, 0x66, 0x79, 0x79)
        efa = tuple(r for r in (0x44, 0x55, 0x66, 0x79) for _ in range(2))
        return (*_gpu_topology(roots, efa, _split_numa(roots, 2), 0xEFA3), (), 2, ())
    if fam == "p6e-gb200":
        roots = (0x00, 0x40, 0x80, 0xC0)
        notes.append("p6e-gb200: roots, NUMA and EFA placement are UNVERIFIED (one EFA per GPU root assumed)")
        return (*_gpu_topology(roots, roots, _split_numa(roots, 2), 0xEFA3), (), 2, tuple(notes))
    if fam == "g5":
        # g5.48xlarge: every GPU and the EFA sit under root 00 (Karpenter drametadata).
        roots = (0x00,) * count
        return (*_gpu_topology(roots, (0x00,) * efa_count, {0x00: 0}, 0xEFA0), (), 1, ())
    if fam in ("g6", "g6e"):
        all_roots = _G6E_ROOTS if fam == "g6e" else _G6_ROOTS
        all_efa = (0x84, 0x84, 0xA5, 0xA5) if fam == "g6e" else (0x84,)
        roots = all_roots[:count]
        efa = all_efa[:efa_count]
        nodes = 2 if count == 8 else 1
        numa = _split_numa(roots, nodes)
        for i, r in enumerate(dict.fromkeys(efa)):
            numa.setdefault(r, min(i, nodes - 1))
        if count < 8:
            notes.append(f"{name}: roots taken from the 48xlarge layout (UNVERIFIED for this size)")
        return (*_gpu_topology(roots, efa, numa, 0xEFA1), (), nodes, tuple(notes))
    if fam == "trn2":
        buses = tuple(int(bdf.split(":")[1], 16) for bdf in NEURON_EFA_BDFS["trn2"])[:count]
        numa = {b: (0 if i < max(1, count // 2) else 1) for i, b in enumerate(buses)}
        # Each Trainium2 sits beside its EFA; the Neuron function is device 01 on the EFA's bus (UNVERIFIED).
        accs = tuple(Accelerator(i, _loc(b, b, numa[b], 1)) for i, b in enumerate(buses))
        efas = tuple(EfaInterface(i, i, _loc(b, b, numa[b]), 0xEFA2) for i, b in enumerate(buses[:efa_count]))
        notes.append("trn2: PCIe roots and NUMA nodes of Neuron devices are UNVERIFIED; EFA BDFs are published")
        mapping = tuple(range(count)) if name in NEURON_EFA_INSTANCE_TYPES else ()
        return accs, efas, mapping, 2 if count > 1 else 1, tuple(notes)
    if fam in ("trn1", "trn1n"):
        if count == 1:
            return (Accelerator(0, _loc(0x11, 0x10, 0)),), (), (), 1, ()
        # EFA functions sit on their root's bus (0000:10:1a.0 is under pci0000:10); interfaces are numbered in
        # the order the table first names them. Neuron devices are numbered in bus order, four per root
        # (UNVERIFIED: their addresses are not published, and the EFA map does not follow bus order).
        bdfs = list(dict.fromkeys(NEURON_EFA_BDFS[fam]))
        efas = tuple(EfaInterface(i, i, PciLocation(bdf, f"pci0000:{bdf.split(':')[1]}",
                                                    _TRN1_NUMA[int(bdf.split(':')[1], 16)]), 0xEFA0)
                     for i, bdf in enumerate(bdfs))
        mapping = tuple(bdfs.index(bdf) for bdf in NEURON_EFA_BDFS[fam])
        buses = _BusAllocator()
        roots = [_TRN1_ROOTS[i * len(_TRN1_ROOTS) // count] for i in range(count)]
        accs = tuple(Accelerator(i, _loc(buses.take(r), r, _TRN1_NUMA[r])) for i, r in enumerate(roots))
        notes.append(f"{fam}: Neuron devices' PCI addresses are UNVERIFIED; EFA BDFs are the lookup table's")
        return accs, efas, mapping, 2, tuple(notes)
    if fam == "inf2":
        # Inferentia2: no EFA; one root per device pair (UNVERIFIED).
        roots = tuple(0x10 + 0x10 * (i // 2) for i in range(count))
        numa = _split_numa(roots, 2 if count > 1 else 1)
        buses = _BusAllocator()
        accs = tuple(Accelerator(i, _loc(buses.take(r), r, numa[r])) for i, r in enumerate(roots))
        notes.append("inf2: PCIe roots and NUMA nodes are UNVERIFIED")
        return accs, (), (), 2 if count > 1 else 1, tuple(notes)
    raise ValueError(f"no topology for {name}")


def _build() -> dict[str, InstanceType]:
    out: dict[str, InstanceType] = {}
    for name, arch, vcpus, mem, model, count, efa_ok, max_efa, cards, max_eni in _EC2:
        gpu = GPU_MODELS.get(model)
        neuron = NEURON_MODELS.get(model)
        accs, efas, neuron_map, numa_nodes, notes = _topology(name, count, max_efa)
        out[name] = InstanceType(
            name=name,
            architecture=arch,  # type: ignore[arg-type]
            vcpus=vcpus,
            memory_mib=mem,
            accelerator_kind="gpu" if gpu else "neuron",
            accelerator_count=count,
            gpu=gpu,
            neuron=neuron,
            efa_supported=efa_ok,
            max_efa_interfaces=max_efa,
            network_cards=cards,
            max_network_interfaces=max_eni,
            numa_nodes=numa_nodes,
            accelerators=accs,
            efa_interfaces=efas,
            neuron_efa_map=neuron_map,
            efa_on_card0=not name.startswith("p6e-gb200"),
            notes=notes,
        )
    return out


INSTANCE_TYPES: dict[str, InstanceType] = _build()

# Non-accelerator types used for system node groups; only EC2-level fields matter for them.
SYSTEM_INSTANCE_TYPES: dict[str, tuple[str, int, int]] = {
    "m7i.large": ("x86_64", 2, 8192),
    "m7i.xlarge": ("x86_64", 4, 16384),
    "m7i.2xlarge": ("x86_64", 8, 32768),
    "m6i.large": ("x86_64", 2, 8192),
    "m6i.xlarge": ("x86_64", 4, 16384),
    "m5.large": ("x86_64", 2, 8192),
    "m5.xlarge": ("x86_64", 4, 16384),
    "m7g.large": ("arm64", 2, 8192),
    "m7g.xlarge": ("arm64", 4, 16384),
    "c7i.xlarge": ("x86_64", 4, 8192),
}
