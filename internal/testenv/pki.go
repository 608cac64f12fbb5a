package testenv

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
	"time"
)

// PKI is a throwaway certificate authority with certificates for tests,
// written as PEM files (mode 0600) in Dir. Keys are ECDSA P-256; the
// certificates are valid from an hour ago for 24 hours, except the expired
// client certificate.
type PKI struct {
	// Dir holds every file below.
	Dir string
	// CAFile is the CA certificate.
	CAFile string
	// ServerCertFile and ServerKeyFile are a server certificate signed by
	// the CA for 127.0.0.1, "localhost" and "nats.test" (for clients that
	// set a TLS server name).
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate (CN
	// "relayd") signed by the CA.
	ClientCertFile, ClientKeyFile string
	// ExpiredClientCertFile and ExpiredClientKeyFile are a client
	// certificate signed by the CA that expired a day ago.
	ExpiredClientCertFile, ExpiredClientKeyFile string
	// OtherCAFile is an unrelated CA: trusting it instead of CAFile is the
	// "wrong CA" case.
	OtherCAFile string
	// OtherClientCertFile and OtherClientKeyFile are a client certificate
	// signed by the unrelated CA.
	OtherClientCertFile, OtherClientKeyFile string
	// OtherServerCertFile and OtherServerKeyFile are a server certificate
	// like ServerCertFile's signed by the unrelated CA: the server's
	// certificate after a CA rotation.
	OtherServerCertFile, OtherServerKeyFile string
}

// NewPKI creates a CA, an unrelated CA and their certificates in dir.
func NewPKI(dir string) (*PKI, error) {
	p := &PKI{Dir: dir}
	now := time.Now()
	notBefore, notAfter := now.Add(-time.Hour), now.Add(24*time.Hour)

	ca, err := newCert(dir, "ca", &x509.Certificate{
		Subject:               pkix.Name{CommonName: "relayd test CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, nil)
	if err != nil {
		return nil, err
	}
	other, err := newCert(dir, "other-ca", &x509.Certificate{
		Subject:               pkix.Name{CommonName: "unrelated test CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, nil)
	if err != nil {
		return nil, err
	}
	p.CAFile, p.OtherCAFile = ca.certFile, other.certFile

	server := func(name string, issuer *issued) (*issued, error) {
		return newCert(dir, name, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "nats.test"},
			NotBefore:   notBefore,
			NotAfter:    notAfter,
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			DNSNames:    []string{"localhost", "nats.test"},
		}, issuer)
	}
	srv, err := server("server", ca)
	if err != nil {
		return nil, err
	}
	p.ServerCertFile, p.ServerKeyFile = srv.certFile, srv.keyFile
	if srv, err = server("server-other", other); err != nil {
		return nil, err
	}
	p.OtherServerCertFile, p.OtherServerKeyFile = srv.certFile, srv.keyFile

	client := func(name string, issuer *issued, from, to time.Time) (*issued, error) {
		return newCert(dir, name, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "relayd"},
			NotBefore:   from,
			NotAfter:    to,
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, issuer)
	}
	c, err := client("client", ca, notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	p.ClientCertFile, p.ClientKeyFile = c.certFile, c.keyFile
	if c, err = client("client-expired", ca, now.Add(-48*time.Hour), now.Add(-24*time.Hour)); err != nil {
		return nil, err
	}
	p.ExpiredClientCertFile, p.ExpiredClientKeyFile = c.certFile, c.keyFile
	if c, err = client("client-other", other, notBefore, notAfter); err != nil {
		return nil, err
	}
	p.OtherClientCertFile, p.OtherClientKeyFile = c.certFile, c.keyFile
	return p, nil
}

// issued is a certificate with its key, as parsed values and PEM files.
type issued struct {
	cert              *x509.Certificate
	key               *ecdsa.PrivateKey
	certFile, keyFile string
}

// newCert creates a key, signs tmpl with issuer (self-signed when nil) and
// writes dir/name.crt and dir/name.key.
func newCert(dir, name string, tmpl *x509.Certificate, issuer *issued) (*issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	parent, signer := tmpl, key
	if issuer != nil {
		parent, signer = issuer.cert, issuer.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	is := &issued{cert: cert, key: key,
		certFile: filepath.Join(dir, name+".crt"), keyFile: filepath.Join(dir, name+".key")}
	if err := os.WriteFile(is.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(is.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	return is, nil
}
