package envoy

import (
	"os"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
)

// TestMutualTLSBootstrap checks that envoy-mtls.yaml is envoy-ratelimit.yaml with mutual
// TLS on every cluster of the sidecar and the core: a client certificate, a CA that
// verifies the server and a server identity to match, both re-read from a watched
// directory, TLS 1.2 or later, and the ALPN the servers need (h2 for gRPC).
func TestMutualTLSBootstrap(t *testing.T) {
	load := func(path string) map[string]*clusterv3.Cluster {
		t.Helper()
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := loadBootstrap(raw)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out := map[string]*clusterv3.Cluster{}
		for _, c := range bs.GetStaticResources().GetClusters() {
			out[c.GetName()] = c
		}
		return out
	}
	plain, mtls := load("envoy-ratelimit.yaml"), load("envoy-mtls.yaml")
	alpn := map[string]string{sidecarCluster: "h2", rlsCluster: "h2", coreCluster: "http/1.1"}
	for name, c := range mtls {
		p, ok := plain[name]
		if !ok {
			t.Errorf("cluster %s is not in envoy-ratelimit.yaml", name)
			continue
		}
		want, secured := alpn[name]
		if !secured {
			if !proto.Equal(c, p) {
				t.Errorf("cluster %s differs from envoy-ratelimit.yaml's", name)
			}
			continue
		}
		ts := c.GetTransportSocket()
		var ctx tlsv3.UpstreamTlsContext
		if ts == nil || ts.GetTypedConfig().UnmarshalTo(&ctx) != nil {
			t.Errorf("cluster %s has no UpstreamTlsContext", name)
			continue
		}
		common := ctx.GetCommonTlsContext()
		certs := common.GetTlsCertificates()
		vc := common.GetValidationContext()
		switch {
		case len(certs) != 1 || certs[0].GetCertificateChain().GetFilename() == "" || certs[0].GetPrivateKey().GetFilename() == "" ||
			certs[0].GetWatchedDirectory().GetPath() == "":
			t.Errorf("cluster %s: no client certificate from a watched directory: %v", name, certs)
		case vc.GetTrustedCa().GetFilename() == "" || vc.GetWatchedDirectory().GetPath() == "" || len(vc.GetMatchTypedSubjectAltNames()) == 0:
			t.Errorf("cluster %s: the server is not verified (a CA, a watched directory and an identity): %v", name, vc)
		case common.GetTlsParams().GetTlsMinimumProtocolVersion() < tlsv3.TlsParameters_TLSv1_2:
			t.Errorf("cluster %s: TLS older than 1.2 allowed", name)
		case len(common.GetAlpnProtocols()) != 1 || common.GetAlpnProtocols()[0] != want:
			t.Errorf("cluster %s: ALPN %v, want [%s]", name, common.GetAlpnProtocols(), want)
		}
		// Apart from the transport socket, the cluster is envoy-ratelimit.yaml's.
		bare := proto.Clone(c).(*clusterv3.Cluster)
		bare.TransportSocket = nil
		if !proto.Equal(bare, p) {
			t.Errorf("cluster %s differs from envoy-ratelimit.yaml's beyond its transport socket", name)
		}
	}
	if len(mtls) != len(plain) {
		t.Errorf("%d clusters, envoy-ratelimit.yaml has %d", len(mtls), len(plain))
	}
}
