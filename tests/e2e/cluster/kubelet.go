package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	pluginmanagercache "k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/utils/ptr"
)

// PreparedAnnotation is set on each pod by the stand-in: claim UID -> prepare result.
const PreparedAnnotation = "e2e.eks-dra.io/prepared"

// wipingDelay is the kubelet's default delay before deleting the ResourceSlices of
// a driver whose plugin went away.
const wipingDelay = 30 * time.Second

type preparedDevice struct {
	RequestNames []string `json:"requestNames"`
	PoolName     string   `json:"poolName"`
	DeviceName   string   `json:"deviceName"`
	CDIDeviceIDs []string `json:"cdiDeviceIds"`
}

// claimResult is what the annotation and the report show for one claim.
type claimResult struct {
	Driver  string           `json:"driver"`
	Devices []preparedDevice `json:"devices"`
	Error   string           `json:"error"`
}

// claimState is the stand-in's claim cache entry (the kubelet's ClaimInfo).
type claimState struct {
	Namespace string                  `json:"namespace"`
	Name      string                  `json:"name"`
	UID       types.UID               `json:"uid"`
	Drivers   []string                `json:"drivers"`
	Prepared  map[string]*claimResult `json:"prepared"` // driver -> result of a successful prepare
	Pods      map[types.UID]string    `json:"pods"`     // pod UID -> namespace/name
}

type standIn struct {
	node      string
	client    kubernetes.Interface
	plugins   *draplugin.DRAPluginManager
	report    string
	stateFile string

	// callMu serializes prepare/unprepare rounds so that pods sharing a claim
	// never race between "prepared once" and "unprepared after the last pod".
	callMu sync.Mutex
	mu     sync.Mutex
	claims map[types.UID]*claimState
	pods   map[types.UID]*v1.Pod // latest view of pods on this node
	queue  workqueue.TypedRateLimitingInterface[types.UID]
	repMu  sync.Mutex
}

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

