"""Sample claims and workloads (namespace dra-samples): every case of the EKS device-management guide.

Each sample is generated only when a node group of the environment can satisfy it, decided on the devices
our drivers publish there (`eks_dra.devices.simulate_node`), so `eks-dra plan` and the scheduler can place
every sample that ships. Pods tolerate the accelerator taints (never the drivers' readiness taints: they
wait until the devices are advertised), run a tiny image that sleeps, and are pinned only by their claims.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import cdk8s
from cdk8s_plus_34 import k8s
from constructs import Construct

from eks_dra.devices import PCIE_ROOT, Device, names

from . import labels
from .device_classes import EXTENDED_RESOURCES, DeviceClasses

SAMPLE_IMAGE = "public.ecr.aws/docker/library/busybox:1.37"
DEVICE_GROUP4 = "resource.aws.com/devicegroup4_id"
PREFERRED_GPUS = ("H100", "H200")
# Our drivers read the upstream kinds, so one form serves both implementations of a family.
OPAQUE_API = {"gpu": (names.GPU_CONFIG_API_VERSION, names.GPU_CONFIG_KIND),
              "neuron": (names.NEURON_CONFIG_API_VERSION, names.NEURON_CONFIG_KIND)}


@dataclass(frozen=True)
class NodeGroupDevices:
    """One node group as the samples see it: who manages each family and the devices one node publishes."""

    name: str
    instance_type: str
    managers: dict[str, str]  # family -> "dra" | "device-plugin"
    devices: dict[str, list[Device]] = field(default_factory=dict)  # DRA-visible devices of one node
    mig_profile: str | None = None
    neuron_core_version: int | None = None

    def dra(self, *families: str) -> bool:
        return all(self.managers.get(f) == labels.MANAGER_DRA for f in families)

    def full_gpus(self) -> list[Device]:
        return [d for d in self.devices.get("gpu", []) if d.attributes.get("type") == "gpu"]

    def migs(self) -> list[Device]:
        return [d for d in self.devices.get("gpu", []) if d.attributes.get("type") == "mig"]


# --- which node groups can satisfy which sample (pure functions of the device model) ---------------

def efas_per_gpu_root(group: NodeGroupDevices) -> int:
    """EFA interfaces on the PCIe root of a GPU (the least over GPUs that share one): 4 on p5, 1 on p4d, 0 on g6e."""
    efa_roots = Counter(d.attributes.get(PCIE_ROOT) for d in group.devices.get("efa", []))
    shared = [efa_roots[g.attributes.get(PCIE_ROOT)] for g in group.full_gpus() if efa_roots[g.attributes.get(PCIE_ROOT)]]
    return min(shared, default=0)


def all_efas_on_one_gpu_root(group: NodeGroupDevices) -> bool:
    """`allocationMode: All` EFAs + one GPU + matchAttribute pcieRoot: under 1.34 semantics every EFA of the
    node is taken before the constraint is checked, so it only fits where all EFAs sit on one GPU's root."""
    efa_roots = {d.attributes.get(PCIE_ROOT) for d in group.devices.get("efa", [])}
    gpu_roots = {g.attributes.get(PCIE_ROOT) for g in group.full_gpus()}
    return len(efa_roots) == 1 and efa_roots <= gpu_roots


def neurons_per_group4(group: NodeGroupDevices) -> int:
    counts = Counter(d.attributes.get(DEVICE_GROUP4) for d in group.devices.get("neuron", []))
    counts.pop(None, None)
    return min(counts.values(), default=0)


def efas_per_group4(group: NodeGroupDevices) -> int:
    """EFAs sharing a devicegroup4_id: 4 on trn2 (1:1 wiring), 2 on trn1 (two Neuron devices per EFA)."""
    counts = Counter(d.attributes.get(DEVICE_GROUP4) for d in group.devices.get("efa", []))
    counts.pop(None, None)
    return min(counts.values(), default=0)


def _first(groups: list[NodeGroupDevices], test: Callable[[NodeGroupDevices], bool]) -> NodeGroupDevices | None:
    return next((g for g in groups if test(g)), None)


# --- the chart ------------------------------------------------------------------------------------

