package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/envoy"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
)

// tlsPatchFile is the strategic merge patch of converger.yaml's Deployment that puts the
// pod on mutual TLS.
const tlsPatchFile = "tls.patch.yaml"

// applyDeploymentPatch applies a strategic merge patch to the Deployment of
// converger.yaml, as the API server applies `kubectl patch deployment --patch-file`, and
// returns the files with the Deployment's document replaced by the result.
func applyDeploymentPatch(files map[string][]byte, patch []byte) (map[string][]byte, error) {
	var strict appsv1.Deployment
	if err := yaml.UnmarshalStrict(patch, &strict); err != nil {
		return nil, fmt.Errorf("%s: %w", tlsPatchFile, err)
	}
	patchJSON, err := yaml.YAMLToJSON(patch)
	if err != nil {
		return nil, err
	}
	docs := regexp.MustCompile(`(?m)^---\s*$`).Split(string(files["converger.yaml"]), -1)
	found := false
	for i, doc := range docs {
		if !regexp.MustCompile(`(?m)^kind: Deployment$`).MatchString(doc) {
			continue
		}
		original, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, err
		}
		patched, err := strategicpatch.StrategicMergePatch(original, patchJSON, appsv1.Deployment{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tlsPatchFile, err)
		}
		docs[i], found = "\n"+string(patched)+"\n", true
	}
	if !found {
		return nil, errors.New("converger.yaml has no Deployment to patch")
	}
	out := map[string][]byte{}
	for k, v := range files {
		out[k] = v
	}
	out["converger.yaml"] = []byte(strings.Join(docs, "---"))
	return out, nil
}