func runKubelet(args []string) error {
	fs := flag.NewFlagSet("kubelet", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (required)")
	node := fs.String("node", "", "node name (required); the Node is registered if missing")
	registryDir := fs.String("registry-dir", "", "plugin registration directory watched for sockets (required)")
	pluginsDir := fs.String("plugins-dir", "", "plugins directory (created; drivers put their DRA sockets below it) (required)")
	report := fs.String("report", "", "append JSON lines about prepare/unprepare calls to this file")
	stateDir := fs.String("state-dir", "", "checkpoint directory (claim cache survives restarts, like the kubelet's dra_manager_state)")
	readyFile := fs.String("ready-file", "", "file written once the node is registered, slices wiped and the plugin watcher runs")
	verbosity := fs.Int("v", 3, "klog verbosity (3 logs the kubelet's plugin registrations with the chosen gRPC service)")
	_ = fs.Parse(args)
	if *kubeconfig == "" || *node == "" || *registryDir == "" || *pluginsDir == "" {
		return errors.New("--kubeconfig, --node, --registry-dir and --plugins-dir are required")
	}
	initKlog(*verbosity)
	for _, d := range []string{*registryDir, *pluginsDir, *stateDir} {
		if d != "" {
			if err := os.MkdirAll(d, 0o750); err != nil {
				return err
			}
		}
	}
	if *readyFile != "" {
		_ = os.Remove(*readyFile)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	client, err := clientFor(*kubeconfig)
	if err != nil {
		return err
	}
	s := &standIn{
		node:   *node,
		client: client,
		report: *report,
		claims: map[types.UID]*claimState{},
		pods:   map[types.UID]*v1.Pod{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](
			500*time.Millisecond, 30*time.Second)),
	}
	if *stateDir != "" {
		s.stateFile = filepath.Join(*stateDir, "dra_manager_state.json")
		if err := s.loadState(); err != nil {
			return err
		}
	}
	if err := s.registerNode(ctx); err != nil {
		return fmt.Errorf("registering node: %w", err)
	}
	getNode := nodeGetter(func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, *node, metav1.GetOptions{})
	})
	// The kubelet's DRA plugin manager: it deletes this node's ResourceSlices on
	// start (in the background), validates and registers plugins, negotiates the
	// gRPC service and wipes a driver's slices 30s after its plugin goes away.
	if err := s.wipeSlices(ctx); err != nil {
		return fmt.Errorf("deleting ResourceSlices of node %s: %w", *node, err)
	}
	s.plugins = draplugin.NewDRAPluginManager(ctx, client, getNode, nil, wipingDelay)
	defer s.plugins.Stop()

	// The kubelet's plugin watcher + registration reconciler on the registry dir.
	recorder := record.NewFakeRecorder(100)
	go func() {
		for range recorder.Events {
		}
	}()
	pm := pluginmanager.NewPluginManager(*registryDir, recorder)
	pm.AddHandler(registerapi.DRAPlugin, reportingHandler{PluginHandler: s.plugins, s: s})
	go runPluginManager(ctx, pm)

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", *node).String()
	}))
	podInformer := factory.Core().V1().Pods().Informer()
	_, _ = podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.podChanged(obj, false) },
		UpdateFunc: func(old, obj any) {
			if onlyMetadataChanged(old.(*v1.Pod), obj.(*v1.Pod)) {
				return // e.g. our own annotation patch: nothing for the kubelet to do
			}
			s.podChanged(obj, false)
		},
		DeleteFunc: func(obj any) { s.podChanged(obj, true) },
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		return errors.New("pod informer did not sync")
	}
	// Claims in the checkpoint whose pods are gone get unprepared (the kubelet's
	// reconcile loop does the same).
	s.mu.Lock()
	for _, c := range s.claims {
		for uid := range c.Pods {
			if _, ok := s.pods[uid]; !ok {
				s.queue.Add(uid)
			}
		}
	}
	s.mu.Unlock()

	go wait.UntilWithContext(ctx, s.heartbeat, 10*time.Second)
	for i := 0; i < 4; i++ {
		go s.worker(ctx)
	}
	if *readyFile != "" {
		if err := os.WriteFile(*readyFile, []byte("ok\n"), 0o644); err != nil {
			return err
		}
	}
	klog.InfoS("kubelet stand-in ready", "node", *node, "registryDir", *registryDir)
	<-ctx.Done()
	s.queue.ShutDown()
	klog.InfoS("kubelet stand-in stopping", "node", *node)
	return nil
}

// registerNode creates the Node if needed and reports it Ready, as the kubelet does.
func (s *standIn) registerNode(ctx context.Context) error {
	nodes := s.client.CoreV1().Nodes()
	_, err := nodes.Get(ctx, s.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = nodes.Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   s.node,
			Labels: map[string]string{"kubernetes.io/hostname": s.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
		}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	}
	if err != nil {
		return err
	}
	// Without a node lifecycle controller nobody removes the not-ready taint that
	// admission puts on new nodes; the kubelet being up is what it stands for.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, s.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []v1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != v1.TaintNodeNotReady && t.Key != v1.TaintNodeUnreachable {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = keep
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	s.heartbeat(ctx)
	return nil
}

func (s *standIn) heartbeat(ctx context.Context) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := s.client.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		if n.Status.Capacity == nil {
			n.Status.Capacity = v1.ResourceList{}
		}
		for name, q := range map[v1.ResourceName]string{v1.ResourceCPU: "16", v1.ResourceMemory: "64Gi", v1.ResourcePods: "110", v1.ResourceEphemeralStorage: "100Gi"} {
			if _, ok := n.Status.Capacity[name]; !ok {
				n.Status.Capacity[name] = resource.MustParse(q)
			}
		}
		if n.Status.Allocatable == nil {
			n.Status.Allocatable = n.Status.Capacity.DeepCopy()
		}
		ready := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			Message: "e2e kubelet stand-in is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
		found := false
		for i, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady {
				if c.Status == v1.ConditionTrue {
					ready.LastTransitionTime = c.LastTransitionTime
				}
				n.Status.Conditions[i] = ready
				found = true
			}
		}
		if !found {
			n.Status.Conditions = append(n.Status.Conditions, ready)
		}
		n.Status.NodeInfo.KubeletVersion = "v1.34.12-e2e-standin"
		_, err = s.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil && ctx.Err() == nil {
		klog.ErrorS(err, "node status update failed", "node", s.node)
	}
}