class SamplesChart(cdk8s.Chart):
    """Sample ResourceClaims, ResourceClaimTemplates and the workloads that use them."""

    def __init__(self, scope: Construct, id: str, *, groups: list[NodeGroupDevices], classes: DeviceClasses,
                 namespace: str = labels.SAMPLES_NAMESPACE, image: str = SAMPLE_IMAGE,
                 compute_domains: bool = False, extended_resources: bool = False) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True)
        self.ns = namespace
        self.image = image
        self.classes = classes
        self.sample_names: list[str] = []
        k8s.KubeNamespace(self, "namespace", metadata=k8s.ObjectMeta(
            name=namespace, labels={**labels.app_labels("dra-samples", "samples"),
                                    "pod-security.kubernetes.io/enforce": "restricted"}))
        full_gpu = _first(groups, lambda g: g.dra("gpu") and bool(g.full_gpus()))
        if full_gpu:
            self._gpu_job()
            self._shared_gpu()
            self._time_slicing()
            self._prioritized(groups)
            if extended_resources and not classes.upstream("gpu"):
                self._extended_resource_gpu()
        aligned = _first(groups, lambda g: g.dra("gpu", "efa") and efas_per_gpu_root(g) > 0)
        if aligned:
            self._gpu_efa_aligned()
            self._gpu_efa_root(aligned)
        all_root = _first(groups, lambda g: g.dra("gpu", "efa") and all_efas_on_one_gpu_root(g))
        if all_root:
            self._gpu_all_efa_root(all_root)
        for profile in dict.fromkeys(g.mig_profile for g in groups if g.dra("gpu") and g.migs()):
            self._mig(profile)
        neuron = _first(groups, lambda g: g.dra("neuron") and "efa" in g.managers and neurons_per_group4(g) >= 4)
        if neuron:
            self._neuron_lnc(neuron)
        neuron_efa = _first(groups, lambda g: g.dra("neuron", "efa") and neurons_per_group4(g) >= 4
                            and efas_per_group4(g) > 0)
        if neuron_efa:
            self._neuron_efa_aligned(neuron_efa)
        gb200 = _first(groups, lambda g: g.instance_type.startswith("p6e-gb200") and g.dra("gpu") and bool(g.full_gpus()))
        if compute_domains and gb200 and classes.upstream("gpu"):
            self._compute_domain()
        for family in ("gpu", "efa", "neuron"):
            if any(g.managers.get(family) == labels.MANAGER_DEVICE_PLUGIN for g in groups):
                self._device_plugin_pod(family)

    # --- building blocks --------------------------------------------------------------------

    def _meta(self, name: str, sample: str) -> k8s.ObjectMeta:
        return k8s.ObjectMeta(name=name, namespace=self.ns,
                              labels={**labels.app_labels(sample, "sample"), "eks-dra.io/sample": sample})

    @staticmethod
    def _exact(class_name: str, count: int | None = None, selectors: list[str] | None = None,
               all_devices: bool = False) -> k8s.ExactDeviceRequest:
        return k8s.ExactDeviceRequest(
            device_class_name=class_name,
            allocation_mode="All" if all_devices else None,
            count=None if all_devices else count,
            selectors=[k8s.DeviceSelector(cel=k8s.CelDeviceSelector(expression=e)) for e in selectors or []] or None,
        )

    def _opaque(self, family: str, requests: list[str], settings: dict) -> k8s.DeviceClaimConfiguration:
        api_version, kind = OPAQUE_API[family]
        return k8s.DeviceClaimConfiguration(
            requests=requests,
            opaque=k8s.OpaqueDeviceConfiguration(driver=self.classes.driver(family),
                                                 parameters={"apiVersion": api_version, "kind": kind, **settings}))

    def _template(self, name: str, sample: str, claim: k8s.DeviceClaim) -> None:
        self.sample_names.append(sample)
        k8s.KubeResourceClaimTemplate(self, f"{name}-template", metadata=self._meta(name, sample),
                                      spec=k8s.ResourceClaimTemplateSpec(spec=k8s.ResourceClaimSpec(devices=claim)))

    def _claim(self, name: str, sample: str, claim: k8s.DeviceClaim) -> None:
        self.sample_names.append(sample)
        k8s.KubeResourceClaim(self, f"{name}-claim", metadata=self._meta(name, sample),
                              spec=k8s.ResourceClaimSpec(devices=claim))

    def _pod_spec(self, *, template: str | None = None, claim: str | None = None, restart: str = "Never",
                  seconds: int = 3600, extended: dict[str, int] | None = None,
                  node_group: str | None = None, more_templates: dict[str, str] | None = None) -> k8s.PodSpec:
        """`more_templates`: further pod claims, pod claim name -> ResourceClaimTemplate."""
        pod_claims = None
        container_claims = None
        if template or claim:
            pod_claims = [k8s.PodResourceClaim(name="devices", resource_claim_template_name=template,
                                               resource_claim_name=claim)]
            container_claims = [k8s.ResourceClaim(name="devices")]
        for pod_claim, more in (more_templates or {}).items():
            pod_claims = [*(pod_claims or []), k8s.PodResourceClaim(name=pod_claim, resource_claim_template_name=more)]
            container_claims = [*(container_claims or []), k8s.ResourceClaim(name=pod_claim)]
        limits = {k: k8s.Quantity.from_number(v) for k, v in (extended or {}).items()}
        return k8s.PodSpec(
            restart_policy=restart,
            node_selector={labels.NODE_GROUP_LABEL: node_group} if node_group else None,
            tolerations=labels.accelerator_tolerations(),
            resource_claims=pod_claims,
            security_context=k8s.PodSecurityContext(run_as_non_root=True, run_as_user=65534,
                                                    seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault")),
            containers=[k8s.Container(
                name="app", image=self.image, image_pull_policy="IfNotPresent",
                command=["sleep", str(seconds)],
                resources=k8s.ResourceRequirements(
                    claims=container_claims,
                    requests={"cpu": k8s.Quantity.from_string("10m"), "memory": k8s.Quantity.from_string("16Mi")},
                    limits={"memory": k8s.Quantity.from_string("32Mi"), **limits}),
                security_context=k8s.SecurityContext(allow_privilege_escalation=False, read_only_root_filesystem=True,
                                                     capabilities=k8s.Capabilities(drop=["ALL"])),
            )],
        )

    def _pod(self, name: str, sample: str, **spec: object) -> None:
        k8s.KubePod(self, f"{name}-pod", metadata=self._meta(name, sample), spec=self._pod_spec(**spec))

    # --- the samples ------------------------------------------------------------------------

    def _gpu_job(self) -> None:
        """A template for one GPU and a parallel Job: each pod gets its own claim, so its own GPU."""
        self._template("single-gpu", "gpu-job", k8s.DeviceClaim(requests=[
            k8s.DeviceRequest(name="gpu", exactly=self._exact(self.classes.class_name("gpu"), 1))]))
        k8s.KubeJob(self, "gpu-job", metadata=self._meta("gpu-job", "gpu-job"), spec=k8s.JobSpec(
            parallelism=2, completions=2, backoff_limit=2,
            template=k8s.PodTemplateSpec(metadata=k8s.ObjectMeta(labels={"eks-dra.io/sample": "gpu-job"}),
                                         spec=self._pod_spec(template="single-gpu", seconds=60))))

    def _shared_gpu(self) -> None:
        """One ResourceClaim referenced by two Pods: both share the GPU and land on its node."""
        self._claim("shared-gpu", "shared-gpu", k8s.DeviceClaim(requests=[
            k8s.DeviceRequest(name="gpu", exactly=self._exact(self.classes.class_name("gpu"), 1))]))
        for suffix in ("a", "b"):
            self._pod(f"shared-gpu-{suffix}", "shared-gpu", claim="shared-gpu")

    def _time_slicing(self) -> None:
        """A GPU shared in time slices by two Pods, through the driver's opaque GpuConfig."""
        self._claim("time-sliced-gpu", "time-slicing", k8s.DeviceClaim(
            requests=[k8s.DeviceRequest(name="gpu", exactly=self._exact(self.classes.class_name("gpu"), 1))],
            config=[self._opaque("gpu", ["gpu"], {"sharing": {"strategy": "TimeSlicing",
                                                              "timeSlicingConfig": {"interval": "Long"}}})]))
        for suffix in ("a", "b"):
            self._pod(f"time-sliced-{suffix}", "time-slicing", claim="time-sliced-gpu")

    def _prioritized(self, groups: list[NodeGroupDevices]) -> None:
        """`firstAvailable`: an H100 or H200 when the cluster has one free, any GPU otherwise."""
        product = self.classes.attribute("gpu", "productName")
        preferred = " || ".join(f"{product}.contains('{p}')" for p in PREFERRED_GPUS)
        gpu_class = self.classes.class_name("gpu")
        self._template("prioritized-gpu", "prioritized", k8s.DeviceClaim(requests=[k8s.DeviceRequest(
            name="gpu", first_available=[
                k8s.DeviceSubRequest(name="h100-or-h200", device_class_name=gpu_class, count=1,
                                     selectors=[k8s.DeviceSelector(cel=k8s.CelDeviceSelector(expression=preferred))]),
                k8s.DeviceSubRequest(name="any-gpu", device_class_name=gpu_class, count=1),
            ])]))
        self._pod("prioritized-gpu", "prioritized", template="prioritized-gpu")

    def _gpu_efa_aligned(self) -> None:
        """One GPU and one EFA interface behind the same PCIe root (GPUDirect RDMA without crossing roots)."""
        self._template("gpu-efa-aligned", "gpu-efa-aligned", k8s.DeviceClaim(
            requests=[k8s.DeviceRequest(name="gpu", exactly=self._exact(self.classes.class_name("gpu"), 1)),
                      k8s.DeviceRequest(name="efa", exactly=self._exact(self.classes.class_name("efa"), 1))],
            constraints=[k8s.DeviceConstraint(requests=["gpu", "efa"], match_attribute=PCIE_ROOT)]))
        self._pod("gpu-efa-aligned", "gpu-efa-aligned", template="gpu-efa-aligned")

    def _gpu_efa_root(self, group: NodeGroupDevices) -> None:
        """One GPU and the EFA interfaces on its root. An exact count from the topology (4 on p5, 2 on p6-b200,
        1 on p4d) with matchAttribute, because `allocationMode: All` takes every EFA of the node first and
        then fails the pcieRoot constraint on any node whose EFAs span several roots (1.34 semantics)."""
        count = efas_per_gpu_root(group)
        self._template("gpu-efa-root", "gpu-efa-root", k8s.DeviceClaim(
            requests=[k8s.DeviceRequest(name="gpu", exactly=self._exact(self.classes.class_name("gpu"), 1)),
                      k8s.DeviceRequest(name="efas", exactly=self._exact(self.classes.class_name("efa"), count))],
            constraints=[k8s.DeviceConstraint(requests=["gpu", "efas"], match_attribute=PCIE_ROOT)]))
        self._pod("gpu-efa-root", "gpu-efa-root", template="gpu-efa-root")

    def _gpu_all_efa_root(self, group: NodeGroupDevices) -> None:
        """The guide's `allocationMode: All` variant. Generated only because every EFA of this group's nodes
        sits on one GPU's PCIe root (e.g. g5.48xlarge); on p4d/p5/p5en/p6-b200 it could never be allocated.
        Pinned to the group: on a p5 node `All` means 32 EFAs + 1 GPU, over the 32-device claim limit, which the
        1.34 allocator reports as an error (not "unschedulable") and that fails the pod's whole scheduling cycle."""
        self._template("gpu-all-efa-root", "gpu-all-efa-root", k8s.DeviceClaim(
            requests=[k8s.DeviceRequest(name="gpu", exactly=self._exact(self.classes.class_name("gpu"), 1)),
                      k8s.DeviceRequest(name="efas", exactly=self._exact(self.classes.class_name("efa"),
                                                                         all_devices=True))],
            constraints=[k8s.DeviceConstraint(requests=["gpu", "efas"], match_attribute=PCIE_ROOT)]))
        self._pod("gpu-all-efa-root", "gpu-all-efa-root", template="gpu-all-efa-root", node_group=group.name)

    def _mig(self, profile: str | None) -> None:
        """A MIG device of one profile, chosen by CEL on the MIG class (static MIG: partitions exist already)."""
        name = f"mig-{(profile or '').replace('.', '-')}"
        selector = f"{self.classes.attribute('gpu', 'profile')} == '{profile}'"
        self._template(name, "mig", k8s.DeviceClaim(requests=[k8s.DeviceRequest(
            name="mig", exactly=self._exact(self.classes.class_name("mig"), 1, [selector]))]))
        self._pod(name, "mig", template=name)

    def _neuron_selector(self, group: NodeGroupDevices) -> str:
        return f"{self.classes.attribute('neuron', 'instanceType')} == '{group.instance_type}'"

    def _neuron_lnc(self, group: NodeGroupDevices) -> None:
        """Four Neuron devices of one connected group (devicegroup4_id) with a logical NeuronCore size.
        LNC 2 pairs the NeuronCore-v3 cores of Trainium2; older cores take 1. The instanceType selector keeps
        the config on the type it was chosen for."""
        lnc = 2 if (group.neuron_core_version or 0) >= 3 else 1
        self._template("neuron-lnc", "neuron-lnc", k8s.DeviceClaim(
            requests=[k8s.DeviceRequest(name="neurons", exactly=self._exact(
                self.classes.class_name("neuron"), 4, [self._neuron_selector(group)]))],
            constraints=[k8s.DeviceConstraint(requests=["neurons"], match_attribute=DEVICE_GROUP4)],
            config=[self._opaque("neuron", ["neurons"], {"logicalNeuronCore": lnc})]))
        self._pod("neuron-lnc", "neuron-lnc", template="neuron-lnc")

    def _neuron_efa_aligned(self, group: NodeGroupDevices) -> None:
        """Four Neuron devices and the EFA interfaces of the same device group: 4 on trn2 (1:1 wiring),
        2 on trn1, where two Neuron devices share each EFA."""
        efas = min(4, efas_per_group4(group))
        self._template("neuron-efa-aligned", "neuron-efa-aligned", k8s.DeviceClaim(
            requests=[k8s.DeviceRequest(name="neurons", exactly=self._exact(
                          self.classes.class_name("neuron"), 4, [self._neuron_selector(group)])),
                      k8s.DeviceRequest(name="efas", exactly=self._exact(self.classes.class_name("efa"), efas))],
            constraints=[k8s.DeviceConstraint(requests=["neurons", "efas"], match_attribute=DEVICE_GROUP4)]))
        self._pod("neuron-efa-aligned", "neuron-efa-aligned", template="neuron-efa-aligned")

    def _compute_domain(self) -> None:
        """The IMEX sample of the EKS UltraServer page: a ComputeDomain (its controller, from the NVIDIA chart,
        creates the channel ResourceClaimTemplate) and a pod holding a channel and a GPU. The page runs
        nvbandwidth as an MPIJob (4 GPUs per worker), which needs the MPI operator; the pod keeps its claims."""
        name = "compute-domain"
        channel = f"{name}-channel"
        domain = cdk8s.ApiObject(self, f"{name}-domain", api_version=names.COMPUTE_DOMAIN_API_VERSION,
                                 kind=names.COMPUTE_DOMAIN_KIND,
                                 metadata=cdk8s.ApiObjectMetadata(name=name, namespace=self.ns, labels={
                                     **labels.app_labels(name, "sample"), "eks-dra.io/sample": name}))
        # A custom resource: cdk8s has no typed class for it, so its spec goes in as a JSON patch.
        domain.add_json_patch(cdk8s.JsonPatch.add("/spec", {"numNodes": 0,
                                                           "channel": {"resourceClaimTemplate": {"name": channel}}}))
        self._template(f"{name}-gpu", name, k8s.DeviceClaim(requests=[k8s.DeviceRequest(
            name="gpu", exactly=self._exact(self.classes.class_name("gpu"), 1))]))
        k8s.KubePod(self, f"{name}-pod", metadata=self._meta(name, name),
                    spec=self._pod_spec(template=f"{name}-gpu", more_templates={"channel": channel}))

    def _extended_resource_gpu(self) -> None:
        """Two GPUs asked for as the device plugin's extended resource, no claim: where DRAExtendedResource is on
        the scheduler writes an implicit claim for our GPU class (its extendedResourceName) on a DRA node."""
        self._pod("extended-resource-gpu", "extended-resource-gpu", extended={EXTENDED_RESOURCES["gpu"]: 2})

    def _device_plugin_pod(self, family: str) -> None:
        """The device-plugin alternative: an extended resource; the scheduler finds the plugin's nodes."""
        name = f"device-plugin-{family}"
        self.sample_names.append(name)
        self._pod(name, name, extended={EXTENDED_RESOURCES[family]: 1})
