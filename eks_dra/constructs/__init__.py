"""Reusable CDK constructs for DRA-ready EKS clusters; they know nothing of eks-dra's environments.

```python
from eks_dra.constructs import AcceleratorCluster, AcceleratorClusterProps, AcceleratorNodeGroupProps, NodeTaint

cluster = AcceleratorCluster(stack, "Cluster", AcceleratorClusterProps(vpc=vpc))
cluster.add_node_group("P5", AcceleratorNodeGroupProps(
    cluster=cluster.cluster, instance_type="p5.48xlarge",  # AMI type from the catalog
    subnets=cluster.private_subnets()[:1], efa=True, max_size=2,
    taints=[NodeTaint("nvidia.com/gpu")]))
```
"""

from .accelerator_cluster import AcceleratorCluster, AcceleratorClusterProps
from .accelerator_node_group import AcceleratorNodeGroup, AcceleratorNodeGroupProps, NodeTaint
from .efa_launch_template import EfaInterfaceSlot, EfaLaunchTemplate, EfaLaunchTemplateProps, efa_interface_layout
from .eks_checks import EksDraChecks

__all__ = [
    "AcceleratorCluster",
    "AcceleratorClusterProps",
    "AcceleratorNodeGroup",
    "AcceleratorNodeGroupProps",
    "EfaInterfaceSlot",
    "EfaLaunchTemplate",
    "EfaLaunchTemplateProps",
    "EksDraChecks",
    "NodeTaint",
    "efa_interface_layout",
]
