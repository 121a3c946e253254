//go:build !k8s136

package main

// The Kubernetes 1.34 signatures of the kubelet internals the stand-in calls
// (compat_136.go has the 1.36 ones; build.sh 1.36 builds with -tags k8s136).

import (
	"context"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

func nodeGetter(get func(context.Context) (*v1.Node, error)) func() (*v1.Node, error) {
	return func() (*v1.Node, error) { return get(context.Background()) }
}

func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager) {
	pm.Run(allReady{}, ctx.Done())
}

func isForPod(pod *v1.Pod, claim *resourceapi.ResourceClaim) error {
	return resourceclaim.IsForPod(pod, claim)
}

func isReservedForPod(pod *v1.Pod, claim *resourceapi.ResourceClaim) bool {
	return resourceclaim.IsReservedForPod(pod, claim)
}

func draClaim(namespace, uid, name string) *drapb.Claim {
	return &drapb.Claim{Namespace: namespace, UID: uid, Name: name}
}

func cdiDeviceIDs(d *drapb.Device) []string { return d.CDIDeviceIDs }
