"""JobSet and LeaderWorkerSet made into pods by their real controllers, compared with `eks-dra plan`.

One module-scoped cluster: the dev drivers' and DeviceClass manifests, a p5.48xlarge node (8 GPUs) and a
trn2.48xlarge node (16 Neuron devices) with kubelet stand-ins and our driver processes, and the controllers
of sigs.k8s.io/jobset v0.8.2 and sigs.k8s.io/lws v0.7.0 (tests/e2e/build_controllers.sh) running against the
API server with their CRDs and their own admission webhooks (defaulting and validation of the workloads and
of their pods, called by the API server through a URL webhook configuration). The Job and StatefulSet
controllers of kube-controller-manager make the pods, the resourceclaim controller their claims, and the real
scheduler allocates them on our drivers' slices. `eks-dra plan` then plans the same manifests on the same
slices, and every pod's node and devices (count per driver) must be what the scheduler gave it.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import os
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from controlplane import wait_until
from helpers import (
    BIN,
    DevCluster,
    apply_objects,
    as_dict,
    delete_objects,
    load_documents,
    namespace_object,
    pod_running,
    unschedulable,
)
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from eks_dra.devices import DEFAULT_DRIVER_NAMES

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-ml-controllers"
P5, TRN2 = "ml-p5-0", "ml-trn2-0"
GPU, NEURON = DEFAULT_DRIVER_NAMES.for_family("gpu"), DEFAULT_DRIVER_NAMES.for_family("neuron")

# What each controller needs: its config file's API group, the prefix its release's kustomization gives its
# webhook configurations, and the CRD it serves.
CONTROLLERS = {
    "jobset": {"config": "config.jobset.x-k8s.io/v1alpha1", "prefix": "jobset-", "crd": "jobsets.jobset.x-k8s.io"},
    "lws": {"config": "config.lws.x-k8s.io/v1alpha1", "prefix": "lws-",
            "crd": "leaderworkersets.leaderworkerset.x-k8s.io"},
}


# --- the controllers -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving_certificate(cert_dir: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 in cert_dir (tls.crt, tls.key, as controller-runtime's
    webhook server reads them); returns the CA's PEM for the webhook configurations' caBundle."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2e-ml-controllers-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # fmt: skip
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (cert_dir / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM)


def webhook_configurations(build: Path, prefix: str, port: int, ca: bytes) -> list[dict]:
    """The module's webhook configurations, named as its release names them, calling the process on 127.0.0.1
    (a URL instead of the in-cluster Service) and only for objects in this test's namespace (the control plane
    is shared by the session: no other pod may depend on this controller being up)."""
    out = []
    for doc in load_documents([build / "webhook.yaml"]):
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = prefix + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca).decode()}
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
        out.append(doc)
    return out


class ControllerProcess:
    """One controller manager with its CRDs and webhook configurations applied, as the admin user."""

    def __init__(self, name: str, build: Path, kubeconfig: Path, api: client.ApiClient, workdir: Path) -> None:
        self.name, self.build, self.kubeconfig, self.api = name, build, kubeconfig, api
        self.workdir = workdir / name
        self.log_path = self.workdir / "manager.log"
        self.proc: subprocess.Popen | None = None
        self.webhooks: list[dict] = []
        self.crds = load_documents(sorted((build / "crds").glob("*.yaml")))

    def start(self) -> None:
        info = CONTROLLERS[self.name]
        apply_objects(self.api, self.crds)
        ext = client.ApiextensionsV1Api(self.api)
        wait_until(lambda: any(c["type"] == "Established" and c["status"] == "True" for c in
                               as_dict(ext.read_custom_resource_definition, info["crd"]).get("status", {}).get("conditions", [])),
                   30, what=f"CRD {info['crd']} established")  # fmt: skip
        ca = serving_certificate(self.workdir / "certs")
        port = free_port()
        config = {"apiVersion": info["config"], "kind": "Configuration", "leaderElection": {"leaderElect": False},
                  "internalCertManagement": {"enable": False},  # its cert rotator writes a Secret for a Service
                  "webhook": {"host": "127.0.0.1", "port": port, "certDir": str(self.workdir / "certs")},
                  "metrics": {"bindAddress": "0"}, "health": {"healthProbeBindAddress": "0"}}  # fmt: skip
        (self.workdir / "config.yaml").write_text(yaml.safe_dump(config))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(self.build / "manager"), "--config", str(self.workdir / "config.yaml"),
                                          "--leader-elect=false", "--zap-log-level=info"],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})

        def serving():
            assert self.proc.poll() is None, f"{self.name} controller exited:\n{self.log_tail()}"
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(serving, 60, interval=0.3, what=f"{self.name} webhook server on 127.0.0.1:{port}")
        self.webhooks = webhook_configurations(self.build, info["prefix"], port, ca)
        apply_objects(self.api, self.webhooks)

    def stop(self) -> None:
        # The webhook configurations go first: with the process gone they would refuse every matching request.
        delete_objects(self.api, self.webhooks)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        delete_objects(self.api, self.crds)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class MLCluster(DevCluster):
    """The simulated nodes with our drivers, and the workload controllers by name."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.controllers: dict[str, ControllerProcess] = {}


