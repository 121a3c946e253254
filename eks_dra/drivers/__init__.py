"""eks-dra's DRA kubelet plugins: a framework that knows no device family (`framework/`) and one package per
family (`gpu/`, `efa/`, `neuron/`), composed by `main.py` through `families.py`.

Nothing here imports the CDK, jsii or cdk8s: the driver image stays small and starts in a second.
"""
