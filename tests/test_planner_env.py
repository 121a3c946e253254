"""eks-dra plan -c env=NAME (node groups from the environment config), eks-dra slices, and the import boundary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from eks_dra import cli
from eks_dra.config import load_environment
from eks_dra.devices import DEFAULT_DRIVER_NAMES
from eks_dra.planner.simulate import nodes_for_environment

REPO = Path(__file__).resolve().parents[1]
CLASSES = Path(__file__).parent / "planner" / "classes.yaml"


def test_environment_nodes_are_its_accelerator_groups_at_max_size():
    nodes = nodes_for_environment(load_environment("dev", REPO / "config"))
    # dev: system (no accelerator) is left out; g6-device-plugin publishes nothing, its plugins advertise.
    assert [n.name for n in nodes] == ["p5-dra-0", "p5-dra-1", "trn2-dra-0", "trn2-dra-1", "g6e-bottlerocket-0",
                                       "p4d-mig-0", "g6-device-plugin-0"]
    assert not nodes[-1].devices and nodes[-1].extended == {"nvidia.com/gpu": 4, "vpc.amazonaws.com/efa": 1}
    p5 = nodes[0]
    assert sorted({d.driver for d in p5.devices}) == ["dra.net", "gpu.nvidia.com"]
    assert p5.labels["eks-dra.io/node-group"] == "p5-dra" and p5.labels["eks-dra.io/gpu"] == "dra"
    assert ("nvidia.com/gpu", "true", "NoSchedule") in p5.taints
    assert not any(key.endswith("/not-ready") for key, _, _ in p5.taints)  # removed by the driver once ready
    mig = nodes[-2]
    assert mig.mig_profile == "1g.5gb" and sum(d.attributes.get("type") == "mig" for d in mig.devices) == 56


def _dist(tmp_path: Path, env: str, *docs: dict) -> Path:
    dist = tmp_path / "dist"
    (dist / env).mkdir(parents=True)
    (dist / env / "0000-classes.k8s.yaml").write_text(CLASSES.read_text())
    (dist / env / "0001-samples.k8s.yaml").write_text(yaml.safe_dump_all(docs))
    return dist


def _claim(name: str, cls: str, count: int = 1, namespace: str = "dra-samples") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": cls, "count": count}}]}}}


def test_plan_environment_places_claims_on_its_node_groups(tmp_path, capsys):
    ignored = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "eks-dra-gpu"}, "spec": {}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "on-trn2", "namespace": "dra-samples"},
           "spec": {"nodeSelector": {"eks-dra.io/node-group": "trn2-dra"},
                    "tolerations": [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}],
                    "resourceClaims": [{"name": "n", "resourceClaimName": "neurons"}], "containers": []}}
    dist = _dist(tmp_path, "dev", ignored, _claim("eight-h100", "gpu.nvidia.com", 8),
                 _claim("eight-h100-more", "gpu.nvidia.com", 8), _claim("mig", "mig.nvidia.com", 7),
                 _claim("neurons", "neuron.aws.com", 16), pod)
    code = cli.main(["plan", "-c", "env=dev", "--config-dir", str(REPO / "config"), "--dist-dir", str(dist),
                     "-o", "json"])
    claims = {c["name"]: c for c in json.loads(capsys.readouterr().out)["claims"]}
    assert code == 0
    assert claims["eight-h100"]["node"] == "p5-dra-0" and claims["eight-h100-more"]["node"] == "p5-dra-1"
    assert claims["mig"]["node"] == "p4d-mig-0"
    assert claims["neurons"]["node"] == "trn2-dra-0"


def test_plan_environment_fails_when_a_sample_cannot_be_allocated(tmp_path, capsys):
    dist = _dist(tmp_path, "dev", _claim("too-big", "gpu.nvidia.com", 9))
    assert cli.main(["plan", "-c", "env=dev", "--config-dir", str(REPO / "config"), "--dist-dir", str(dist)]) == 1
    out = capsys.readouterr().out
    assert "count 9 exceeds the 8 matching devices of p5.48xlarge" in out
    assert "count 9 exceeds the 8 matching devices of p4d.24xlarge (MIG 1g.5gb)" not in out  # no GPU class match
    assert "no device of p4d.24xlarge (MIG 1g.5gb) matches DeviceClass gpu.nvidia.com" in out


def test_plan_environment_without_synthesized_manifests(tmp_path, capsys):
    assert cli.main(["plan", "-c", "env=dev", "--config-dir", str(REPO / "config"),
                     "--dist-dir", str(tmp_path / "dist")]) == 2
    assert "run `make synth ENV=dev` first" in capsys.readouterr().err


def test_plan_environment_uses_its_driver_names(tmp_path, capsys):
    config = tmp_path / "config"
    config.mkdir()
    (config / "names.yaml").write_text(yaml.safe_dump({
        "region": "us-east-2", "clusterName": "names", "kubernetesVersion": "1.34",
        "drivers": {"names": {"gpu": "gpu.example.com"}},
        "nodeGroups": [{"name": "system", "instanceType": "m7i.xlarge", "maxSize": 2},
                       {"name": "p5", "instanceType": "p5.48xlarge", "maxSize": 1}]}))
    dist = tmp_path / "dist"
    (dist / "names").mkdir(parents=True)
    (dist / "names" / "all.k8s.yaml").write_text(
        CLASSES.read_text().replace("gpu.nvidia.com", "gpu.example.com") + "---\n"
        + yaml.safe_dump(_claim("g", "gpu.example.com")))
    assert cli.main(["plan", "-c", "env=names", "--config-dir", str(config), "--dist-dir", str(dist),
                     "-o", "json"]) == 0
    device = json.loads(capsys.readouterr().out)["claims"][0]["devices"][0]
    assert (device["driver"], device["pool"], device["device"]) == ("gpu.example.com", "p5-0", "gpu-0")


def test_plan_rejects_both_modes(capsys):
    assert cli.main(["plan", "-c", "env=dev", "--instance-type", "p5.48xlarge"]) == 2
    assert "not both" in capsys.readouterr().err


def test_slices_prints_resource_slices(capsys):
    assert cli.main(["slices", "--instance-type", "p5.48xlarge", "--node-name", "ip-10-0-0-1"]) == 0
    slices = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(s["kind"], s["spec"]["driver"], s["spec"]["nodeName"], len(s["spec"]["devices"])) for s in slices] == [
        ("ResourceSlice", "gpu.nvidia.com", "ip-10-0-0-1", 8), ("ResourceSlice", "dra.net", "ip-10-0-0-1", 32)]
    gpu0 = slices[0]["spec"]["devices"][0]
    assert gpu0["name"] == "gpu-0" and gpu0["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:44"}
    assert slices[0]["spec"]["pool"] == {"name": "ip-10-0-0-1", "generation": 1, "resourceSliceCount": 1}


def test_slices_several_nodes_and_mig(capsys):
    assert cli.main(["slices", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--mig-profile", "3g.20gb",
                     "--driver-name", "gpu=gpu.example.com"]) == 0
    slices = list(yaml.safe_load_all(capsys.readouterr().out))
    gpu = [s for s in slices if s["spec"]["driver"] == "gpu.example.com"]
    assert [s["spec"]["nodeName"] for s in gpu] == ["p4d.24xlarge-0", "p4d.24xlarge-1"]
    assert len(gpu[0]["spec"]["devices"]) == 16  # 8 GPUs x 2 instances of 3g.20gb
    assert cli.main(["slices", "--instance-type", "p4d.24xlarge", "--mig-profile", "9g"]) == 2


def test_planner_commands_do_not_import_the_cdk():
    code = ("import sys, eks_dra.planner.command_plan, eks_dra.planner.command_slices, eks_dra.config;"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('aws_cdk', 'jsii', 'cdk8s', 'constructs',"
            " 'cdk8s_plus_34'));"
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0, f"planner imports {run.stdout.strip()} {run.stderr[-2000:]}"


def test_plan_on_published_resource_slices(tmp_path, capsys):
    # The same slices a cluster (or the drivers) publish: what `eks-dra slices` prints for two nodes.
    assert cli.main(["slices", "--instance-type", "p5.48xlarge", "--nodes", "2", "--node-name", "ip-10-0-0"]) == 0
    slices = tmp_path / "slices.yaml"
    slices.write_text(capsys.readouterr().out)
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump_all([_claim("all-eight", "gpu.nvidia.com", 8), _claim("more", "gpu.nvidia.com", 2)]))
    assert cli.main(["plan", "--slices", str(slices), "--claims", str(CLASSES), str(claims), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)["claims"]
    assert [(c["node"], c["devices"][0]["pool"]) for c in out] == [("ip-10-0-0-0", "ip-10-0-0-0"),
                                                                     ("ip-10-0-0-1", "ip-10-0-0-1")]
    cluster_wide = tmp_path / "net.yaml"
    cluster_wide.write_text(yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                            "metadata": {"name": "net"},
                                            "spec": {"driver": "x.io", "allNodes": True, "pool": {"name": "p"}}}))
    assert cli.main(["plan", "--slices", str(cluster_wide), "--claims", str(claims)]) == 2
    assert "net.yaml: ResourceSlice net: spec.nodeName: only node-local slices" in capsys.readouterr().err


def _config(tmp_path: Path, name: str, drivers: str) -> Path:
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / f"{name}.yaml").write_text(
        f"region: us-east-2\n{drivers}nodeGroups:\n"
        "  - {name: system, instanceType: m7i.xlarge}\n"
        "  - {name: p5, instanceType: p5.48xlarge, maxSize: 1}\n")
    return config


def test_vendor_driver_environments_are_planned_with_the_same_names(tmp_path, capsys):
    # drivers.gpu: upstream: NVIDIA's driver publishes under the same names and attributes as ours, so the
    # same claims plan, with no DeviceClass in the files (the vendor chart's classes are built in).
    config = _config(tmp_path, "vendor", "drivers: {gpu: upstream, efa: upstream}\n")
    user = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user", "namespace": "dra-samples"},
            "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "vendor-gpu"}], "containers": [],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}
    dist = tmp_path / "dist"
    (dist / "vendor").mkdir(parents=True)
    (dist / "vendor" / "0001-samples.k8s.yaml").write_text(yaml.safe_dump_all(
        [_claim("vendor-gpu", DEFAULT_DRIVER_NAMES.class_name("gpu")), user,
         _claim("efas", DEFAULT_DRIVER_NAMES.class_name("efa"), 4)]))
    code = cli.main(["plan", "-c", "env=vendor", "--config-dir", str(config), "--dist-dir", str(dist),
                     "--output", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    drivers = {c["name"]: {d["driver"] for d in c["devices"]} for c in out["claims"]}
    assert drivers == {"vendor-gpu": {"gpu.nvidia.com"}, "efas": {"dra.net"}}


def test_unknown_class_is_bad_input_naming_the_known_ones(tmp_path, capsys):
    config = _config(tmp_path, "ours", "")
    dist = _dist(tmp_path, "ours", _claim("typo", "gpu.nvidia.co"))
    code = cli.main(["plan", "-c", "env=ours", "--config-dir", str(config), "--dist-dir", str(dist)])
    assert code == 2
    err = capsys.readouterr().err
    assert "device class gpu.nvidia.co not found" in err and "efa.networking.k8s.aws" in err


def test_compute_domain_channels_are_reported_as_the_vendor_controllers(tmp_path, capsys):
    # The UltraServer sample: a ComputeDomain, its channel template (made by NVIDIA's controller) and GPUs.
    config = tmp_path / "config"
    config.mkdir()
    (config / "gb.yaml").write_text(
        "region: us-east-2\nvpc: {availabilityZones: [us-east-2a, us-east-2b]}\ndrivers: {gpu: upstream}\n"
        "computeDomains: true\nnodeGroups:\n"
        "  - {name: system, instanceType: m7i.xlarge}\n"
        "  - {name: gb, instanceType: p6e-gb200.36xlarge, capacity: 'capacity-block:cr-0123456789abcdef0', "
        "availabilityZone: us-east-2a}\n")
    domain = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
              "metadata": {"name": "imex", "namespace": "ml"},
              "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "imex-channel"}}}}
    gpus = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "four-gpus", "namespace": "ml"}, "spec": {"spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker", "namespace": "ml"},
           "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}], "containers": [],
                    "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": "imex-channel"},
                                       {"name": "gpus", "resourceClaimTemplateName": "four-gpus"}]}}
    channel_claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": "daemon", "namespace": "ml"}, "spec": {"devices": {"requests": [
                         {"name": "d", "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com"}}]}}}
    claims = tmp_path / "cd.yaml"
    claims.write_text(yaml.safe_dump_all([domain, gpus, pod, channel_claim]))
    code = cli.main(["plan", "-c", "env=gb", "--config-dir", str(config), "--claims", str(claims)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ml/worker-gpus  gb-0" in out and "1 of 1 claims allocated" in out
    assert "Pod ml/worker: claim channel (ResourceClaimTemplate imex-channel, the channel of ComputeDomain imex) is " \
           "served by the NVIDIA ComputeDomain controller (compute-domain.nvidia.com); not simulated" in out
    assert "ResourceClaim ml/daemon: not planned: DeviceClass compute-domain-daemon.nvidia.com is served by the " \
           "NVIDIA ComputeDomain controller (compute-domain.nvidia.com)" in out
    # Without computeDomains the channel template is simply missing: bad input, as before.
    (config / "plain.yaml").write_text((config / "gb.yaml").read_text().replace("computeDomains: true\n", ""))
    assert cli.main(["plan", "-c", "env=plain", "--config-dir", str(config), "--claims", str(claims)]) == 2
    assert "device class compute-domain-daemon.nvidia.com not found" in capsys.readouterr().err
