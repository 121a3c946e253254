package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

func runUp(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := fs.String("dir", "", "state directory: pki/, kubeconfigs, ready marker (required)")
	etcdDir := fs.String("etcd-dir", "", "etcd data directory; keep it to keep all objects across restarts (default DIR/etcd)")
	port := fs.Int("port", 0, "kube-apiserver port on 127.0.0.1 (default: the port of the previous run in DIR, else a free one)")
	verbosity := fs.Int("v", 1, "klog verbosity")
	_ = fs.Parse(args)
	if *dir == "" {
		return errors.New("--dir is required")
	}
	if *etcdDir == "" {
		*etcdDir = filepath.Join(*dir, "etcd")
	}
	initKlog(*verbosity)
	for _, d := range []string{*dir, *etcdDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	readyFile := filepath.Join(*dir, "ready")
	_ = os.Remove(readyFile)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	start := time.Now()

	p, err := ensurePKI(filepath.Join(*dir, "pki"))
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}

	etcd, etcdURL, err := startEtcd(*etcdDir)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()
	klog.InfoS("etcd ready", "url", etcdURL)

	ln, err := listenAPIServer(*dir, *port)
	if err != nil {
		return err
	}
	apiPort := ln.Addr().(*net.TCPAddr).Port
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	kubeconfigs := map[string]string{}
	for stem := range clientIdentities {
		path := filepath.Join(*dir, stem+".kubeconfig")
		if err := writeCertKubeconfig(path, server, p, stem); err != nil {
			return err
		}
		kubeconfigs[stem] = path
	}

	kcmOpts, err := newControllerManagerOptions(kubeconfigs["admin"], p)
	if err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	var wg sync.WaitGroup
	errCh := make(chan error, 3)
	apiCtx, apiCancel := context.WithCancel(context.Background())
	defer apiCancel()
	if err := startAPIServer(apiCtx, &wg, errCh, ln, etcdURL, p); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	admin, err := clientFor(kubeconfigs["admin"])
	if err != nil {
		return err
	}
	if err := waitFor(ctx, errCh, 2*time.Minute, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		res := admin.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx)
		code := 0
		res.StatusCode(&code)
		return code == 200, nil
	}); err != nil {
		return err
	}
	klog.InfoS("kube-apiserver ready", "url", server, "after", time.Since(start))

	// The scheduler and controller-manager stop with ctx; the apiserver outlives
	// them so that they shut down cleanly.
	if err := startScheduler(ctx, &wg, errCh, kubeconfigs["kube-scheduler"]); err != nil {
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	if err := startControllerManager(ctx, &wg, errCh, kcmOpts); err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	// The serviceaccount controller creating "default" in "default" proves the
	// controller-manager is running.
	if err := waitFor(ctx, errCh, 2*time.Minute, "kube-controller-manager (default ServiceAccount)", func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	if err := os.WriteFile(readyFile, []byte(server+"\n"), 0o644); err != nil {
		return err
	}
	klog.InfoS("control plane ready", "kubeconfig", kubeconfigs["admin"], "after", time.Since(start))
	fmt.Printf("ready %s %s\n", server, kubeconfigs["admin"])

	select {
	case <-ctx.Done():
	case err := <-errCh:
		return fmt.Errorf("component failed: %w", err)
	}
	klog.InfoS("shutting down")
	_ = os.Remove(readyFile)
	stop()
	time.Sleep(500 * time.Millisecond) // let scheduler/controllers notice before the apiserver goes
	apiCancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		klog.InfoS("components did not stop within 30s; closing etcd anyway")
	}
	return nil
}

// waitFor polls cond until it holds, a component fails, or the timeout passes.
func waitFor(ctx context.Context, errCh chan error, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-errCh:
			return false, err
		default:
		}
		return cond(ctx)
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	return nil
}

type savedPorts struct {
	APIServer int `json:"apiserver,omitempty"`
	EtcdPeer  int `json:"etcdPeer,omitempty"`
	EtcdCli   int `json:"etcdClient,omitempty"`
}

func loadPorts(path string) savedPorts {
	var s savedPorts
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &s)
	}
	return s
}

func savePorts(path string, s savedPorts) error {
	b, _ := json.Marshal(s)
	return os.WriteFile(path, b, 0o644)
}