// wipeSlices deletes this node's ResourceSlices synchronously. The plugin manager
// does the same in the background; doing it here first makes "ready" mean "wiped",
// even when a running driver republishes right away.
func (s *standIn) wipeSlices(ctx context.Context) error {
	sel := fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, s.node).String()
	return retry.OnError(retry.DefaultBackoff, func(error) bool { return ctx.Err() == nil }, func() error {
		return s.client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel})
	})
}

// reportingHandler adds "register"/"deregister" lines to the report around the
// kubelet's own handler, so tests can wait for a driver to be usable.
type reportingHandler struct {
	pluginmanagercache.PluginHandler
	s *standIn
}

func (h reportingHandler) ValidatePlugin(name, endpoint string, versions []string) error {
	err := h.PluginHandler.ValidatePlugin(name, endpoint, versions)
	if err != nil {
		h.s.appendReport(map[string]any{"event": "register", "driver": name, "endpoint": endpoint, "versions": versions, "error": err.Error()})
	}
	return err
}

func (h reportingHandler) RegisterPlugin(name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.PluginHandler.RegisterPlugin(name, endpoint, versions, timeout)
	entry := map[string]any{"event": "register", "driver": name, "endpoint": endpoint, "versions": versions}
	if err != nil {
		entry["error"] = err.Error()
	}
	h.s.appendReport(entry)
	return err
}

func (h reportingHandler) DeRegisterPlugin(name, endpoint string) {
	h.PluginHandler.DeRegisterPlugin(name, endpoint)
	h.s.appendReport(map[string]any{"event": "deregister", "driver": name, "endpoint": endpoint})
}

func onlyMetadataChanged(old, pod *v1.Pod) bool {
	return apiequality.Semantic.DeepEqual(old.Spec, pod.Spec) && apiequality.Semantic.DeepEqual(old.Status, pod.Status) &&
		apiequality.Semantic.DeepEqual(old.DeletionTimestamp, pod.DeletionTimestamp)
}

func (s *standIn) podChanged(obj any, deleted bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	s.mu.Lock()
	if deleted {
		delete(s.pods, pod.UID)
	} else {
		s.pods[pod.UID] = pod
	}
	s.mu.Unlock()
	if !deleted && podActive(pod) && s.queue.NumRequeues(pod.UID) > 0 {
		return // a retry with backoff is pending; our own annotation patch must not skip it
	}
	s.queue.Add(pod.UID)
}

func (s *standIn) worker(ctx context.Context) {
	for {
		uid, shutdown := s.queue.Get()
		if shutdown {
			return
		}
		err := s.sync(ctx, uid)
		if err != nil && ctx.Err() == nil {
			klog.InfoS("pod sync failed, retrying with backoff", "podUID", uid, "err", err)
			s.queue.AddRateLimited(uid)
		} else {
			s.queue.Forget(uid)
		}
		s.queue.Done(uid)
	}
}

func podActive(pod *v1.Pod) bool {
	return pod != nil && pod.DeletionTimestamp == nil &&
		pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed
}

func (s *standIn) sync(ctx context.Context, uid types.UID) error {
	s.mu.Lock()
	pod := s.pods[uid]
	s.mu.Unlock()
	if !podActive(pod) {
		if err := s.unprepare(ctx, uid, pod); err != nil {
			return err
		}
		if pod != nil && pod.DeletionTimestamp != nil {
			// The containers are "stopped": finish the graceful deletion like the kubelet.
			err := s.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
				GracePeriodSeconds: ptr.To(int64(0)), Preconditions: &metav1.Preconditions{UID: &uid}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return err
			}
		}
		return nil
	}
	results, err := s.prepare(ctx, pod)
	if results != nil {
		if aerr := s.annotate(ctx, pod, results); aerr != nil && err == nil {
			err = aerr
		}
	}
	if err != nil {
		return err
	}
	if pod.Status.Phase == v1.PodRunning && podReady(pod) {
		return nil
	}
	return s.setRunning(ctx, pod)
}

