"""What Kubernetes 1.36 turns on in what eks-dra generates and plans (fixture/k8s136: DRA and device-plugin GPU
groups side by side) and what stays off on 1.34 (config/dev)."""

from __future__ import annotations

import yaml


def _daemonset_env(docs, name: str) -> dict[str, str]:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == name]
    return {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0].get("env", [])}


def test_device_classes_name_the_extended_resources_only_where_the_gate_is_on():
    from charts.environments import environment, synthesized
    from charts.k8s_objects import of_kind

    from eks_dra.charts.device_classes import EXTENDED_RESOURCES
    from eks_dra.stacks.manifests import device_classes

    env = environment("fixture/k8s136")
    classes = device_classes(env)
    got = {c["metadata"]["name"]: c["spec"].get("extendedResourceName")
           for c in of_kind(synthesized("fixture/k8s136")[1], "DeviceClass")}
    assert got == {classes.class_name("gpu"): EXTENDED_RESOURCES["gpu"],
                   classes.class_name("efa"): EXTENDED_RESOURCES["efa"],
                   classes.class_name("neuron"): EXTENDED_RESOURCES["neuron"],
                   classes.class_name("mig"): None}  # one class per resource name: MIG stays claim-only
    assert not any(c["spec"].get("extendedResourceName") for c in of_kind(synthesized("config/dev")[1], "DeviceClass"))


def test_the_drivers_get_device_taints_and_dra_health_from_the_version():
    from charts.environments import synthesized

    new, old = synthesized("fixture/k8s136")[1], synthesized("config/dev")[1]
    for family in ("gpu", "efa", "neuron"):
        name = f"eks-dra-{family}-driver"
        assert _daemonset_env(new, name).items() >= {"DEVICE_TAINTS": "true", "DRA_HEALTH": "true"}.items()
        assert not {"DEVICE_TAINTS", "DRA_HEALTH"} & set(_daemonset_env(old, name))


def test_extended_resource_sample_only_where_the_gate_is_on():
    from charts.environments import synthesized

    def pods(key):
        return {d["metadata"]["name"]: d for d in synthesized(key)[1] if d["kind"] == "Pod"}

    sample = pods("fixture/k8s136")["extended-resource-gpu"]
    (container,) = sample["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2 and "resourceClaims" not in sample["spec"]
    assert "extended-resource-gpu" not in pods("config/dev")


def test_device_plugin_and_dra_never_serve_one_resource_on_one_node():
    """On 1.36 the scheduler may serve `nvidia.com/gpu` by DRA or by the device plugin; a node must only ever
    offer one of the two: the plugin runs only on device-plugin nodes, our driver only on DRA nodes, and each
    group's nodes carry exactly one manager label per family."""
    from charts.environments import environment, synthesized
    from charts.k8s_objects import pod_fits_labels

    env = environment("fixture/k8s136")
    docs = synthesized("fixture/k8s136")[1]
    plugin = [d for d in docs if d["kind"] == "DaemonSet" and "nvidia" in d["metadata"]["name"]]
    (driver,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "eks-dra-gpu-driver"]
    assert plugin
    both = []
    for group in env.node_groups:
        if "gpu" not in group.families:
            continue
        labels = env.node_labels(group)
        runs_plugin = any(pod_fits_labels(p["spec"]["template"]["spec"], labels) for p in plugin)
        runs_driver = pod_fits_labels(driver["spec"]["template"]["spec"], labels)
        assert runs_plugin != runs_driver, group.name
        both.append(runs_driver)
    assert sorted(both) == [False, True, True]  # g6-plugin; p5-dra and p4d-mig


def test_planner_gives_extended_resource_pods_the_schedulers_claim(tmp_path):
    from charts.environments import environment

    from eks_dra.planner.cel_env import CelEnvironment
    from eks_dra.planner.claims import load_manifests
    from eks_dra.planner.plan import Planner
    from eks_dra.planner.simulate import nodes_for_instance_type
    from eks_dra.stacks.manifests import device_classes

    classes = device_classes(environment("fixture/k8s136"))
    gpu_class = classes.class_name("gpu")
    docs = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": gpu_class},
         "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [
             {"cel": {"expression": f"device.driver == '{classes.driver('gpu')}'"}}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two", "namespace": "ns"},
         "spec": {"tolerations": [{"operator": "Exists"}], "containers": [
             {"name": "sidecar", "resources": {}},
             {"name": "app", "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": 2, "memory": "1Gi"}}},
             {"name": "by-class", "resources": {"limits": {f"deviceclass.resource.kubernetes.io/{gpu_class}": 1}}},
         ]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-many", "namespace": "ns"},
         "spec": {"tolerations": [{"operator": "Exists"}], "containers": [
             {"name": "app", "resources": {"limits": {"nvidia.com/gpu": 9}}}]}},
    ]
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    env = CelEnvironment()
    # Gate off (1.34/1.35): no claim; the device plugin's resource is planned on device-plugin nodes.
    assert [(p.claims, p.extended_resources) for p in load_manifests([path], env).pods] == [
        ([], {"nvidia.com/gpu": 2}), ([], {"nvidia.com/gpu": 9})]
    manifests = load_manifests([path], env, extended_resources=True)
    two, too_many = manifests.pods
    (claim,) = two.claims
    # The scheduler's request names: container index, index of the resource in the container's sorted requests.
    assert [(r.name, r.alternatives[0].count) for r in claim.spec.requests] == [
        ("container-1-request-2", 2), ("container-2-request-0", 1)]
    result = Planner(env, nodes_for_instance_type("p5.48xlarge", 1, names=classes.names)).run(manifests.pods)
    assert claim.allocated and len(claim.devices) == 3 and two.node
    assert not too_many.claims[0].allocated and "9" in (too_many.reason or "")
    assert not result.all_allocated


