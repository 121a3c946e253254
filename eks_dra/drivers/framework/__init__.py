"""The kubelet-plugin framework of eks-dra's DRA drivers; it knows no device family.

gRPC servers (registration, DRA v1/v1beta1, health stream, liveness), prepare/unprepare with the node lock,
the checkpoint and crash recovery, CDI specs, ResourceSlices, readiness taint, reconciler, Events and metrics.
A device family (eks_dra.drivers.gpu, .efa, .neuron) plugs in through `family.DeviceFamily`; a test checks
that nothing here imports a family package.
"""
