"""Who may reach a DRA driver's pods over the network: the metrics scraper on the metrics port, nobody else.

The kubelet talks to the plugin over Unix sockets, and its liveness probe comes from the node itself, which
NetworkPolicy does not filter ("Pods cannot ... block access from their resident node":
https://kubernetes.io/docs/concepts/services-networking/network-policies/#what-you-can-t-do-with-network-policies-at-least-not-yet;
the VPC CNI's policy agent always admits the node IP: aws/aws-network-policy-agent#65). So the health port
needs no peer, and the policy admits only the scrapers to the metrics port. The driver pods do not use
hostNetwork, so the policy applies to them. Egress is left open: the driver must reach the API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cdk8s_plus_34 import k8s
from constructs import Construct

# Prometheus as the Prometheus Operator (kube-prometheus-stack) runs it, in a namespace named `monitoring`.
DEFAULT_SCRAPER_NAMESPACE_LABELS = {"kubernetes.io/metadata.name": "monitoring"}
DEFAULT_SCRAPER_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}


@dataclass(frozen=True)
class MetricsScrapers:
    """Who may scrape the driver's /metrics: pods matching both label sets, and the given CIDRs (a scraper
    outside the cluster, e.g. an Amazon Managed Service for Prometheus collector's addresses in the VPC)."""

    namespace_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_SCRAPER_NAMESPACE_LABELS))
    pod_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_SCRAPER_POD_LABELS))
    cidrs: tuple[str, ...] = ()

    def peers(self) -> list[k8s.NetworkPolicyPeer]:
        # One peer with both selectors: a pod must match the pod labels AND live in a matching namespace.
        in_cluster = k8s.NetworkPolicyPeer(
            namespace_selector=k8s.LabelSelector(match_labels=dict(self.namespace_labels)),
            pod_selector=k8s.LabelSelector(match_labels=dict(self.pod_labels)))
        return [in_cluster, *(k8s.NetworkPolicyPeer(ip_block=k8s.IpBlock(cidr=c)) for c in self.cidrs)]


class DriverNetworkPolicy(Construct):
    """A NetworkPolicy for one driver DaemonSet's pods: ingress only from `scrapers` to `metrics_port`."""

    def __init__(self, scope: Construct, id: str, *, name: str, namespace: str, pod_labels: Mapping[str, str],
                 metrics_port: int, scrapers: MetricsScrapers, labels: Mapping[str, str]) -> None:
        super().__init__(scope, id)
        self.policy = k8s.KubeNetworkPolicy(
            self, "policy", metadata=k8s.ObjectMeta(name=name, namespace=namespace, labels=dict(labels)),
            spec=k8s.NetworkPolicySpec(
                pod_selector=k8s.LabelSelector(match_labels=dict(pod_labels)),
                policy_types=["Ingress"],
                ingress=[k8s.NetworkPolicyIngressRule(
                    from_=scrapers.peers(),
                    ports=[k8s.NetworkPolicyPort(port=k8s.IntOrString.from_number(metrics_port), protocol="TCP")])],
            ))
