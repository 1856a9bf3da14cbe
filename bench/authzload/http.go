package authzload

import (
	"strings"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/bench/rawhttp"
)

// skipped are the headers of the mix's requests that a proxy does not copy into the
// forward-auth check (or that a client without a body does not send): the pseudo
// headers, the body's framing, and those the request line or the proxy sets.
func skipped(name string) bool {
	switch name {
	case "content-length", "transfer-encoding", "host", "connection", "x-forwarded-for":
		return true
	}
	return strings.HasPrefix(name, ":")
}

// forwardAuthRequests builds, for every request of the mix, the check a proxy sends
// the sidecar for it: GET /check with X-Forwarded-Method and X-Forwarded-Uri, the
// request's headers without its body, and X-Forwarded-For with the proxy's peer (the
// mix's load balancer, which Envoy reports as the source) appended, so that the
// sidecar resolves the same client as from the CheckRequest.
func forwardAuthRequests(m *Mix) ([][]byte, error) {
	return httpRequests(m, func(cr *authv3.CheckRequest, h *authv3.AttributeContext_HttpRequest, hd map[string]string) []byte {
		hd["x-forwarded-method"] = h.GetMethod()
		hd["x-forwarded-uri"] = h.GetPath()
		hd["x-forwarded-for"] = h.GetHeaders()["x-forwarded-for"] + ", " + cr.GetAttributes().GetSource().GetAddress().GetSocketAddress().GetAddress()
		return rawhttp.Request("GET", "/check", h.GetHost(), hd)
	})
}

// clientRequests builds, for every request of the mix, the request its client sends a
// proxy: the method, URI and headers, without the body, and the client's address in
// X-Forwarded-For as a load balancer in front of the proxy would write it.
func clientRequests(m *Mix) ([][]byte, error) {
	return httpRequests(m, func(_ *authv3.CheckRequest, h *authv3.AttributeContext_HttpRequest, hd map[string]string) []byte {
		hd["x-forwarded-for"] = h.GetHeaders()["x-forwarded-for"]
		// The proxies' site is 127.0.0.1; its port does not take part in matching.
		return rawhttp.Request(h.GetMethod(), h.GetPath(), "127.0.0.1", hd)
	})
}

// httpRequests builds an HTTP request for every request of the mix with build, which
// gets the CheckRequest and its headers but the skipped ones.
func httpRequests(m *Mix, build func(*authv3.CheckRequest, *authv3.AttributeContext_HttpRequest, map[string]string) []byte) ([][]byte, error) {
	out := make([][]byte, m.Len())
	for pos := range out {
		cr, err := m.Request(pos)
		if err != nil {
			return nil, err
		}
		h := cr.GetAttributes().GetRequest().GetHttp()
		hd := map[string]string{}
		for k, v := range h.GetHeaders() {
			if !skipped(k) {
				hd[k] = v
			}
		}
		out[pos] = build(cr, h, hd)
	}
	return out, nil
}
