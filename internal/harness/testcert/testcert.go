// Package testcert makes the short-lived certificates that tests of the
// admission webhook serve with: a CA of its own and a serving certificate
// it signed, in PEM, as a kubernetes.io/tls Secret (cert-manager's form,
// with ca.crt) holds them.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files of a kubernetes.io/tls Secret.
const (
	CAFile   = "ca.crt"
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// Pair is a CA and a serving certificate and key it signed, in PEM.
type Pair struct {
	CA, Cert, Key []byte
}

// New makes a CA and a serving certificate for dnsNames and ips, valid
// from an hour ago for a day.
func New(t testing.TB, dnsNames []string, ips []net.IP) Pair {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := func() *big.Int {
		n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	caKey, key := newKey(), newKey()
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "loopvol test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	cn := "loopvol-webhook"
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: cn}, DNSNames: dnsNames, IPAddresses: ips,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Pair{
		CA:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
}

// Loopback is New for 127.0.0.1.
func Loopback(t testing.TB) Pair { return New(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)}) }

// Write puts the pair into dir as a mounted Secret shows it, each file
// renamed into place so that a reader never sees half of one, and returns
// the CA (what a client or a caBundle trusts).
func (p Pair) Write(t testing.TB, dir string) []byte {
	t.Helper()
	for _, f := range []struct {
		name string
		data []byte
	}{{CAFile, p.CA}, {KeyFile, p.Key}, {CertFile, p.Cert}} {
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			t.Fatal(err)
		}
	}
	return p.CA
}