func podReady(pod *v1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

type podClaim struct {
	claim   *resourceapi.ResourceClaim
	drivers []string
}

// prepare mirrors the kubelet DRA manager's PrepareResources: resolve the pod's
// claims, check they are allocated and reserved for the pod, then call
// NodePrepareResources once per driver for the claims that are not prepared yet.
// It returns the per-claim results for the annotation (nil if there were none).
func (s *standIn) prepare(ctx context.Context, pod *v1.Pod) (map[types.UID]*claimResult, error) {
	// The scheduler's claim for the pod's extended resources backed by DRA (DRAExtendedResource, beta in
	// 1.36): the kubelet prepares it like the pod's own claims.
	extended := pod.Status.ExtendedResourceClaimStatus
	if len(pod.Spec.ResourceClaims) == 0 && extended == nil {
		return nil, nil
	}
	s.callMu.Lock()
	defer s.callMu.Unlock()
	type claimRef struct {
		name           string
		mustCheckOwner bool
	}
	var refs []claimRef
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(pod, pc)
		if err != nil {
			return nil, fmt.Errorf("pod claim %q: %w", pc.Name, err)
		}
		if name == nil {
			continue // no claim needed (template with nothing generated)
		}
		refs = append(refs, claimRef{*name, mustCheckOwner})
	}
	if extended != nil {
		refs = append(refs, claimRef{extended.ResourceClaimName, true})
	}
	var claims []podClaim
	for _, ref := range refs {
		claim, err := s.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, ref.name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("fetch ResourceClaim %s/%s: %w", pod.Namespace, ref.name, err)
		}
		if ref.mustCheckOwner {
			if err := isForPod(pod, claim); err != nil {
				return nil, err
			}
		}
		if claim.Status.Allocation == nil {
			return nil, fmt.Errorf("ResourceClaim %s/%s is not allocated", claim.Namespace, claim.Name)
		}
		if !isReservedForPod(pod, claim) {
			return nil, fmt.Errorf("pod %s/%s is not allowed to use ResourceClaim %s/%s: not reserved for it", pod.Namespace, pod.Name, claim.Namespace, claim.Name)
		}
		seen := map[string]bool{}
		var drivers []string
		for _, r := range claim.Status.Allocation.Devices.Results {
			if !seen[r.Driver] {
				seen[r.Driver] = true
				drivers = append(drivers, r.Driver)
			}
		}
		sort.Strings(drivers)
		claims = append(claims, podClaim{claim: claim, drivers: drivers})
	}

	// Record the claims in the cache first (checkpoint), then prepare.
	s.mu.Lock()
	byDriver := map[string][]*resourceapi.ResourceClaim{}
	for _, pc := range claims {
		st := s.claims[pc.claim.UID]
		if st == nil {
			st = &claimState{Namespace: pc.claim.Namespace, Name: pc.claim.Name, UID: pc.claim.UID,
				Drivers: pc.drivers, Prepared: map[string]*claimResult{}, Pods: map[types.UID]string{}}
			s.claims[pc.claim.UID] = st
		}
		st.Pods[pod.UID] = pod.Namespace + "/" + pod.Name
		for _, d := range pc.drivers {
			if st.Prepared[d] == nil {
				byDriver[d] = append(byDriver[d], pc.claim)
			}
		}
	}
	s.saveStateLocked()
	s.mu.Unlock()

	errs := map[types.UID]string{}
	fresh := map[types.UID]map[string]*claimResult{}
	drivers := make([]string, 0, len(byDriver))
	for d := range byDriver {
		drivers = append(drivers, d)
	}
	sort.Strings(drivers)
	for _, driver := range drivers {
		batch := byDriver[driver]
		fail := func(msg string) {
			for _, c := range batch {
				errs[c.UID] = msg
			}
		}
		plugin, err := s.plugins.GetPlugin(driver)
		if err != nil {
			fail(err.Error())
			continue
		}
		req := &drapb.NodePrepareResourcesRequest{}
		for _, c := range batch {
			req.Claims = append(req.Claims, draClaim(c.Namespace, string(c.UID), c.Name))
		}
		resp, err := plugin.NodePrepareResources(ctx, req)
		if err != nil {
			fail(fmt.Sprintf("NodePrepareResources failed: %v", err))
			continue
		}
		for _, c := range batch {
			r, ok := resp.Claims[string(c.UID)]
			switch {
			case !ok || r == nil:
				errs[c.UID] = "NodePrepareResources skipped this claim (no result)"
			case r.Error != "":
				errs[c.UID] = r.Error
			default:
				res := &claimResult{Driver: driver, Devices: []preparedDevice{}}
				for _, d := range r.Devices {
					res.Devices = append(res.Devices, preparedDevice{RequestNames: nonNil(d.RequestNames), PoolName: d.PoolName,
						DeviceName: d.DeviceName, CDIDeviceIDs: nonNil(cdiDeviceIDs(d))})
				}
				if fresh[c.UID] == nil {
					fresh[c.UID] = map[string]*claimResult{}
				}
				fresh[c.UID][driver] = res
			}
		}
	}

	s.mu.Lock()
	results := map[types.UID]*claimResult{}
	var reportClaims []map[string]string
	for _, pc := range claims {
		st := s.claims[pc.claim.UID]
		for d, r := range fresh[pc.claim.UID] {
			st.Prepared[d] = r
		}
		results[pc.claim.UID] = st.combined(errs[pc.claim.UID])
	}
	for _, d := range drivers {
		for _, c := range byDriver[d] {
			reportClaims = append(reportClaims, map[string]string{"uid": string(c.UID), "namespace": c.Namespace, "name": c.Name, "driver": d})
		}
	}
	s.saveStateLocked()
	s.mu.Unlock()
	if len(reportClaims) > 0 {
		s.appendReport(map[string]any{"event": "prepare", "pod": pod.Namespace + "/" + pod.Name, "podUID": pod.UID,
			"claims": reportClaims, "errors": errs, "results": results})
	}
	if len(errs) > 0 {
		var msgs []string
		for uid, e := range errs {
			msgs = append(msgs, fmt.Sprintf("claim %s: %s", uid, e))
		}
		sort.Strings(msgs)
		return results, fmt.Errorf("prepare failed: %s", strings.Join(msgs, "; "))
	}
	return results, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// combined merges the per-driver results of a claim into the annotation's shape.
