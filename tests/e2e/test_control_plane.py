"""First tests of the real-control-plane tier: the control plane itself and the kubelet stand-in.

The stand-in is proven with `e2e-cluster example-plugin`, a tiny Go driver built on the upstream
k8s.io/dynamic-resource-allocation/kubeletplugin library, before any eks-dra driver is involved.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import datetime
from itertools import pairwise

import pytest
from controlplane import PREPARED_ANNOTATION, wait_until
from kubernetes import client, config
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.e2e

STATIC_DRIVER = "static.e2e.example.com"
EXAMPLE_DRIVER = "gpu.e2e.example.com"


def as_dict(call, *args, **kwargs) -> dict:
    """Call a kubernetes-client method and return the raw JSON (no model round-trip)."""
    resp = call(*args, _preload_content=False, **kwargs)
    return json.loads(resp.data)


@pytest.fixture(scope="module")
def api(control_plane) -> client.ApiClient:
    return config.new_client_from_config(str(control_plane.kubeconfig))


@pytest.fixture(scope="module")
def core(api) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def resource(api) -> client.ResourceV1Api:
    return client.ResourceV1Api(api)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def unique_driver() -> str:
    return f"{unique('static')}.e2e.example.com"


def make_namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace({"metadata": {"name": name}})
    # The serviceaccount controller (kube-controller-manager) must create "default" before pods are admitted.
    wait_until(lambda: core.read_namespaced_service_account("default", name), 60, what=f"default SA in {name}")
    return name


def make_ready_node(core: client.CoreV1Api, name: str) -> None:
    """A Node as a kubelet would register it: Ready, with capacity, without the not-ready taint."""
    core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    core.patch_node_status(
        name,
        {"status": {"capacity": capacity, "allocatable": capacity,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}},
    )  # fmt: skip
    core.patch_node(name, {"spec": {"taints": None}})


def device_class(resource: client.ResourceV1Api, name: str, driver: str) -> None:
    resource.create_device_class(
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
         "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}
    )  # fmt: skip


def slice_body(name: str, node: str, driver: str, devices: list[str]) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": d, "attributes": {"index": {"int": i}, "model": {"string": "e2e-model"}},
                 "capacity": {"memory": {"value": "16Gi"}}}
                for i, d in enumerate(devices)
            ],
        },
    }  # fmt: skip


def claim_template_and_pod(ns: str, name: str, device_class_name: str, node: str | None = None) -> tuple[dict, dict]:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class_name}}]}}
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "containers": [
                {"name": "ctr", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "terminationGracePeriodSeconds": 5,
        },
    }
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return template, pod


def generated_claim(core, resource, ns: str, pod_name: str) -> dict:
    def allocated():
        pod = as_dict(core.read_namespaced_pod, pod_name, ns)
        statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
        if not statuses or not statuses[0].get("resourceClaimName"):
            return None
        claim = as_dict(resource.read_namespaced_resource_claim, statuses[0]["resourceClaimName"], ns)
        return claim if claim.get("status", {}).get("allocation") else None

    return wait_until(allocated, 90, what=f"allocated claim of pod {ns}/{pod_name}")


def test_scheduler_allocates_device_from_slice(core, resource):
    ns = make_namespace(core, unique("e2e-sched"))
    node = unique("node-static")
    make_ready_node(core, node)
    driver = unique_driver()  # only this test's slice matches its class, whatever else the cluster holds
    dc = unique("static-gpu")
    device_class(resource, dc, driver)
    resource.create_resource_slice(slice_body(unique("slice"), node, driver, ["gpu-0", "gpu-1"]))
    template, pod = claim_template_and_pod(ns, "workload", dc)
    resource.create_namespaced_resource_claim_template(ns, template)
    core.create_namespaced_pod(ns, pod)

    claim = generated_claim(core, resource, ns, "workload")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"]) for r in results] == [(driver, node)]
    assert results[0]["device"] in {"gpu-0", "gpu-1"}
    assert claim["metadata"]["ownerReferences"][0]["name"] == "workload"  # made by the resourceclaim controller
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["workload"]
    bound = wait_until(lambda: as_dict(core.read_namespaced_pod, "workload", ns)["spec"].get("nodeName"), 60,
                       what="pod binding")  # fmt: skip
    assert bound == node


def test_dra_beta_features_are_on_as_in_1_34(core, resource):
    """DRAPrioritizedList (firstAvailable) and DRAAdminAccess are beta and on by default in 1.34."""
    ns = make_namespace(core, unique("e2e-gates"))
    node = unique("node-gates")
    make_ready_node(core, node)
    driver = unique_driver()
    dc = unique("gates-gpu")
    device_class(resource, dc, driver)
    resource.create_resource_slice(slice_body(unique("slice"), node, driver, ["gpu-0"]))
    resource.create_namespaced_resource_claim(
        ns,
        {"metadata": {"name": "prioritized"},
         "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
             {"name": "missing", "deviceClassName": dc, "selectors": [{"cel": {"expression": "device.attributes['" + driver + "'].model == 'nope'"}}]},
             {"name": "any", "deviceClassName": dc},
         ]}]}}},
    )  # fmt: skip
    _, pod = claim_template_and_pod(ns, "prioritized", dc)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "prioritized"}]
    core.create_namespaced_pod(ns, pod)
    claim = wait_until(
        lambda: (c := as_dict(resource.read_namespaced_resource_claim, "prioritized", ns)).get("status", {}).get("allocation") and c,
        60, what="allocation of the prioritized-list claim",
    )  # fmt: skip
    assert claim["status"]["allocation"]["devices"]["results"][0]["request"] == "gpu/any"

    admin_claim = {"metadata": {"name": "admin"},
                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dc, "adminAccess": True}}]}}}  # fmt: skip
    with pytest.raises(ApiException) as denied:
        resource.create_namespaced_resource_claim(ns, admin_claim)
    assert denied.value.status in (403, 422) and "admin-access" in denied.value.body
    core.patch_namespace(ns, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}})
    created = as_dict(resource.create_namespaced_resource_claim, ns, admin_claim)
    assert created["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True


def slice_policy(ns: str, sa: str) -> dict:
    """The node-restriction policy for driver-written ResourceSlices (dra-example-driver's chart, v0.2.1).

    `reason: Forbidden` turns the denial into a 403; without it the apiserver answers 422 Invalid.
    """
    user_node = "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"
    other = (
        '"this user running on node \'"+variables.userNodeName+"\' may not modify " + '
        '(variables.objectNodeName == "" ? "cluster resourceslices" : '
        '"resourceslices on node \'"+variables.objectNodeName+"\'")'
    )
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                 "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}
            ]
        },
        "matchConditions": [
            {"name": "isDriverSA", "expression": f'request.userInfo.username == "system:serviceaccount:{ns}:{sa}"'}
        ],
        "variables": [
            {"name": "userNodeName", "expression": user_node},
            {"name": "objectNodeName",
             "expression": '(request.operation == "DELETE" ? oldObject : object).spec.?nodeName.orValue("")'},
        ],
        "validations": [
            {"expression": 'variables.userNodeName != ""',
             "message": "no node association found for user, this user must run in a pod on a node and "
                        "ServiceAccountTokenPodNodeInfo must be enabled", "reason": "Forbidden"},
            {"expression": "variables.userNodeName == variables.objectNodeName", "messageExpression": other,
             "reason": "Forbidden"},
        ],
    }  # fmt: skip


def test_slice_policy_limits_driver_token_to_its_node(control_plane, api, core, resource, sa_kubeconfig_factory):
    ns, sa = unique("e2e-drv"), "driver"
    node_a, node_b = unique("node-a"), unique("node-b")
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role(
        {"metadata": {"name": ns},
         "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}
    )  # fmt: skip
    rbac.create_cluster_role_binding(
        {"metadata": {"name": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ns},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}
    )  # fmt: skip
    adm = client.AdmissionregistrationV1Api(api)
    adm.create_validating_admission_policy(
        {
            "metadata": {"name": ns},
            "spec": slice_policy(ns, sa),
        }
    )
    adm.create_validating_admission_policy_binding(
        {"metadata": {"name": ns}, "spec": {"policyName": ns, "validationActions": ["Deny"]}}
    )

    kubeconfig = sa_kubeconfig_factory(ns, sa, node_a)
    as_driver = client.ResourceV1Api(config.new_client_from_config(str(kubeconfig)))

    # Own node: allowed (retried until RBAC and the policy are picked up by the apiserver).
    wait_until(lambda: as_driver.create_resource_slice(slice_body(unique("own"), node_a, STATIC_DRIVER, ["d0"])), 30,
               what="slice create on own node")  # fmt: skip

    def denied_for_other_node():
        try:
            as_driver.create_resource_slice(slice_body(unique("other"), node_b, STATIC_DRIVER, ["d0"]))
        except ApiException as exc:
            return exc if exc.status == 403 and ns in exc.body else None
        return None

    exc = wait_until(denied_for_other_node, 30, what="the policy to deny a slice on another node")
    assert f"may not modify resourceslices on node '{node_b}'" in exc.body
    # The admin is not matched by the policy.
    resource.create_resource_slice(slice_body(unique("admin"), node_b, STATIC_DRIVER, ["d0"]))

    # The token survives an apiserver restart (same port, CA and signing key).
    control_plane.restart()
    as_driver.create_resource_slice(slice_body(unique("own-after-restart"), node_a, STATIC_DRIVER, ["d0"]))


def test_restart_keeps_objects(control_plane, core, resource):
    ns = make_namespace(core, unique("e2e-restart"))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "kept"}, "data": {"k": "v"}})
    name = unique("kept-slice")
    resource.create_resource_slice(slice_body(name, unique("node-r"), STATIC_DRIVER, ["gpu-0"]))

    control_plane.restart()

    assert core.read_namespaced_config_map("kept", ns).data == {"k": "v"}
    assert as_dict(resource.read_resource_slice, name)["spec"]["devices"][0]["name"] == "gpu-0"


@pytest.fixture
def example_node(control_plane, kubelet_factory, core, resource):
    """A node with a kubelet stand-in and the upstream-library example plugin; yields a small helper."""
    node = unique("node-ex")
    # A slice left over from an earlier life of the node: the kubelet deletes it on start.
    resource.create_resource_slice(slice_body(unique("stale"), node, EXAMPLE_DRIVER, ["old"]))
    kubelet = kubelet_factory(node)
    assert not [s for s in as_dict(resource.list_resource_slice)["items"] if s["spec"].get("nodeName") == node]
    helper = ExampleNode(control_plane, kubelet, core, resource)
    yield helper
    helper.stop_plugin()


class ExampleNode:
    def __init__(self, control_plane, kubelet, core, resource):
        self.cp, self.kubelet, self.core, self.resource = control_plane, kubelet, core, resource
        self.node = kubelet.node
        self.plugin: subprocess.Popen | None = None
        self.ns = make_namespace(core, unique("e2e-kubelet"))
        self.device_class = unique("example-gpu")
        device_class(resource, self.device_class, EXAMPLE_DRIVER)

    def start_plugin(self, *extra: str) -> None:
        log = self.kubelet.root / "example-plugin.log"
        with open(log, "ab") as out:
            self.plugin = subprocess.Popen(
                [str(self.cp.binary), "example-plugin", "--kubeconfig", str(self.cp.kubeconfig),
                 "--node", self.node, "--driver", EXAMPLE_DRIVER,
                 "--registry-dir", str(self.kubelet.registry_dir), "--plugins-dir", str(self.kubelet.plugins_dir),
                 *extra],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

        def published():
            if self.plugin.poll() is not None:
                raise AssertionError(f"example plugin exited:\n{log.read_text()}")
            return [s for s in as_dict(self.resource.list_resource_slice)["items"]
                    if s["spec"].get("nodeName") == self.node and s["spec"]["driver"] == EXAMPLE_DRIVER]  # fmt: skip

        wait_until(published, 60, what="slice published by the example plugin")

    def stop_plugin(self) -> None:
        if self.plugin and self.plugin.poll() is None:
            self.plugin.terminate()
            self.plugin.wait(10)

    def run_pod(self, name: str) -> tuple[dict, dict]:
        """Create a pod with a claim from a template on this node; return (running pod, its claim)."""
        template, pod = claim_template_and_pod(self.ns, name, self.device_class, node=self.node)
        self.resource.create_namespaced_resource_claim_template(self.ns, template)
        self.core.create_namespaced_pod(self.ns, pod)

        def running():
            p = as_dict(self.core.read_namespaced_pod, name, self.ns)
            return p if p["status"].get("phase") == "Running" else None

        try:
            p = wait_until(running, 90, what=f"pod {name} Running")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\nkubelet log:\n{self.kubelet.log_tail()}") from exc
        return p, generated_claim(self.core, self.resource, self.ns, name)

    def expected_annotation(self, claim: dict) -> dict:
        uid = claim["metadata"]["uid"]
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        return {
            uid: {
                "driver": EXAMPLE_DRIVER,
                "devices": [{"requestNames": ["gpu"], "poolName": self.node, "deviceName": device,
                             "cdiDeviceIds": [f"{EXAMPLE_DRIVER}/device={uid}-{device}"]}],
                "error": "",
            }
        }  # fmt: skip

    def unprepare_events(self, claim: dict) -> list[dict]:
        uid = claim["metadata"]["uid"]
        return [e for e in self.kubelet.events("unprepare") if [c["uid"] for c in e["claims"]] == [uid]]

    def claim_gone(self, claim: dict) -> bool:
        try:
            self.resource.read_namespaced_resource_claim(claim["metadata"]["name"], self.ns)
        except ApiException as exc:
            return exc.status == 404
        return False


def test_kubelet_stand_in_prepares_and_unprepares(example_node):
    ex = example_node
    ex.start_plugin()
    registration = ex.kubelet.wait_registered(EXAMPLE_DRIVER)
    assert registration["versions"] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert registration["endpoint"] == str(ex.kubelet.plugins_dir / EXAMPLE_DRIVER / "dra.sock")
    pod, claim = ex.run_pod("workload")
    assert 'chosenService="v1.DRAPlugin"' in ex.kubelet.log_path.read_text()
    uid = claim["metadata"]["uid"]
    assert json.loads(pod["metadata"]["annotations"][PREPARED_ANNOTATION]) == ex.expected_annotation(claim)
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"])
    # Attempts before the plugin registered fail and are retried; exactly one succeeds.
    assert [e["claims"][0]["uid"] for e in ex.kubelet.events("prepare") if not e["errors"]] == [uid]

    ex.core.delete_namespaced_pod("workload", ex.ns)
    unprepared = wait_until(lambda: ex.unprepare_events(claim), 60, what="unprepare report")
    assert unprepared[0]["claims"] == [
        {"uid": uid, "namespace": ex.ns, "name": claim["metadata"]["name"], "driver": EXAMPLE_DRIVER}
    ]
    assert unprepared[0]["errors"] == {}
    assert unprepared[0]["pod"] == f"{ex.ns}/workload"
    wait_until(lambda: ex.claim_gone(claim), 60, what="generated claim deleted by the garbage collector")


def test_kubelet_stand_in_falls_back_to_v1beta1(example_node):
    ex = example_node
    ex.start_plugin("--no-v1")
    assert ex.kubelet.wait_registered(EXAMPLE_DRIVER)["versions"] == ["v1beta1.DRAPlugin"]
    pod, claim = ex.run_pod("legacy")
    assert json.loads(pod["metadata"]["annotations"][PREPARED_ANNOTATION]) == ex.expected_annotation(claim)
    assert 'chosenService="v1beta1.DRAPlugin"' in ex.kubelet.log_path.read_text()


def test_kubelet_retries_failed_prepares_with_backoff(example_node):
    ex = example_node
    ex.start_plugin("--fail-prepares", "2")
    ex.kubelet.wait_registered(EXAMPLE_DRIVER)
    pod, claim = ex.run_pod("flaky")
    uid = claim["metadata"]["uid"]
    attempts = [e for e in ex.kubelet.events("prepare") if e["claims"][0]["uid"] == uid]
    assert [bool(e["errors"]) for e in attempts] == [True, True, False]
    assert "injected prepare failure" in attempts[0]["errors"][uid]
    times = [datetime.fromisoformat(e["time"][:26].rstrip("Z")) for e in attempts]
    gaps = [(b - a).total_seconds() for a, b in pairwise(times)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.9, gaps  # exponential backoff: 0.5 s, then 1 s
    assert json.loads(pod["metadata"]["annotations"][PREPARED_ANNOTATION]) == ex.expected_annotation(claim)


def test_kubelet_restart_unprepares_pods_deleted_while_down(example_node):
    ex = example_node
    ex.start_plugin()
    _, claim = ex.run_pod("survivor")
    ex.kubelet.stop()
    ex.core.delete_namespaced_pod("survivor", ex.ns)  # graceful: waits for the kubelet
    ex.kubelet.start()  # the checkpoint remembers the prepared claim
    ex.kubelet.wait_registered(EXAMPLE_DRIVER, count=2)  # the running plugin registers again
    unprepared = wait_until(lambda: ex.unprepare_events(claim), 60, what="unprepare after kubelet restart")
    assert unprepared[0]["errors"] == {}
    wait_until(lambda: ex.claim_gone(claim), 60, what="generated claim deleted after the pod finished")


def test_kubelet_shares_a_claim_between_pods(example_node):
    """A claim used by two pods is prepared once and unprepared only after the last pod is gone."""
    ex = example_node
    ex.start_plugin()
    ex.resource.create_namespaced_resource_claim(
        ex.ns,
        {"metadata": {"name": "shared"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": ex.device_class}}]}}},
    )  # fmt: skip
    for name in ("first", "second"):
        _, pod = claim_template_and_pod(ex.ns, name, ex.device_class, node=ex.node)
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
        ex.core.create_namespaced_pod(ex.ns, pod)
    for name in ("first", "second"):
        wait_until(lambda n=name: as_dict(ex.core.read_namespaced_pod, n, ex.ns)["status"].get("phase") == "Running",
                   60, what=f"pod {name} Running")  # fmt: skip
    claim = as_dict(ex.resource.read_namespaced_resource_claim, "shared", ex.ns)
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["first", "second"]
    assert len([e for e in ex.kubelet.events("prepare") if not e["errors"]]) == 1

    ex.core.delete_namespaced_pod("first", ex.ns)
    wait_until(lambda: not [p for p in as_dict(ex.core.list_namespaced_pod, ex.ns)["items"]
                            if p["metadata"]["name"] == "first"], 60, what="first pod gone")  # fmt: skip
    assert ex.unprepare_events(claim) == []
    ex.core.delete_namespaced_pod("second", ex.ns)
    unprepared = wait_until(lambda: ex.unprepare_events(claim), 60, what="unprepare after the last pod")
    assert unprepared[0]["pod"] == f"{ex.ns}/second"
