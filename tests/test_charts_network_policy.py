"""The drivers' NetworkPolicies: one per driver DaemonSet, selecting exactly its pods, admitting only the
metrics scrapers (configurable, defaults documented in eks_dra/drivers/README.md) to the metrics port."""

from __future__ import annotations

import cdk8s
import kubernetes_validate
import pytest
from charts.environments import ALL, REPO, synthesized
from charts.k8s_objects import of_kind

from eks_dra.charts.driver_chart import METRICS_PORTS, DriverChart, DriverSettings
from eks_dra.charts.network_policy import (
    DEFAULT_SCRAPER_NAMESPACE_LABELS,
    DEFAULT_SCRAPER_POD_LABELS,
    MetricsScrapers,
)


def _selects(selector: dict, pod_labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels selectors are expected here"
    return all(pod_labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("key", ALL)
def test_every_driver_daemon_set_has_one_policy_selecting_exactly_its_pods(key: str) -> None:
    _, docs = synthesized(key)
    daemon_sets = [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].startswith("eks-dra-")
                   and d["metadata"]["name"].endswith(("-driver", "-driver-privileged"))]
    policies = of_kind(docs, "NetworkPolicy")
    if not daemon_sets:  # the environment runs the vendors' drivers (their charts bring their own policies)
        assert not policies
        return
    for ds in daemon_sets:
        ns, pod_labels = ds["metadata"]["namespace"], ds["spec"]["template"]["metadata"]["labels"]
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        assert not ds["spec"]["template"]["spec"].get("hostNetwork"), "a NetworkPolicy does not apply to hostNetwork pods"
        mine = [p for p in policies if p["metadata"]["namespace"] == ns and _selects(p["spec"]["podSelector"], pod_labels)]
        assert [p["metadata"]["name"] for p in mine] == [ds["metadata"]["name"]]
        (policy,) = mine
        # it selects no other driver's pods
        for other in daemon_sets:
            if other is not ds:
                assert not _selects(policy["spec"]["podSelector"], other["spec"]["template"]["metadata"]["labels"])
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        metrics_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
        (rule,) = policy["spec"]["ingress"]
        assert rule["ports"] == [{"port": metrics_port, "protocol": "TCP"}]  # the health port: no one from the network
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": DEFAULT_SCRAPER_NAMESPACE_LABELS},
                                 "podSelector": {"matchLabels": DEFAULT_SCRAPER_POD_LABELS}}]


def test_scrapers_are_configurable_and_the_policy_validates_against_1_34() -> None:
    app = cdk8s.App()
    scrapers = MetricsScrapers(namespace_labels={"kubernetes.io/metadata.name": "amazon-cloudwatch"},
                               pod_labels={"app.kubernetes.io/name": "cloudwatch-agent"}, cidrs=("10.0.0.0/16",))
    chart = DriverChart(app, "efa", settings=DriverSettings(family="efa", driver_name="dra.net", metrics_scrapers=scrapers))
    (policy,) = [o for o in chart.to_json() if o["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, "1.34", strict=True)
    assert policy["spec"]["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "amazon-cloudwatch"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cloudwatch-agent"}}},
                 {"ipBlock": {"cidr": "10.0.0.0/16"}}],
        "ports": [{"port": METRICS_PORTS["efa"], "protocol": "TCP"}]}]


def test_readme_names_the_default_scrapers() -> None:
    readme = (REPO / "eks_dra" / "drivers" / "README.md").read_text()
    for labels in (DEFAULT_SCRAPER_NAMESPACE_LABELS, DEFAULT_SCRAPER_POD_LABELS):
        for k, v in labels.items():
            assert f"{k}: {v}" in readme
