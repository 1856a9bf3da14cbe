// Package testpki makes certificate authorities and the certificates they sign, written
// as PEM files, for the tests, the load tests and the development stack (devstack -mtls)
// of the TLS ports: short-lived ECDSA keys, SAN URIs and DNS names as a mesh issues them,
// and expired certificates on request. Not for production certificates.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewCA makes a CA named name, valid from an hour ago for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf is what a certificate is issued for.
type Leaf struct {
	Name    string   // the subject's common name
	DNS     []string // SAN DNS names
	IPs     []net.IP // SAN addresses
	URIs    []string // SAN URIs (spiffe://cluster.local/ns/edge/sa/envoy)
	Expired bool     // valid only in the past
}

// Pair is an issued certificate and its key, PEM.
type Pair struct {
	Cert         *x509.Certificate
	CertPEM      []byte
	KeyPEM       []byte
	CertFile     string // set by Write
	KeyFile      string
	CAFile       string // the issuer's certificate, set by Write
	SerialNumber *big.Int
}

// Issue signs a certificate for l, usable by servers and clients alike.
func (ca *CA) Issue(l Leaf) (*Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	notBefore, notAfter := time.Now().Add(-time.Hour), time.Now().Add(12*time.Hour)
	if l.Expired {
		notBefore, notAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.Name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     l.DNS,
		IPAddresses:  l.IPs,
	}
	for _, s := range l.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("URI %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Pair{Cert: cert, SerialNumber: cert.SerialNumber,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})}, nil
}

// Write writes the certificate, its key and the CA's certificate into dir as
// name.crt, name.key and name-ca.crt (replacing them by a rename each, so a reader never
// sees half a file), and sets the Pair's file names.
func (ca *CA) Write(p *Pair, dir, name string) error {
	p.CertFile, p.KeyFile, p.CAFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, name+"-ca.crt")
	for _, f := range []struct {
		path string
		b    []byte
	}{{p.CertFile, p.CertPEM}, {p.KeyFile, p.KeyPEM}, {p.CAFile, ca.CertPEM}} {
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, f.b, 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, f.path); err != nil {
			return err
		}
	}
	return nil
}

// Localhost is a Leaf for a server on loopback.
func Localhost(name string) Leaf {
	return Leaf{Name: name, DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