@pytest.fixture(scope="module")
def ml(control_plane, e2e_binary, ml_controller_builds, tmp_path_factory, request):
    workdir = tmp_path_factory.mktemp("ml-controllers")
    cluster = MLCluster(control_plane, e2e_binary, workdir, nodes={P5: "p5-dra", TRN2: "trn2-dra"})
    failed_before = request.session.testsfailed
    try:
        cluster.apply_manifests(lambda path: "samples" not in path.name)  # drivers' charts and DeviceClasses
        cluster.create_nodes()
        cluster.start_nodes()
        apply_objects(cluster.api, [namespace_object(NAMESPACE)])
        for name, build in ml_controller_builds.items():
            cluster.controllers[name] = ControllerProcess(name, build, control_plane.kubeconfig, cluster.api, workdir)
            cluster.controllers[name].start()
        cluster.wait_drivers_ready()
        yield cluster
    finally:
        try:
            delete_objects(cluster.api, [namespace_object(NAMESPACE)])
            wait_until(lambda: not namespace_exists(cluster), 90, what=f"namespace {NAMESPACE} deleted")
        finally:
            for c in reversed(cluster.controllers.values()):
                c.stop()
            cluster.stop()
            keep = request.session.testsfailed > failed_before or os.environ.get("E2E_KEEP") == "1"
            cluster.remove(keep_dirs=keep)


def namespace_exists(cluster: MLCluster) -> bool:
    try:
        cluster.core.read_namespace(NAMESPACE)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


# --- the workloads -------------------------------------------------------------------------------------

def claim_template(name: str, driver: str, count: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "devices", "exactly": {"deviceClassName": driver, "count": count}}]}}}}  # fmt: skip


def pod_template(template: str, **spec) -> dict:
    return {"spec": {**spec, "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "devices"}]}}]}}  # fmt: skip


def jobset(name: str, jobs: list[tuple[str, int, int, str]]) -> dict:
    """A JobSet of (replicated job, replicas, pods per Job, claim template); parallelism = completions."""
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicatedJobs": [
                {"name": job, "replicas": replicas,
                 "template": {"spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                                       "template": pod_template(template, restartPolicy="Never")}}}
                for job, replicas, pods, template in jobs]}}  # fmt: skip


def leader_worker_set(name: str, replicas: int, size: int, leader_template: str, worker_template: str) -> dict:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                "size": size, "leaderTemplate": pod_template(leader_template),
                "workerTemplate": pod_template(worker_template)}}}  # fmt: skip


CLAIM_TEMPLATES = {t["metadata"]["name"]: t for t in (
    claim_template("one-gpu", GPU, 1), claim_template("two-gpus", GPU, 2),
    claim_template("two-neuron", NEURON, 2), claim_template("four-neuron", NEURON, 4))}


def templates_of(workload: dict) -> list[dict]:
    """The claim templates the workload's pods use. Only those go to the planner: it gives a template that no pod
    of its files uses a pod of its own, which would take devices that the workload's pods get in the cluster."""
    used = set(re.findall(r'"resourceClaimTemplateName": "([^"]+)"', json.dumps(workload)))
    return [t for name, t in CLAIM_TEMPLATES.items() if name in used]


def planner_pod_name(pod: dict) -> str:
    """The name `eks-dra plan` gives a controller's pod: a JobSet's `<set>-<job>-<jobIndex>-<podIndex>` (the real
    pod adds a random suffix to its Job's name and completion index), a LeaderWorkerSet's its StatefulSet name."""
    labels = pod["metadata"].get("labels") or {}
    if "jobset.sigs.k8s.io/jobset-name" in labels:
        return "-".join([labels["jobset.sigs.k8s.io/jobset-name"], labels["jobset.sigs.k8s.io/replicatedjob-name"],
                         labels["jobset.sigs.k8s.io/job-index"], labels["batch.kubernetes.io/job-completion-index"]])
    return pod["metadata"]["name"]