func (c *claimState) combined(errMsg string) *claimResult {
	r := &claimResult{Driver: strings.Join(c.Drivers, ","), Devices: []preparedDevice{}, Error: errMsg}
	for _, d := range c.Drivers {
		if p := c.Prepared[d]; p != nil {
			r.Devices = append(r.Devices, p.Devices...)
		}
	}
	return r
}

func (s *standIn) annotate(ctx context.Context, pod *v1.Pod, results map[types.UID]*claimResult) error {
	val, err := json.Marshal(results)
	if err != nil {
		return err
	}
	if pod.Annotations[PreparedAnnotation] == string(val) {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": pod.UID, "annotations": map[string]string{PreparedAnnotation: string(val)}}})
	_, err = s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return ignoreGone(err)
}

func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// setRunning reports the pod Running and Ready: the stand-in runs no containers.
func (s *standIn) setRunning(ctx context.Context, pod *v1.Pod) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := s.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID != pod.UID || !podActive(p) {
			return nil
		}
		now := metav1.Now()
		p.Status.Phase = v1.PodRunning
		p.Status.HostIP = "127.0.0.1"
		p.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
		if p.Status.StartTime == nil {
			p.Status.StartTime = &now
		}
		for _, t := range []v1.PodConditionType{v1.PodScheduled, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
			setPodCondition(p, v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now})
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr.To(true),
				ContainerID: "e2e://" + string(p.UID) + "/" + c.Name,
				State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
			})
		}
		_, err = s.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	return ignoreGone(err)
}

func setPodCondition(p *v1.Pod, c v1.PodCondition) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == c.Type {
			if p.Status.Conditions[i].Status == c.Status {
				c.LastTransitionTime = p.Status.Conditions[i].LastTransitionTime
			}
			p.Status.Conditions[i] = c
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, c)
}

