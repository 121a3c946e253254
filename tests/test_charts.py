"""The cdk8s charts: strict 1.34 schemas, driver identity and admission, DaemonSet shape, label consistency."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from charts.environments import ALL, SHIPPED, environment, synthesized
from charts.k8s_objects import of_kind, pod_fits_labels, tolerates

from eks_dra.charts.driver_chart import HEALTH_PORTS
from eks_dra.config import GPU_TAINT, NEURON_TAINT

# Custom resources of the vendor charts, validated against their CRD's schema (a verbatim copy in tests/data/crds).
CRD_SCHEMAS = {("resource.nvidia.com/v1beta1", "ComputeDomain"): "resource.nvidia.com_computedomains.yaml"}


def _crd_schema(file: str) -> dict:
    crd = yaml.safe_load((Path(__file__).parent / "data" / "crds" / file).read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("key", ALL)
def test_every_manifest_validates_against_strict_1_34_schemas(key: str) -> None:
    _, docs = synthesized(key)
    assert docs
    for doc in docs:
        crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        try:
            if crd:
                jsonschema.validate(doc, _crd_schema(crd))
            else:
                kubernetes_validate.validate(doc, "1.34", strict=True)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            pytest.fail(f"{key}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_dev_writes_one_file_per_chart_in_apply_order() -> None:
    paths, _ = synthesized("config/dev")
    assert [p.name for p in paths] == [
        "0000-eks-dra-system.k8s.yaml", "0001-eks-dra-driver-gpu.k8s.yaml", "0002-eks-dra-driver-efa.k8s.yaml",
        "0003-eks-dra-driver-neuron.k8s.yaml", "0004-eks-dra-device-classes.k8s.yaml",
        "0005-eks-dra-device-plugins.k8s.yaml", "0006-dra-samples.k8s.yaml"]


def test_shipped_environments_exist() -> None:
    assert "dev" in SHIPPED


def _driver_daemon_sets(docs) -> list[dict]:
    return [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["namespace"] == "eks-dra-system"]


@pytest.mark.parametrize("key", ALL)
def test_admission_policies_match_the_daemon_set_service_account(key: str) -> None:
    _, docs = synthesized(key)
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in of_kind(docs, "ServiceAccount")}
    for ds in _driver_daemon_sets(docs):
        ns, sa = ds["metadata"]["namespace"], ds["spec"]["template"]["spec"]["serviceAccountName"]
        assert (ns, sa) in accounts
        user = f"system:serviceaccount:{ns}:{sa}"
        policies = [p for p in of_kind(docs, "ValidatingAdmissionPolicy") if p["metadata"]["name"].startswith(sa)]
        assert {p["metadata"]["name"] for p in policies} == {f"{sa}-slices", f"{sa}-node-taint"}
        for policy in policies:
            conditions = [c["expression"] for c in policy["spec"]["matchConditions"]]
            assert [re.findall(r"username == '([^']+)'", c) for c in conditions] == [[user]]
        bindings = {b["spec"]["policyName"]: b["spec"]["validationActions"]
                    for b in of_kind(docs, "ValidatingAdmissionPolicyBinding")}
        assert all(bindings[p["metadata"]["name"]] == ["Deny"] for p in policies)
        crb = next(b for b in of_kind(docs, "ClusterRoleBinding") if b["metadata"]["name"] == sa)
        assert crb["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]


def test_cluster_role_is_least_privilege() -> None:
    _, docs = synthesized("config/dev")
    role = next(r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"] == "eks-dra-gpu-driver")
    grants = {(g, r): sorted(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"]}
    assert grants == {
        ("resource.k8s.io", "resourceslices"): sorted(["get", "list", "watch", "create", "update", "patch", "delete"]),
        ("resource.k8s.io", "resourceclaims"): ["get", "list", "watch"],
        ("", "nodes"): ["get", "patch"],
        ("", "pods"): ["list"],
        ("", "events"): ["create", "patch"],
        ("events.k8s.io", "events"): ["create", "patch"],
    }


def test_driver_daemon_set_follows_the_runtime_contract() -> None:
    _, docs = synthesized("config/dev")
    by_family = {ds["spec"]["template"]["spec"]["containers"][0]["command"][1]: ds for ds in _driver_daemon_sets(docs)}
    assert set(by_family) == {"gpu", "efa", "neuron"}
    for family, ds in by_family.items():
        spec = ds["spec"]
        pod = spec["template"]["spec"]
        (c,) = pod["containers"]
        assert c["command"] == ["eks-dra-driver", family]
        assert c["image"] == "eks-dra-driver:0.1.0"
        assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1,
                                                                                    "maxUnavailable": 0}}
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
        assert env["HOST_ROOT"] == "/host" and env["CDI_ROOT"] == "/var/run/cdi"
        assert env["HEALTH_PORT"] == str(HEALTH_PORTS[family])
        assert c["livenessProbe"]["grpc"] == {"port": HEALTH_PORTS[family], "service": "liveness"}
        assert pod["priorityClassName"] == "system-node-critical"
        assert not pod.get("hostNetwork"), "surge pods of a rolling update would collide on host ports"
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        common = {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi", "/host"}
        # gpu: the NVIDIA driver root at /driver-root (NVML, nvidia-smi by explicit path), as the upstream chart
        assert set(mounts) == (common | {"/driver-root"} if family == "gpu" else common)
        assert mounts["/host"]["readOnly"] is True
        volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
        assert volumes[mounts["/host"]["name"]] == "/"
        if family == "gpu":
            assert volumes[mounts["/driver-root"]["name"]] == "/" and mounts["/driver-root"]["readOnly"] is True
            assert env["NVIDIA_DRIVER_ROOT"] == "/" and env["CONTAINER_DRIVER_ROOT"] == "/driver-root"
            assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # no nvidia-runtime injection into the plugin itself
        else:
            assert "NVIDIA_VISIBLE_DEVICES" not in env
        assert c["resources"]["requests"] and c["resources"]["limits"]
        sc = c["securityContext"]
        if family in ("gpu", "efa"):  # NVML device nodes; EFA also runs on dev's Bottlerocket g6e group
            assert sc["privileged"] is True
        else:
            assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["allowPrivilegeEscalation"] is False


def test_custom_driver_names_reach_classes_policies_and_tolerations() -> None:
    _, docs = synthesized("fixture/names")
    classes = {d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"] for d in of_kind(docs, "DeviceClass")}
    assert classes["gpu.example.com"] == ("device.driver == 'gpu.example.com' && "
                                          "device.attributes['gpu.example.com'].type == 'gpu'")
    # no MIG class: no node group there has MIG devices, so it could match nothing
    assert set(classes) == {"gpu.example.com", "efa.example.com", "neuron.example.com"}
    policy = next(p for p in of_kind(docs, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == "eks-dra-efa-driver-slices")
    assert "variables.slice.spec.driver == 'efa.example.com'" in [v["expression"] for v in policy["spec"]["validations"]]
    ds = next(d for d in _driver_daemon_sets(docs) if d["metadata"]["name"] == "eks-dra-efa-driver")
    assert "--driver-name=efa.example.com" in ds["spec"]["template"]["spec"]["containers"][0]["args"]


# --- label consistency: which node groups each manager lands on ------------------------------------

def _managers_per_group(key: str) -> dict[tuple[str, str], list[str]]:
    """(node group, family) -> names of the DaemonSets managing that family there (from their affinity)."""
    env = environment(key)
    _, docs = synthesized(key)
    found: dict[tuple[str, str], list[str]] = {}
    for ds in of_kind(docs, "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        family = _family_of(pod)
        for group in env.node_groups:
            if pod_fits_labels(pod, env.node_labels(group)):
                found.setdefault((group.name, family), []).append(ds["metadata"]["name"])
    return found


def _family_of(pod: dict) -> str:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (key,) = {e["key"] for t in terms for e in t["matchExpressions"]}
    return key.removeprefix("eks-dra.io/")


@pytest.mark.parametrize("key", ALL)
def test_no_node_group_is_managed_twice_for_one_family(key: str) -> None:
    for (group, family), managers in _managers_per_group(key).items():
        assert len(managers) == 1, f"{key}: node group {group} has two {family} managers: {managers}"


@pytest.mark.parametrize("key", ALL)
def test_every_family_of_every_group_gets_exactly_its_manager(key: str) -> None:
    env = environment(key)
    found = _managers_per_group(key)
    for group in env.node_groups:
        for family in group.families:
            if group.manager(family) == "dra" and env.drivers.implementation(family) == "upstream":
                assert (group.name, family) not in found  # the vendor chart runs there instead
                continue
            managers = found.get((group.name, family), [])
            expected = f"eks-dra-{family}-driver" if group.manager(family) == "dra" else None
            assert len(managers) == 1, f"{key}: {group.name} {family}: {managers}"
            if expected:
                assert managers == [expected]
    # and nothing is matched where the family is absent (system groups, efa: off)
    for group_name, family in found:
        group = next(g for g in env.node_groups if g.name == group_name)
        assert family in group.families


@pytest.mark.parametrize("key", ALL)
def test_node_agents_tolerate_every_taint_eks_dra_puts_on_their_nodes(key: str) -> None:
    """A driver must start while its own and the other drivers' readiness taints are still on the node."""
    env = environment(key)
    _, docs = synthesized(key)
    for ds in of_kind(docs, "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        for group in env.node_groups:
            if not pod_fits_labels(pod, env.node_labels(group)):
                continue
            for taint in env.node_taints(group):
                if taint.key in (GPU_TAINT, NEURON_TAINT) or taint.key.endswith("/not-ready"):
                    assert tolerates(pod, taint.key, taint.effect), (ds["metadata"]["name"], group.name, taint)


@pytest.mark.parametrize("key", ALL)
def test_sample_pods_wait_for_the_drivers(key: str) -> None:
    """Samples tolerate the accelerator taints but never a readiness taint."""
    _, docs = synthesized(key)
    pods = [p["spec"] for p in of_kind(docs, "Pod")] + [j["spec"]["template"]["spec"] for j in of_kind(docs, "Job")]
    assert pods
    for pod in pods:
        assert tolerates(pod, GPU_TAINT, "NoSchedule") and tolerates(pod, NEURON_TAINT, "NoSchedule")
        assert not tolerates(pod, "gpu.nvidia.com/not-ready", "NoSchedule")


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}


