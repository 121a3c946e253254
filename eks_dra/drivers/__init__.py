"""eks-dra's DRA kubelet plugins (gpu, efa, neuron): one framework, one file per responsibility.

Nothing here imports the CDK, jsii or cdk8s: the driver image stays small and starts in a second.
"""