// unprepare releases the pod's claims; a claim is unprepared (one
// NodeUnprepareResources call per driver) once no other pod uses it.
func (s *standIn) unprepare(ctx context.Context, uid types.UID, pod *v1.Pod) error {
	s.callMu.Lock()
	defer s.callMu.Unlock()
	s.mu.Lock()
	podName := ""
	byDriver := map[string][]*claimState{}
	for _, c := range s.claims {
		name, ok := c.Pods[uid]
		if !ok {
			continue
		}
		podName = name
		if len(c.Pods) > 1 {
			delete(c.Pods, uid) // still in use by another pod
			continue
		}
		for _, d := range c.Drivers {
			if c.Prepared[d] != nil {
				byDriver[d] = append(byDriver[d], c)
			}
		}
		if len(c.Prepared) == 0 {
			delete(s.claims, c.UID) // never prepared: nothing to undo
		}
	}
	s.saveStateLocked()
	s.mu.Unlock()
	if len(byDriver) == 0 {
		return nil
	}
	if pod != nil {
		podName = pod.Namespace + "/" + pod.Name
	}
	errs := map[types.UID]string{}
	var reportClaims []map[string]string
	drivers := make([]string, 0, len(byDriver))
	for d := range byDriver {
		drivers = append(drivers, d)
	}
	sort.Strings(drivers)
	for _, driver := range drivers {
		batch := byDriver[driver]
		req := &drapb.NodeUnprepareResourcesRequest{}
		for _, c := range batch {
			req.Claims = append(req.Claims, draClaim(c.Namespace, string(c.UID), c.Name))
			reportClaims = append(reportClaims, map[string]string{"uid": string(c.UID), "namespace": c.Namespace, "name": c.Name, "driver": driver})
		}
		var resp *drapb.NodeUnprepareResourcesResponse
		plugin, err := s.plugins.GetPlugin(driver)
		if err == nil {
			resp, err = plugin.NodeUnprepareResources(ctx, req)
		}
		s.mu.Lock()
		for _, c := range batch {
			var msg string
			if err != nil {
				msg = fmt.Sprintf("NodeUnprepareResources failed: %v", err)
			} else if r, ok := resp.Claims[string(c.UID)]; !ok {
				msg = "NodeUnprepareResources skipped this claim (no result)"
			} else if r != nil && r.Error != "" {
				msg = r.Error
			}
			if msg != "" {
				errs[c.UID] = msg
				continue
			}
			delete(c.Prepared, driver)
			if len(c.Prepared) == 0 {
				delete(s.claims, c.UID)
			}
		}
		s.saveStateLocked()
		s.mu.Unlock()
	}
	s.appendReport(map[string]any{"event": "unprepare", "pod": podName, "podUID": uid, "claims": reportClaims, "errors": errs})
	if len(errs) > 0 {
		return fmt.Errorf("unprepare failed for %d claim(s)", len(errs))
	}
	return nil
}

func (s *standIn) appendReport(entry map[string]any) {
	entry["node"] = s.node
	entry["time"] = time.Now().UTC().Format(time.RFC3339Nano)
	line, err := json.Marshal(entry)
	if err != nil {
		klog.ErrorS(err, "report entry")
		return
	}
	klog.InfoS("DRA call", "entry", string(line))
	if s.report == "" {
		return
	}
	s.repMu.Lock()
	defer s.repMu.Unlock()
	f, err := os.OpenFile(s.report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		klog.ErrorS(err, "open report", "file", s.report)
		return
	}
	defer f.Close()
	_, _ = f.Write(append(line, '\n'))
}

func (s *standIn) loadState() error {
	b, err := os.ReadFile(s.stateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var claims []*claimState
	if err := json.Unmarshal(b, &claims); err != nil {
		return fmt.Errorf("checkpoint %s: %w", s.stateFile, err)
	}
	for _, c := range claims {
		s.claims[c.UID] = c
	}
	return nil
}

func (s *standIn) saveStateLocked() {
	if s.stateFile == "" {
		return
	}
	claims := make([]*claimState, 0, len(s.claims))
	for _, c := range s.claims {
		claims = append(claims, c)
	}
	b, _ := json.Marshal(claims)
	tmp := s.stateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
		err = os.Rename(tmp, s.stateFile)
	}
}
