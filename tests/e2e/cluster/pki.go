package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the cluster's CA, serving certificate, client certificates and the
// service-account signing key. Everything lives in one directory and is reused on
// restart, so that kubeconfigs and issued tokens stay valid.
type pki struct {
	dir string
}

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func (p pki) caCert() string             { return p.path("ca.crt") }
func (p pki) servingCert() string        { return p.path("apiserver.crt") }
func (p pki) servingKey() string         { return p.path("apiserver.key") }
func (p pki) saKey() string              { return p.path("sa.key") }
func (p pki) clientCert(n string) string { return p.path(n + ".crt") }
func (p pki) clientKey(n string) string  { return p.path(n + ".key") }

// clientIdentities maps file stem -> (CN, O).
var clientIdentities = map[string][2]string{
	"admin":                   {"e2e-admin", "system:masters"},
	"kube-scheduler":          {"system:kube-scheduler", ""},
	"kube-controller-manager": {"system:kube-controller-manager", ""},
}

func ensurePKI(dir string) (pki, error) {
	p := pki{dir: dir}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	if _, err := os.Stat(p.path("complete")); err == nil {
		return p, nil
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	now := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "e2e-cluster-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return p, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	if err := writePEM(p.caCert(), "CERTIFICATE", caDER); err != nil {
		return p, err
	}
	serial := int64(2)
	issue := func(certFile, keyFile string, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		serial++
		tmpl.NotBefore, tmpl.NotAfter = now, now.Add(10*365*24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writeECKey(keyFile, key)
	}
	if err := issue(p.servingCert(), p.servingKey(), &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	}); err != nil {
		return p, err
	}
	for stem, id := range clientIdentities {
		subj := pkix.Name{CommonName: id[0]}
		if id[1] != "" {
			subj.Organization = []string{id[1]}
		}
		if err := issue(p.clientCert(stem), p.clientKey(stem), &x509.Certificate{
			Subject:     subj,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}); err != nil {
			return p, err
		}
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	if err := writeECKey(p.saKey(), saKey); err != nil {
		return p, err
	}
	return p, os.WriteFile(p.path("complete"), nil, 0o600)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func writeECKey(path string, key crypto.Signer) error {
	k, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("unsupported key type %T", key)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}
