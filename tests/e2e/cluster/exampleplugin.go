package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// examplePlugin is a minimal DRA driver built on the upstream kubeletplugin
// library. It exists to prove the kubelet stand-in independently of eks-dra's
// Python drivers: it publishes N devices and "prepares" by returning CDI ids.
type examplePlugin struct {
	driver       string
	failPrepares atomic.Int64 // remaining prepare calls to fail (per-claim error)
}

func runExamplePlugin(args []string) error {
	fs := flag.NewFlagSet("example-plugin", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (required)")
	node := fs.String("node", "", "node name (required)")
	driver := fs.String("driver", "gpu.e2e.example.com", "DRA driver name")
	registryDir := fs.String("registry-dir", "", "kubelet plugin registration directory (required)")
	pluginsDir := fs.String("plugins-dir", "", "kubelet plugins directory; the DRA socket goes to PLUGINS/DRIVER/dra.sock (required)")
	devices := fs.Int("devices", 2, "number of devices to publish")
	failPrepares := fs.Int("fail-prepares", 0, "fail the first N prepare calls with a per-claim error (tests the kubelet's retries)")
	noV1 := fs.Bool("no-v1", false, "serve only the v1beta1 DRA service (tests the kubelet's version negotiation)")
	verbosity := fs.Int("v", 2, "klog verbosity")
	_ = fs.Parse(args)
	if *kubeconfig == "" || *node == "" || *registryDir == "" || *pluginsDir == "" {
		return errors.New("--kubeconfig, --node, --registry-dir and --plugins-dir are required")
	}
	initKlog(*verbosity)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	client, err := clientFor(*kubeconfig)
	if err != nil {
		return err
	}
	dataDir := filepath.Join(*pluginsDir, *driver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return err
	}
	plugin := &examplePlugin{driver: *driver}
	plugin.failPrepares.Store(int64(*failPrepares))
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(*driver),
		kubeletplugin.RegistrarDirectoryPath(*registryDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.NodeV1(!*noV1),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()
	var devs []resourceapi.Device
	for i := 0; i < *devices; i++ {
		devs = append(devs, resourceapi.Device{
			Name: fmt.Sprintf("dev-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(i))},
				"model": {StringValue: ptr.To("e2e-model")},
			},
		})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*node: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}); err != nil {
		return err
	}
	klog.InfoS("example plugin running", "driver", *driver, "node", *node)
	<-ctx.Done()
	return nil
}

func (p *examplePlugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	if p.failPrepares.Add(-1) >= 0 {
		for _, c := range claims {
			out[c.UID] = kubeletplugin.PrepareResult{Err: errors.New("injected prepare failure")}
		}
		return out, nil
	}
	for _, c := range claims {
		var res kubeletplugin.PrepareResult
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != p.driver {
				continue
			}
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests:     []string{r.Request},
				PoolName:     r.Pool,
				DeviceName:   r.Device,
				CDIDeviceIDs: []string{fmt.Sprintf("%s/device=%s-%s", p.driver, c.UID, r.Device)},
			})
		}
		out[c.UID] = res
	}
	return out, nil
}

func (p *examplePlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (p *examplePlugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}