// listenAPIServer binds 127.0.0.1, preferring the port of the previous run so that
// kubeconfigs handed out before a restart keep working.
func listenAPIServer(dir string, port int) (net.Listener, error) {
	portsFile := filepath.Join(dir, "ports.json")
	if port == 0 {
		port = loadPorts(portsFile).APIServer
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil && port != 0 {
		klog.InfoS("previous apiserver port busy, picking a new one", "port", port, "err", err)
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		return nil, err
	}
	return ln, savePorts(portsFile, savedPorts{APIServer: ln.Addr().(*net.TCPAddr).Port})
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func portFree(port int) bool {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func startEtcd(dataDir string) (*embed.Etcd, string, error) {
	portsFile := filepath.Join(dataDir, "e2e-ports.json")
	ports := loadPorts(portsFile)
	var err error
	if ports.EtcdCli == 0 || !portFree(ports.EtcdCli) {
		if ports.EtcdCli, err = freePort(); err != nil {
			return nil, "", err
		}
	}
	if ports.EtcdPeer == 0 || !portFree(ports.EtcdPeer) {
		if ports.EtcdPeer, err = freePort(); err != nil {
			return nil, "", err
		}
	}
	if err := savePorts(portsFile, ports); err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "e2e"
	cfg.Dir = filepath.Join(dataDir, "data")
	cfg.UnsafeNoFsync = true
	cli := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports.EtcdCli)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports.EtcdPeer)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cli}, []url.URL{cli}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", errors.New("etcd not ready after 60s")
	}
	return e, cli.String(), nil
}

func writeCertKubeconfig(path, server string, p pki, stem string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: p.caCert()}
	cfg.AuthInfos[stem] = &clientcmdapi.AuthInfo{ClientCertificate: p.clientCert(stem), ClientKey: p.clientKey(stem)}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: stem, Namespace: "default"}
	cfg.CurrentContext = "e2e"
	// Embed the files so the kubeconfig can be copied around on its own.
	if err := clientcmdapi.FlattenConfig(cfg); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}

func clientFor(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return kubernetes.NewForConfig(cfg)
}

func startAPIServer(ctx context.Context, wg *sync.WaitGroup, errCh chan error, ln net.Listener, etcdURL string, p pki) error {
	s := apiserveroptions.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	flags := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port),
		"--tls-cert-file=" + p.servingCert(),
		"--tls-private-key-file=" + p.servingKey(),
		"--client-ca-file=" + p.caCert(),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saKey(),
		"--service-account-signing-key-file=" + p.saKey(),
		"--service-cluster-ip-range=10.96.0.0/16",
		// Endpoints may not point at loopback; nothing in-cluster dials the apiserver.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
	}
	if err := fs.Parse(flags); err != nil {
		return err
	}
	s.SecureServing.Listener = ln
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return utilerrors.NewAggregate(errs)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := apiserverapp.Run(ctx, completed); err != nil && ctx.Err() == nil {
			errCh <- fmt.Errorf("kube-apiserver: %w", err)
		}
	}()
	return nil
}

func startScheduler(ctx context.Context, wg *sync.WaitGroup, errCh chan error, kubeconfig string) error {
	opts := scheduleroptions.NewOptions()
	fs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	}); err != nil {
		return err
	}
	cc, sched, err := schedulerapp.Setup(ctx, opts)
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := schedulerapp.Run(ctx, cc, sched); err != nil && ctx.Err() == nil {
			errCh <- fmt.Errorf("kube-scheduler: %w", err)
		}
	}()
	return nil
}

// newControllerManagerOptions parses the controller-manager flags. It must run
// before the apiserver adds its flags: it flips the WatchListClient default, which
// the process-wide feature gate refuses once it is bound to a flag set.
func newControllerManagerOptions(kubeconfig string, p pki) (*kcmoptions.KubeControllerManagerOptions, error) {
	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	all, disabled, aliases := kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases()
	named := s.Flags(all, disabled, aliases)
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		// No kubelet heartbeats: the node lifecycle controller would taint and evict.
		"--controllers=*,-node-lifecycle-controller",
		"--service-account-private-key-file=" + p.saKey(),
		"--root-ca-file=" + p.caCert(),
	}); err != nil {
		return nil, err
	}
	s.ParsedFlags = &named
	return s, nil
}

func startControllerManager(ctx context.Context, wg *sync.WaitGroup, errCh chan error, s *kcmoptions.KubeControllerManagerOptions) error {
	c, err := s.Config(ctx, kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := kcmapp.Run(ctx, c.Complete()); err != nil && ctx.Err() == nil {
			errCh <- fmt.Errorf("kube-controller-manager: %w", err)
		}
	}()
	return nil
}
