package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// Label on the placeholder pods that hold pod-bound tokens.
const tokenHolderLabel = "e2e.eks-dra.io/token-holder"

// runToken writes a kubeconfig that authenticates as a ServiceAccount with a token
// bound to a placeholder Pod on NODE, so the token carries the
// authentication.kubernetes.io/node-name extra like a driver pod's token does.
func runToken(args []string) error {
	fs := flag.NewFlagSet("token", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig (required)")
	namespace := fs.String("namespace", "", "namespace of the ServiceAccount (required; created if missing)")
	sa := fs.String("serviceaccount", "", "ServiceAccount name (required; created if missing)")
	node := fs.String("node", "", "node the placeholder pod is bound to (required)")
	out := fs.String("out", "", "kubeconfig to write (required)")
	expiration := fs.Duration("expiration", 24*time.Hour, "token lifetime")
	_ = fs.Parse(args)
	if *kubeconfig == "" || *namespace == "" || *sa == "" || *node == "" || *out == "" {
		return errors.New("--kubeconfig, --namespace, --serviceaccount, --node and --out are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := clientFor(*kubeconfig)
	if err != nil {
		return err
	}
	token, podName, err := podBoundToken(ctx, client, *namespace, *sa, *node, *expiration)
	if err != nil {
		return err
	}
	raw, err := clientcmd.LoadFromFile(*kubeconfig)
	if err != nil {
		return err
	}
	if err := clientcmdapi.FlattenConfig(raw); err != nil {
		return err
	}
	cur := raw.Contexts[raw.CurrentContext]
	if cur == nil || raw.Clusters[cur.Cluster] == nil {
		return fmt.Errorf("%s: no current context/cluster", *kubeconfig)
	}
	user := fmt.Sprintf("system:serviceaccount:%s:%s", *namespace, *sa)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = raw.Clusters[cur.Cluster].DeepCopy()
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user, Namespace: *namespace}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, *out); err != nil {
		return err
	}
	fmt.Printf("%s/%s\n%s\n", *namespace, podName, *out)
	return nil
}

func podBoundToken(ctx context.Context, client kubernetes.Interface, ns, sa, node string, expiration time.Duration) (string, string, error) {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", "", err
	}
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", "", err
	}
	name := dnsName(fmt.Sprintf("token-%s-%s", sa, node))
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{tokenHolderLabel: "true"}},
		Spec: v1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           sa,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []v1.Container{{Name: "holder", Image: "registry.k8s.io/pause:3.10"}},
			Tolerations:                  []v1.Toleration{{Operator: v1.TolerationOpExists}},
		},
	}
	got, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err == nil && (got.Spec.NodeName != node || got.Spec.ServiceAccountName != sa || got.DeletionTimestamp != nil) {
		return "", "", fmt.Errorf("placeholder pod %s/%s exists with another node/serviceaccount or is terminating", ns, name)
	}
	if apierrors.IsNotFound(err) {
		got, err = client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	}
	if err != nil {
		return "", "", err
	}
	tr, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(expiration.Seconds())),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: got.Name, UID: got.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", "", err
	}
	return tr.Status.Token, got.Name, nil
}

// dnsName lower-cases and replaces characters that are invalid in an object name.
func dnsName(s string) string {
	s = strings.ToLower(s)
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	s = strings.Trim(string(b), "-.")
	if len(s) > 63 {
		s = strings.Trim(s[:63], "-.")
	}
	return s
}