def scheduled(ml: MLCluster) -> dict[str, tuple[str | None, Counter]]:
    """Planner pod name -> (node, devices per driver) as the scheduler allocated them; (None, {}) while pending."""
    out = {}
    for pod in ml.pods(NAMESPACE):
        node = pod["spec"].get("nodeName")
        devices: Counter = Counter()
        if node:
            for claim in ml.pod_claims(pod):
                allocation = (claim.get("status") or {}).get("allocation") or {}
                devices.update(r["driver"] for r in allocation.get("devices", {}).get("results", []))
        out[planner_pod_name(pod)] = (node, devices)
    return out


def run_plan(ml: MLCluster, tmp_path: Path, workload: dict) -> tuple[int, dict, str]:
    """`eks-dra plan` of the workload and its claim templates on the cluster's slices: (exit code, JSON, text)."""
    slices = tmp_path / "slices.yaml"
    slices.write_text(yaml.safe_dump_all(
        [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s} for s in ml.slices()]))
    manifests = tmp_path / "workload.yaml"
    manifests.write_text(yaml.safe_dump_all([*templates_of(workload), workload]))
    classes = [p for p in ml.manifest_paths if "device-classes" in p.name]
    argv = [str(BIN / "eks-dra"), "plan", "--slices", str(slices), "--claims", *map(str, classes), str(manifests)]
    as_json = subprocess.run([*argv, "--output", "json"], capture_output=True, text=True, timeout=120)
    as_text = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert as_json.returncode in (0, 1), as_json.stderr
    return as_json.returncode, json.loads(as_json.stdout), as_text.stdout


def planned(plan: dict) -> dict[str, tuple[str | None, Counter]]:
    """Planner pod name -> (node, devices per driver) of its claims; (None, {}) for a pod not placed."""
    out: dict[str, tuple[str | None, Counter]] = {}
    for c in plan["claims"]:
        assert c["pod"] is not None, f"claim {c['name']} of no workload pod: {c}"
        node, devices = out.get(c["pod"], (None, Counter()))
        if c["allocated"]:
            node = c["node"]
            devices = devices + Counter(d["driver"] for d in c["devices"])
        out[c["pod"]] = (node, devices)
    return out


def run_workload(ml: MLCluster, workload: dict, pods: int, running: int) -> dict[str, tuple[str | None, Counter]]:
    """Create the workload through its controller; wait for `pods` pods, `running` of them Running and the
    rest refused by the scheduler; returns what the scheduler gave each."""
    apply_objects(ml.api, [*templates_of(workload), workload])

    def settled():
        items = ml.pods(NAMESPACE)
        up = [p for p in items if pod_running(p)]
        waiting = [p for p in items if not p["spec"].get("nodeName") and unschedulable(p)]
        return items if len(items) == pods and len(up) == running and len(waiting) == pods - running else None

    try:
        wait_until(settled, 90, interval=0.5, what=f"{workload['kind']} {workload['metadata']['name']}: "
                                                   f"{pods} pods, {running} Running")
    except TimeoutError as exc:
        phases = Counter((p.get("status") or {}).get("phase") for p in ml.pods(NAMESPACE))
        logs = "".join(f"\n{c.name} controller log:\n{c.log_tail(15)}" for c in ml.controllers.values())
        raise AssertionError(f"{exc}; pods by phase {dict(phases)}{logs}") from exc
    # Still so a moment later: nothing else was going to be placed.
    time.sleep(2)
    assert settled(), "the pods changed after they had settled"
    return scheduled(ml)


def stored(ml: MLCluster, workload: dict) -> dict:
    """The workload as the API server keeps it (after the controller's defaulting webhook)."""
    dyn = dynamic.DynamicClient(ml.api)
    resource = dyn.resources.get(api_version=workload["apiVersion"], kind=workload["kind"])
    return resource.get(name=workload["metadata"]["name"], namespace=NAMESPACE).to_dict()


def remove_workload(ml: MLCluster, workload: dict) -> None:
    """Delete the workload; its Jobs or StatefulSets, pods and claims go with it (garbage collector), and the
    devices are free for the next test."""
    dyn = dynamic.DynamicClient(ml.api)
    dyn.resources.get(api_version=workload["apiVersion"], kind=workload["kind"]).delete(
        name=workload["metadata"]["name"], namespace=NAMESPACE, body={"propagationPolicy": "Background"})
    wait_until(lambda: not ml.pods(NAMESPACE) and not ml.claims(NAMESPACE), 90, interval=0.5,
               what=f"pods and claims of {workload['kind']} {workload['metadata']['name']} gone")


