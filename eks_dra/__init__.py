"""eks-dra: DRA-ready Amazon EKS clusters for GPU, Trainium/Inferentia and EFA nodes.

Import the parts you need (`eks_dra.constructs`, `eks_dra.charts`, `eks_dra.planner`, ...);
this top-level module imports nothing heavy so that the drivers and the planner start fast.
"""

__version__ = "0.1.0"