// certificate is the part of a cert-manager Certificate (cert-manager.io/v1) that the
// checks use; the Secret it keeps holds tls.crt, tls.key and ca.crt.
type certificate struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		SecretName  string   `json:"secretName"`
		CommonName  string   `json:"commonName"`
		DNSNames    []string `json:"dnsNames"`
		URIs        []string `json:"uris"`
		IPAddresses []string `json:"ipAddresses"`
		Duration    string   `json:"duration"`
		RenewBefore string   `json:"renewBefore"`
		Usages      []string `json:"usages"`
		PrivateKey  struct {
			Algorithm      string `json:"algorithm"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind"`
			Group string `json:"group"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// documentedCertificates are the cert-manager Certificates in the README's yaml blocks.
func documentedCertificates(readme string) ([]certificate, error) {
	var out []certificate
	var errs []error
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(readme, -1) {
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(block[1], -1) {
			if !regexp.MustCompile(`(?m)^kind: Certificate$`).MatchString(doc) {
				continue
			}
			var c certificate
			if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
				errs = append(errs, fmt.Errorf("README: a Certificate: %w", err))
				continue
			}
			if c.APIVersion != "cert-manager.io/v1" || c.Spec.SecretName == "" {
				errs = append(errs, fmt.Errorf("README: Certificate %s: want cert-manager.io/v1 with a secretName", c.Metadata.Name))
			}
			for _, u := range []string{"server auth", "client auth"} {
				if !slices.Contains(c.Spec.Usages, u) {
					errs = append(errs, fmt.Errorf("README: Certificate %s: usages lack %q (each port serves and each container is a client)", c.Metadata.Name, u))
				}
			}
			out = append(out, c)
		}
	}
	return out, errors.Join(errs...)
}

// issueDocumented makes each Certificate's Secret as cert-manager would: a certificate for
// its names, signed by one CA, with the CA's certificate as ca.crt.
func issueDocumented(t *testing.T, k *kube, certs []certificate) {
	t.Helper()
	ca, err := testpki.NewCA("converger-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range certs {
		leaf := testpki.Leaf{Name: c.Spec.CommonName, DNS: c.Spec.DNSNames, URIs: c.Spec.URIs}
		for _, ip := range c.Spec.IPAddresses {
			leaf.IPs = append(leaf.IPs, net.ParseIP(ip))
		}
		pair, err := ca.Issue(leaf)
		if err != nil {
			t.Fatalf("Certificate %s: %v", c.Metadata.Name, err)
		}
		k.doc.secrets[c.Spec.SecretName] = map[string]docValue{
			"tls.crt": {value: string(pair.CertPEM)}, "tls.key": {value: string(pair.KeyPEM)}, "ca.crt": {value: string(ca.CertPEM)},
		}
	}
}

// tlsPorts are the listening address variables with TLS: the prefix of their variables and
// the application protocol their server speaks.
var tlsPorts = map[string]struct{ prefix, alpn string }{
	"SIDECAR_GRPC_ADDR": {"SIDECAR_GRPC_TLS", "h2"},
	"SIDECAR_HTTP_ADDR": {"SIDECAR_HTTP_TLS", "http/1.1"},
	"CORE_ADDR":         {"CORE_TLS", "http/1.1"},
	"CORE_OPS_ADDR":     {"CORE_OPS_TLS", "http/1.1"},
}

// getenv reads c's variables as its program would: paths in the container mapped to this
// machine through its mounts.
func (c *container) getenv(name string) string { return c.hostPath(c.env[name]) }

// portTLS is the TLS of the port of the pod listening on addr: the container, the address
// variable, and its TLS (nil in plain text).
type portTLS struct {
	c      *container
	addrOf string
	server *tlsconfig.Server
	alpn   string
}

// tlsAt finds what listens on addr in the pod and its TLS.
func tlsAt(containers map[string]*container, members []string, addr string) (*portTLS, error) {
	host, port, _ := net.SplitHostPort(addr)
	for _, m := range members {
		c := containers[m]
		for v, p := range tlsPorts {
			value := c.env[v]
			if value == "" {
				value = defaultAddr(c.program, v)
			}
			h, pp, err := net.SplitHostPort(value)
			if err != nil || pp != port || (h != host && h != "0.0.0.0" && h != "" && h != "::") {
				continue
			}
			out := &portTLS{c: c, addrOf: v, alpn: p.alpn}
			f, err := tlsconfig.LoadServer(c.getenv, p.prefix)
			if err != nil || f == nil {
				return out, err
			}
			out.server, err = tlsconfig.NewServer(f, tlsconfig.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, p.alpn)
			return out, err
		}
	}
	return nil, fmt.Errorf("nothing in the pod listens on %s", addr)
}

// handshake runs a TLS handshake of client with the port over a pipe: the error of
// either end, and the protocol negotiated.
func handshake(client *tls.Config, server *tlsconfig.Server) (string, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(10 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)
	srv := tls.Server(a, server.Config())
	done := make(chan error, 1)
	go func() {
		err := srv.Handshake()
		if err == nil {
			_, err = srv.Write([]byte{0})
		}
		if err != nil {
			a.Close()
		}
		done <- err
	}()
	cl := tls.Client(b, client)
	cerr := cl.Handshake()
	if cerr == nil {
		// With TLS 1.3 the server verifies the client's certificate after the
		// client's handshake returns: reading its first byte, or its alert, tells.
		_, cerr = cl.Read(make([]byte, 1))
	}
	serr := <-done
	// The end that refused is the one whose error is not the other's alert.
	var alert tls.AlertError
	if cerr != nil && !errors.As(cerr, &alert) && !strings.Contains(cerr.Error(), "remote error") {
		return "", fmt.Errorf("the client refused: %w", cerr)
	}
	if serr != nil {
		return "", fmt.Errorf("the server refused: %w", serr)
	}
	if cerr != nil {
		return "", fmt.Errorf("the client refused: %w", cerr)
	}
	return cl.ConnectionState().NegotiatedProtocol, nil
}

// envoyClientTLS is the TLS an UpstreamTlsContext makes Envoy speak, with its files read
// through Envoy's mounts: its certificate, the CA and identities it accepts, its SNI and
// ALPN; and the watched directories, which must be mounts (a Secret volume's ..data swap
// is what Envoy watches for).
func envoyClientTLS(c *container, ctx *tlsv3.UpstreamTlsContext) (*tls.Config, error) {
	common := ctx.GetCommonTlsContext()
	cfg := &tls.Config{ServerName: ctx.GetSni(), NextProtos: common.GetAlpnProtocols(), MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}
	var errs []error
	watched := func(dir string) {
		if _, ok := c.mounts[dir]; dir != "" && !ok {
			errs = append(errs, fmt.Errorf("watched_directory %s is not a mount of the container", dir))
		}
	}
	for _, tc := range common.GetTlsCertificates() {
		watched(tc.GetWatchedDirectory().GetPath())
		cert, err := tls.LoadX509KeyPair(c.hostPath(tc.GetCertificateChain().GetFilename()), c.hostPath(tc.GetPrivateKey().GetFilename()))
		if err != nil {
			errs = append(errs, fmt.Errorf("its certificate %s: %w", tc.GetCertificateChain().GetFilename(), err))
			continue
		}
		cfg.Certificates = append(cfg.Certificates, cert)
	}
	vc := common.GetValidationContext()
	watched(vc.GetWatchedDirectory().GetPath())
	pem, err := os.ReadFile(c.hostPath(vc.GetTrustedCa().GetFilename()))
	roots := x509.NewCertPool()
	if err != nil || !roots.AppendCertsFromPEM(pem) {
		errs = append(errs, fmt.Errorf("its trusted_ca %s: not a PEM certificate in its mounts (%v)", vc.GetTrustedCa().GetFilename(), err))
	}
	matchers := vc.GetMatchTypedSubjectAltNames()
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
			return fmt.Errorf("the server's certificate against trusted_ca: %w", err)
		}
		if len(matchers) == 0 {
			return nil
		}
		ids := tlsconfig.Identities(leaf)
		for _, m := range matchers {
			for _, id := range ids {
				sm := m.GetMatcher()
				if sm.GetExact() != "" && sm.GetExact() == id || sm.GetPrefix() != "" && strings.HasPrefix(id, sm.GetPrefix()) {
					return nil
				}
			}
		}
		return fmt.Errorf("the server's identities %v match none of match_typed_subject_alt_names", ids)
	}
	return cfg, errors.Join(errs...)
}

// checkPodTLS checks that both ends of every connection in the pod agree on TLS: each
// cluster of the bootstrap Envoy runs (path) speaks TLS exactly to the ports that have it,
// with a certificate the port accepts and verifying the port's; and so do the core's
// clients of the sidecar (AUTHZ_ADDR, LIMITER_ADDR). Each is a real handshake with the
// files of the mounts.
func checkPodTLS(where, path string, bs *bootstrapv3.Bootstrap, envoyC *container, containers map[string]*container, members []string) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	sa := bs.GetAdmin().GetAddress().GetSocketAddress()
	admin := net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))
	for _, cl := range bs.GetStaticResources().GetClusters() {
		for _, ep := range envoy.ClusterEndpoints(bs, cl.GetName()) {
			if ep == admin {
				continue
			}
			p, err := tlsAt(containers, members, ep)
			if p == nil {
				continue // checkEnvoyPod says so
			}
			if err != nil {
				fail("%s: %s=%s: %v", p.c.where, p.addrOf, ep, err)
				continue
			}
			var ctx tlsv3.UpstreamTlsContext
			ts := cl.GetTransportSocket()
			switch {
			case ts == nil && p.server == nil:
				continue
			case ts == nil:
				fail("%s: %s sends cluster %q to %s in plain text, but %s's %s has TLS (%s_CERT_FILE): run a bootstrap with an UpstreamTlsContext (envoy-mtls.yaml)",
					where, path, cl.GetName(), ep, p.c.program, p.addrOf, tlsPorts[p.addrOf].prefix)
				continue
			case ts.GetTypedConfig().UnmarshalTo(&ctx) != nil:
				fail("%s: %s: cluster %q: a transport socket that is not an UpstreamTlsContext", where, path, cl.GetName())
				continue
			case p.server == nil:
				fail("%s: %s sends cluster %q to %s over TLS, but %s's %s speaks plain text (no %s_CERT_FILE)",
					where, path, cl.GetName(), ep, p.c.program, p.addrOf, tlsPorts[p.addrOf].prefix)
				continue
			}
			cfg, err := envoyClientTLS(envoyC, &ctx)
			if err != nil {
				fail("%s: %s: cluster %q: %v", where, path, cl.GetName(), err)
				continue
			}
			proto, err := handshake(cfg, p.server)
			switch {
			case err != nil:
				fail("%s: %s: cluster %q to %s's %s=%s: %v", where, path, cl.GetName(), p.c.program, p.addrOf, ep, err)
			case proto != p.alpn:
				fail("%s: %s: cluster %q to %s's %s: ALPN %q, the port speaks %s", where, path, cl.GetName(), p.c.program, p.addrOf, proto, p.alpn)
			}
		}
	}
	for _, m := range members {
		c := containers[m]
		if c.program != "core" {
			continue
		}
		for _, v := range []string{"AUTHZ", "LIMITER"} {
			addr := c.env[v+"_ADDR"]
			if addr == "" {
				continue
			}
			p, err := tlsAt(containers, members, addr)
			if p == nil || err != nil {
				fail("%s: %s_ADDR=%s: %v", c.where, v, addr, err)
				continue
			}
			f, err := tlsconfig.LoadClient(c.getenv, v+"_TLS")
			switch {
			case err != nil:
				fail("%s: %v", c.where, err)
				continue
			case f == nil && p.server == nil:
				continue
			case f == nil:
				fail("%s: %s_ADDR=%s is %s's %s, which has TLS, but %s_TLS_CA_FILE is unset", c.where, v, addr, p.c.program, p.addrOf, v)
				continue
			case p.server == nil:
				fail("%s: %s_TLS_* are set, but %s_ADDR=%s is %s's %s, which speaks plain text", c.where, v, v, addr, p.c.program, p.addrOf)
				continue
			}
			cfg, err := tlsconfig.ClientConfig(f, addr, tlsconfig.Options{})
			if err != nil {
				fail("%s: %v", c.where, err)
				continue
			}
			cfg.NextProtos = []string{"h2"} // as gRPC's credentials ask
			if _, err := handshake(cfg, p.server); err != nil {
				fail("%s: %s_ADDR=%s (%s's %s) over %s_TLS_*: %v", c.where, v, addr, p.c.program, p.addrOf, v, err)
			}
		}
	}
	return errs
}

// loadTLSPod is the manifests with tls.patch.yaml applied, and the Secrets of the
// README's Certificates issued.
func loadTLSPod(t *testing.T, files map[string][]byte, readme string, patch []byte) (*kube, error) {
	patched, err := applyDeploymentPatch(files, patch)
	if err != nil {
		return nil, err
	}
	k, err := loadKube(t, patched, readme)
	if err != nil {
		return nil, err
	}
	certs, err := documentedCertificates(readme)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, errors.New("README: no cert-manager Certificate for the Secrets of " + tlsPatchFile)
	}
	issueDocumented(t, k, certs)
	return k, nil
}

func readTLSPatch(t *testing.T) []byte {
	b, err := os.ReadFile(filepath.Join(kubernetesDir, tlsPatchFile))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKubernetesTLS applies tls.patch.yaml to converger.yaml as the API server does, gives
// its Secrets the certificates the README's cert-manager Certificates describe, and checks
// the pod it makes as TestKubernetesManifests checks the plain one (the programs accept
// their environment and files) and that every connection in it agrees on TLS at both
// ends, by real handshakes with the mounted files.
func TestKubernetesTLS(t *testing.T) {
	files, readme := readKubernetesFiles(t)
	k, err := loadTLSPod(t, files, readme, readTLSPatch(t))
	if err != nil {
		t.Fatal(err)
	}
	if errs := checkKubernetes(t, k); len(errs) > 0 {
		t.Fatalf("deploy/kubernetes with %s:\n%v", tlsPatchFile, errors.Join(errs...))
	}
	// The patch is what turns TLS on: every port Envoy reaches and the core's Limiter
	// client, with the certificates of three Secrets.
	spec := k.m.deployments[0].Spec.Template.Spec
	var tlsVars []string
	for _, c := range spec.Containers {
		for _, e := range c.Env {
			if strings.Contains(e.Name, "_TLS_") {
				tlsVars = append(tlsVars, e.Name)
			}
		}
		if strings.HasPrefix(c.Image, "envoyproxy/envoy:") {
			if path, _ := envoyConfigArg(c.Args); filepath.Base(path) != "envoy-mtls.yaml" {
				t.Errorf("Envoy runs %s with the patch, want envoy-mtls.yaml", path)
			}
		}
	}
	for _, v := range []string{"SIDECAR_GRPC_TLS_CERT_FILE", "CORE_TLS_CERT_FILE", "LIMITER_TLS_CA_FILE"} {
		if !slices.Contains(tlsVars, v) {
			t.Errorf("the patched pod does not set %s", v)
		}
	}
}

// TestKubernetesTLSChecksFail: each TLS check can fail, on a broken copy of the patch or
// of the README's Certificates.
func TestKubernetesTLSChecksFail(t *testing.T) {
	files, readme := readKubernetesFiles(t)
	patch := string(readTLSPatch(t))
	cases := []struct {
		name, old, new, readmeOld, readmeNew, want string
	}{
		{name: "Envoy still on the plain bootstrap", old: `args: ["-c", "/etc/envoy/envoy-mtls.yaml"`, new: `args: ["-c", "/etc/envoy/envoy-ratelimit.yaml"`,
			want: `sends cluster "sidecar_authz" to 127.0.0.1:8081 in plain text, but sidecar's SIDECAR_GRPC_ADDR has TLS`},
		{name: "a path outside the mounted Secret", old: "{name: SIDECAR_GRPC_TLS_CERT_FILE, value: /etc/converger/tls/tls.crt}",
			new: "{name: SIDECAR_GRPC_TLS_CERT_FILE, value: /etc/converger/keys/tls.crt}", want: "would not start: SIDECAR_GRPC_TLS_CERT_FILE"},
		{name: "a key cert-manager does not write", old: "secretName: converger-tls-core\n            defaultMode: 0440\n            items: [{key: tls.crt, path: tls.crt}",
			new: "secretName: converger-tls-core\n            defaultMode: 0440\n            items: [{key: tls.pem, path: tls.crt}", want: `wants key "tls.pem" of Secret converger-tls-core`},
		{name: "a Secret no Certificate keeps", old: "secretName: converger-tls-sidecar", new: "secretName: converger-sidecar-tls",
			want: `Secret "converger-sidecar-tls", which no manifest defines and no documented command creates`},
		{name: "Envoy's Secret mounted elsewhere", old: "{name: envoy-tls, mountPath: /etc/envoy/tls, readOnly: true}",
			new: "{name: envoy-tls, mountPath: /etc/envoy/certs, readOnly: true}", want: "watched_directory /etc/envoy/tls is not a mount of the container"},
		{name: "Envoy not in the allow list", old: `value: "spiffe://cluster.local/ns/edge/sa/envoy spiffe://cluster.local/ns/edge/sa/core"`,
			new: `value: "spiffe://cluster.local/ns/edge/sa/core"`, want: `cluster "sidecar_authz" to sidecar's SIDECAR_GRPC_ADDR=127.0.0.1:8081: the server refused: client certificate not in the allow list`},
		{name: "the core's Limiter client in plain text", old: "            - {name: LIMITER_TLS_CA_FILE, value: /etc/converger/tls/ca.crt}\n            - {name: LIMITER_TLS_CERT_FILE, value: /etc/converger/tls/tls.crt}\n            - {name: LIMITER_TLS_KEY_FILE, value: /etc/converger/tls/tls.key}\n            - {name: LIMITER_TLS_SERVER_NAME, value: localhost}\n",
			new: "", want: "LIMITER_ADDR=127.0.0.1:8081 is sidecar's SIDECAR_GRPC_ADDR, which has TLS, but LIMITER_TLS_CA_FILE is unset"},
		{name: "the Limiter client's name not in the sidecar's certificate", old: "{name: LIMITER_TLS_SERVER_NAME, value: localhost}", new: "{name: LIMITER_TLS_SERVER_NAME, value: sidecar.edge.svc}",
			want: "LIMITER_ADDR=127.0.0.1:8081 (sidecar's SIDECAR_GRPC_ADDR) over LIMITER_TLS_*: the client refused"},
		{name: "envoy-mtls.yaml not mounted", old: "              - {key: envoy-mtls.yaml, path: envoy-mtls.yaml}\n", new: "",
			want: "its bootstrap /etc/envoy/envoy-mtls.yaml is not in its mounts"},
		{name: "a field the Deployment does not have", old: "      volumes:\n", new: "      volume: []\n      volumes:\n", want: `unknown field "volume"`},
		{name: "the sidecar's identity not Envoy's to match", readmeOld: "uris: [spiffe://cluster.local/ns/edge/sa/sidecar]", readmeNew: "uris: [spiffe://cluster.local/ns/edge/sa/limiter]",
			want: "match none of match_typed_subject_alt_names"},
		{name: "a Certificate only for servers", readmeOld: "usages: [digital signature, server auth, client auth]", readmeNew: "usages: [digital signature, server auth]",
			want: `usages lack "client auth"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, r := patch, readme
			if tc.old != "" {
				if !strings.Contains(p, tc.old) {
					t.Fatalf("test setup: %q is not in %s", tc.old, tlsPatchFile)
				}
				p = strings.Replace(p, tc.old, tc.new, 1)
			}
			if tc.readmeOld != "" {
				if !strings.Contains(r, tc.readmeOld) {
					t.Fatalf("test setup: %q is not in the README", tc.readmeOld)
				}
				r = strings.Replace(r, tc.readmeOld, tc.readmeNew, 1)
			}
			k, err := loadTLSPod(t, files, r, []byte(p))
			all := err
			if err == nil {
				all = errors.Join(checkKubernetes(t, k)...)
			}
			if all == nil || !strings.Contains(all.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got:\n%v", tc.want, all)
			}
		})
	}
}

// TestKubernetesTLSServed starts the real sidecar and core with the environment and files
// the patched pod gives them (on free loopback ports, over a test database), checks that
// their probes answer, and connects to their TLS ports as Envoy would with
// envoy-mtls.yaml's settings and the envoy container's Secret: the sidecar's gRPC health
// service and the core's API answer over mutual TLS, and a client without a certificate
// is refused.
func TestKubernetesTLSServed(t *testing.T) {
	files, readme := readKubernetesFiles(t)
	k, err := loadTLSPod(t, files, readme, readTLSPatch(t))
	if err != nil {
		t.Fatal(err)
	}
	bins := buildBinaries(t)
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	d := k.m.deployments[0]
	pod := podTemplate{"deployment " + d.Name, d.Spec.Template.Labels, d.Spec.Template.Spec, false}
	ports := map[string]string{}
	var envoyC *container
	for _, c := range pod.spec.Containers {
		if strings.HasPrefix(c.Image, "envoyproxy/envoy:") {
			mc, errs := k.materialize(t, pod, c, "")
			if len(errs) > 0 {
				t.Fatal(errors.Join(errs...))
			}
			envoyC = mc
		}
	}
	for _, program := range []string{"sidecar", "core"} {
		for _, c := range pod.spec.Containers {
			if programOf(c.Image, "") != program {
				continue
			}
			mc, errs := k.materialize(t, pod, c, dbURL)
			if len(errs) > 0 {
				t.Fatal(errors.Join(errs...))
			}
			relocate(mc, ports)
			startProgram(t, bins[program], mc)
			for _, err := range probeContainer(mc.where, c, ports, 30*time.Second) {
				t.Error(err)
			}
		}
	}
	if envoyC == nil {
		t.Fatal("no Envoy container")
	}
	bs, err := readEnvoyBootstrap(envoyC, "/etc/envoy/envoy-mtls.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clusterTLS := func(name string) *tls.Config {
		t.Helper()
		for _, cl := range bs.GetStaticResources().GetClusters() {
			if cl.GetName() != name {
				continue
			}
			var ctx tlsv3.UpstreamTlsContext
			if err := cl.GetTransportSocket().GetTypedConfig().UnmarshalTo(&ctx); err != nil {
				t.Fatalf("cluster %s: %v", name, err)
			}
			cfg, err := envoyClientTLS(envoyC, &ctx)
			if err != nil {
				t.Fatalf("cluster %s: %v", name, err)
			}
			return cfg
		}
		t.Fatalf("envoy-mtls.yaml has no cluster %s", name)
		return nil
	}

	// The sidecar's gRPC port (127.0.0.1:8081 in the pod), as cluster sidecar_authz.
	health := func(cfg *tls.Config) error {
		conn, err := grpc.NewClient("127.0.0.1:"+ports["8081"], grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("status %v", resp.GetStatus())
		}
		return err
	}
	authz := clusterTLS("sidecar_authz")
	if err := health(authz); err != nil {
		t.Errorf("the sidecar's gRPC port over mutual TLS as Envoy: %v", err)
	}
	noCert := authz.Clone()
	noCert.Certificates = nil
	if err := health(noCert); err == nil {
		t.Error("the sidecar's gRPC port answered a client without a certificate")
	}

	// The core's API (127.0.0.1:8080 in the pod), as cluster core.
	get := func(cfg *tls.Config) (int, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := c.Get("https://127.0.0.1:" + ports["8080"] + "/api/v1/conversations")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	core := clusterTLS("core")
	if code, err := get(core); err != nil || code >= 500 {
		t.Errorf("the core's API over mutual TLS as Envoy: %d %v", code, err)
	}
	noCert = core.Clone()
	noCert.Certificates = nil
	if _, err := get(noCert); err == nil {
		t.Error("the core's API answered a client without a certificate")
	}
}