def assert_same_placement(real: dict, plan_pods: dict) -> None:
    assert set(real) == set(plan_pods), (sorted(real), sorted(plan_pods))
    for name in sorted(real):
        assert real[name] == plan_pods[name], f"pod {name}: scheduler {real[name]}, planner {plan_pods[name]}"


# --- the tests -----------------------------------------------------------------------------------------

def test_jobset_that_fits_gets_the_planned_devices_for_every_pod(ml, tmp_path):
    # 2 Jobs of 2 pods with 2 GPUs each (8 GPUs, the whole p5 node) and 1 Job of 3 pods with 4 Neuron devices.
    workload = jobset("fits", [("gpu", 2, 2, "two-gpus"), ("neuron", 1, 3, "four-neuron")])
    try:
        real = run_workload(ml, workload, pods=7, running=7)
        defaulted = stored(ml, workload)
        code, plan, _ = run_plan(ml, tmp_path, workload)
    finally:
        remove_workload(ml, workload)
    # The JobSet webhook's defaults (pkg/webhooks/jobset_webhook.go): the API server did call it.
    assert defaulted["spec"]["successPolicy"]["operator"] == "All"
    assert {j["template"]["spec"]["completionMode"] for j in defaulted["spec"]["replicatedJobs"]} == {"Indexed"}
    assert code == 0, plan
    assert_same_placement(real, planned(plan))
    assert Counter(node for node, _ in real.values()) == {P5: 4, TRN2: 3}
    assert all(devices == ({GPU: 2} if node == P5 else {NEURON: 4}) for node, devices in real.values())
    (summary,) = plan["summary"]["workloads"]
    assert (summary["kind"], summary["pods"], summary["podsPlaced"]) == ("JobSet", 7, 7)


def test_jobset_too_big_places_as_many_pods_as_the_plan_would_start(ml, tmp_path):
    """Without a gang scheduler the real scheduler places each pod on its own: 8 of the 12 one-GPU pods get a
    GPU, 4 stay Pending. The planner treats the JobSet as one gang and says it would start the same 8."""
    workload = jobset("too-big", [("gpu", 3, 4, "one-gpu")])
    try:
        real = run_workload(ml, workload, pods=12, running=8)
        code, plan, text = run_plan(ml, tmp_path, workload)
    finally:
        remove_workload(ml, workload)
    started = sum(1 for node, _ in real.values() if node)
    assert started == 8 and all(devices == {GPU: 1} for node, devices in real.values() if node)
    assert code == 1
    gang = f"JobSet {NAMESPACE}/too-big"
    assert f"{gang}: would start {started} of 12 pods and wait" in text, text
    plan_pods = planned(plan)
    assert set(plan_pods) == set(real)
    # The gang waits as a whole: no pod of it holds devices in the plan.
    assert all(node is None for node, _ in plan_pods.values())
    reasons = {c["reason"] for c in plan["claims"]}
    assert all(re.search(rf"gang {re.escape(gang)} would start {started} of 12 pods and wait", r) for r in reasons), reasons


def test_leader_worker_set_groups_get_the_planned_devices_for_every_pod(ml, tmp_path):
    # 2 groups of a leader with 2 Neuron devices and 2 workers with 2 GPUs each.
    workload = leader_worker_set("lws", replicas=2, size=3, leader_template="two-neuron", worker_template="two-gpus")
    try:
        real = run_workload(ml, workload, pods=6, running=6)
        # The LWS pod webhook (pkg/webhooks/pod_webhook.go) labels each leader with its group's key.
        leaders = [p for p in ml.pods(NAMESPACE) if p["metadata"]["name"] in ("lws-0", "lws-1")]
        assert all("leaderworkerset.sigs.k8s.io/group-key" in p["metadata"]["labels"] for p in leaders), leaders
        code, plan, _ = run_plan(ml, tmp_path, workload)
    finally:
        remove_workload(ml, workload)
    assert sorted(real) == ["lws-0", "lws-0-1", "lws-0-2", "lws-1", "lws-1-1", "lws-1-2"]
    assert code == 0, plan
    assert_same_placement(real, planned(plan))
    assert real["lws-0"] == (TRN2, {NEURON: 2}) and real["lws-1-2"] == (P5, {GPU: 2})