@pytest.mark.parametrize("key", ALL)
def test_namespaced_objects_name_their_namespace_and_cluster_objects_do_not(key: str) -> None:
    """`kubectl apply -f dist/<env>/` must not drop anything into the default namespace."""
    _, docs = synthesized(key)
    namespaces = {d["metadata"]["name"] for d in of_kind(docs, "Namespace")} | {"kube-system"}
    for doc in docs:
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] in namespaces, doc["metadata"]


@pytest.mark.parametrize("key", ["config/dev", "fixture/names"])
def test_daemon_set_command_and_env_parse_with_the_driver_cli(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the DaemonSet runs is accepted by `eks-dra-driver` and yields the intended configuration."""
    from eks_dra.drivers import main as driver_main

    env = environment(key)
    _, docs = synthesized(key)
    for ds in _driver_daemon_sets(docs):
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        downward = {"spec.nodeName": "ip-10-0-0-1.ec2.internal", "metadata.uid": "0f1e2d3c-pod-uid"}
        for var in c["env"]:
            value = var["value"] if "value" in var else downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
            monkeypatch.setenv(var["name"], value)
        assert c["command"][0] == "eks-dra-driver"
        config = driver_main.config_from_args(driver_main.build_parser().parse_args(c["command"][1:] + c["args"]))
        family = config.family
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert config.driver_name == env.drivers.names.for_family(family)
        assert (config.node_name, config.pod_uid) == ("ip-10-0-0-1.ec2.internal", "0f1e2d3c-pod-uid")
        assert (config.health_port, config.metrics_port) == (ports["health"], ports["metrics"])
        assert config.health_address == "0.0.0.0"  # the kubelet's gRPC probe dials the pod IP
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {str(config.host_root), str(config.plugins_dir), str(config.registry_dir), str(config.cdi_root)} <= mounts


def test_efa_and_neuron_drivers_run_unprivileged_without_bottlerocket() -> None:
    _, docs = synthesized("fixture/names")  # AL2023 only
    for ds in _driver_daemon_sets(docs):
        sc = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        privileged = ds["metadata"]["name"] == "eks-dra-gpu-driver"
        assert sc["privileged"] is privileged, ds["metadata"]["name"]
        if not privileged:
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