def test_planner_keeps_claims_off_tainted_devices_unless_they_tolerate(tmp_path):
    """`eks-dra plan --slices`: a device taint in a published slice (1.36) keeps a claim off the device, as the
    scheduler does; a request that tolerates the taint may get it."""
    from eks_dra.devices import DEFAULT_DRIVER_NAMES
    from eks_dra.drivers.families import get_family
    from eks_dra.drivers.framework.device_taints import taint_for
    from eks_dra.drivers.framework.inventory import Fault
    from eks_dra.planner.cel_env import CelEnvironment
    from eks_dra.planner.claims import load_manifests
    from eks_dra.planner.plan import Planner
    from eks_dra.planner.simulate import nodes_from_slices

    driver = DEFAULT_DRIVER_NAMES.gpu
    taint = taint_for(driver, get_family("gpu").taint_effects, Fault("xid", "XID 79 on GPU GPU-1")).to_api()
    slices = [({"spec": {"nodeName": "n", "driver": driver, "pool": {"name": "n"},
                         "devices": [{"name": "gpu-0", "taints": [taint]}, {"name": "gpu-1"}]}}, "slices.yaml")]
    assert nodes_from_slices(slices)[0].devices[0].taints == ((taint["key"], "xid", "NoExecute"),)
    request = {"deviceClassName": "gpus", "count": 2}
    tolerant = {**request, "tolerations": [{"key": taint["key"], "operator": "Exists"}]}

    def claim(name, exactly):
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}}}

    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpus"},
           "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}
    for exactly, allocated in ((request, False), (tolerant, True)):
        path = tmp_path / "claims.yaml"
        path.write_text(yaml.safe_dump_all([cls, claim("two", exactly)]))
        env = CelEnvironment()
        result = Planner(env, nodes_from_slices(slices)).run(load_manifests([path], env).pods)
        assert result.claims[0].allocated is allocated, result.claims[0].reason


def test_plan_cli_follows_the_kubernetes_version(tmp_path, capsys):
    import json

    from eks_dra import cli
    from eks_dra.devices import DEFAULT_DRIVER_NAMES

    driver = DEFAULT_DRIVER_NAMES.gpu
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump_all([
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpus"},
         "spec": {"extendedResourceName": "nvidia.com/gpu",
                  "selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
         "spec": {"tolerations": [{"operator": "Exists"}],
                  "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 3}}}]}}]))

    def plan(*extra, code=0, key="claims"):
        assert cli.main(["plan", "--instance-type", "p5.48xlarge", "--claims", str(path), "-o", "json", *extra]) == code
        return json.loads(capsys.readouterr().out)[key]

    # 1.34: the scheduler ignores extendedResourceName, and p5 nodes publish their GPUs by DRA only.
    (pod,) = plan(code=1, key="podsWithoutClaims")
    assert pod["name"] == "p" and not pod["allocated"]
    assert pod["reason"].startswith("asks for nvidia.com/gpu: 3, which only device-plugin nodes serve on Kubernetes 1.34")
    (claim,) = plan("--kubernetes-version", "1.36")
    assert claim["allocated"] and len(claim["devices"]) == 3
