package envoywire

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/authz"
	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/identity"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/metrics"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/rlsapi"
	"github.com/converger/edge/sidecar/routes"
)

// epoch is the clock of the tests' decisions: windows and tokens depend on nothing else.
var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func fixedNow() time.Time { return epoch }

// env is a pair of identical deciders, one answering through the standard path
// (proto.Unmarshal, Check or ShouldRateLimit, proto messages) and one through the codec.
// Both see the same requests in the same order, so their counters stay alike.
type env struct {
	signer            *token.Signer
	stdAuthz, wire    *authz.Server
	stdRLS, wireRLS   *rlsapi.Server
	tokens            []string // valid tokens for the generators
	publishableTokens []string
}

// The rate limit service's rules of the tests: every feature of the rule files
// (sidecar/cmd/sidecar's rulesShop and rulesBeyond).
var testRules = map[string]string{
	"shop.yaml": `domain: shop
descriptors:
  - key: client_id
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: client_id
    value: partner-7
    rate_limit: {unit: hour, requests_per_unit: 1, name: partner_default}
  - key: client_id
    value: healthcheck
    rate_limit: {unlimited: true}
  - key: promo
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: partner_default}]}
  - key: route
    value: /checkout*
    descriptors:
      - key: client_id
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: files
    value: 'img/*'
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    value: t1
    descriptors:
      - key: api
        value: tiles
        rate_limit: {unit: day, requests_per_unit: 50}
`,
	"beyond.yaml": `domain: beyond
descriptors:
  - key: client
    rate_limits:
      - {unit: hour, requests_per_unit: 2, name: burst}
      - {unit: day, requests_per_unit: 3, name: daily}
  - key: window
    rate_limit: {unit: minute, unit_multiplier: 30, requests_per_unit: 1}
  - key: careful
    count_denied: false
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: job
    allow_refunds: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`,
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	k, err := token.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	signer, err := token.ParseSigningKey(k)
	if err != nil {
		tb.Fatal(err)
	}
	e := &env{signer: signer}
	vars := map[string]string{"TRUSTED_PROXIES": "10.0.0.0/8", "TOKEN_VERIFY_KEYS": signer.PublicKey()}
	mkAuthz := func() *authz.Server {
		cfg, err := config.Load(func(k string) string { return vars[k] })
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Verifier.Now = fixedNow
		table, err := routes.New(cfg.Routes)
		if err != nil {
			tb.Fatal(err)
		}
		ident := identity.New(nil, identity.NewTokenCache(cfg.Verifier, 0), cfg.TrustedProxies)
		s, err := authz.New(table, ident, limiter.New(limiter.Options{Now: fixedNow}), cfg, nil, metrics.New())
		if err != nil {
			tb.Fatal(err)
		}
		return s
	}
	e.stdAuthz, e.wire = mkAuthz(), mkAuthz()
	rules, err := rls.ParseFiles(testRules)
	if err != nil {
		tb.Fatal(err)
	}
	mkRLS := func() *rlsapi.Server {
		return rlsapi.New(rls.New(limiter.New(limiter.Options{Now: fixedNow}), rules, rls.Options{ResponseHeaders: true}), nil)
	}
	e.stdRLS, e.wireRLS = mkRLS(), mkRLS()
	for i := range 6 {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		for _, src := range []string{token.SrcSecret, token.SrcPublishable} {
			tok, err := signer.Issue(token.Claims{TenantID: id, ChannelID: id, Src: src}, epoch)
			if err != nil {
				tb.Fatal(err)
			}
			if src == token.SrcSecret {
				e.tokens = append(e.tokens, tok)
			} else {
				e.publishableTokens = append(e.publishableTokens, tok)
			}
		}
	}
	return e
}

// checkWire answers a CheckRequest's bytes through the codec, as the server does:
// decode, decide, encode, and the answer read back with proto.Unmarshal. req is the
// request as the decision got it.
func checkWire(a Authorizer, b []byte) (req authz.Request, headers map[string]string, resp *authv3.CheckResponse, err error) {
	c := newCheckCall()
	c.decode(b)
	req, headers = c.req, map[string]string{}
	if !c.malformed {
		for _, h := range authz.RequestHeaders {
			headers[h] = strings.Clone(c.req.Header(h))
		}
		req = authz.Request{Method: strings.Clone(req.Method), Path: strings.Clone(req.Path), Source: strings.Clone(req.Source)}
	}
	v, err := c.decide(context.Background(), a)
	if err != nil {
		return req, headers, nil, err
	}
	out := Codec{}
	bufs, err := out.Marshal(v)
	if err != nil {
		return req, headers, nil, err
	}
	raw := bufs.Materialize()
	bufs.Free()
	resp = &authv3.CheckResponse{}
	if err := proto.Unmarshal(raw, resp); err != nil {
		return req, headers, nil, fmt.Errorf("the codec's CheckResponse does not parse: %w", err)
	}
	return req, headers, resp, nil
}

// compareCheck runs one CheckRequest's bytes through both paths and reports how they
// differ: the same messages refused (InvalidArgument by the codec), the same request
// read, the same answer.
func (e *env) compareCheck(b []byte) (outcome, error) {
	var std authv3.CheckRequest
	stdErr := proto.Unmarshal(b, &std)
	wreq, wheaders, wresp, werr := checkWire(e.wire, b)
	if stdErr != nil {
		if status.Code(werr) != codes.InvalidArgument {
			return 0, fmt.Errorf("proto.Unmarshal refuses it (%v), the codec answers %v, %v", stdErr, wresp, werr)
		}
		return refused, nil
	}
	if werr != nil {
		return 0, fmt.Errorf("proto.Unmarshal reads it, the codec answers %v", werr)
	}
	sreq := authz.RequestOf(&std)
	if sreq.Method != wreq.Method || sreq.Path != wreq.Path || sreq.Source != wreq.Source {
		return 0, fmt.Errorf("request read as %q %q from %q, by the codec as %q %q from %q", sreq.Method, sreq.Path, sreq.Source, wreq.Method, wreq.Path, wreq.Source)
	}
	for _, h := range authz.RequestHeaders {
		if sv, wv := sreq.Header(h), wheaders[h]; sv != wv {
			return 0, fmt.Errorf("header %s read as %q, by the codec as %q", h, sv, wv)
		}
	}
	sresp, _ := e.stdAuthz.Check(context.Background(), &std)
	// A denial without a sensible x-request-id of its own carries a new random one.
	if rid := sreq.Header(authz.HeaderRequestID); apierror.RequestID(rid) != rid {
		sameRequestID(sresp, wresp)
	}
	if !proto.Equal(sresp, wresp) {
		return 0, fmt.Errorf("answers differ:\nstandard %v\ncodec    %v", sresp, wresp)
	}
	if sresp.GetDeniedResponse() != nil {
		return denied, nil
	}
	return allowed, nil
}

// outcome is how both paths answered a request.
type outcome int

const (
	refused outcome = iota + 1 // proto.Unmarshal fails; the codec answers InvalidArgument
	allowed
	denied
	failed // both answer the same error
)

// sameRequestID gives w the request id of s, in its header and its body.
func sameRequestID(s, w *authv3.CheckResponse) {
	id := func(r *authv3.CheckResponse) string {
		for _, h := range r.GetDeniedResponse().GetHeaders() {
			if h.GetHeader().GetKey() == authz.HeaderRequestID {
				return h.GetHeader().GetValue()
			}
		}
		return ""
	}
	sid, wid := id(s), id(w)
	if sid == "" || wid == "" {
		return
	}
	d := w.GetDeniedResponse()
	for _, h := range d.GetHeaders() {
		if h.GetHeader().GetKey() == authz.HeaderRequestID {
			h.GetHeader().Value = sid
		}
	}
	d.Body = strings.ReplaceAll(d.Body, `"request_id":"`+wid+`"`, `"request_id":"`+sid+`"`)
}

// rateLimitWire answers a RateLimitRequest's bytes through the codec.
func rateLimitWire(r RateLimiter, b []byte) (*rlsv3.RateLimitResponse, error) {
	c := newRateLimitCall()
	c.decode(b)
	v, err := c.decide(context.Background(), r)
	if err != nil {
		return nil, err
	}
	bufs, err := Codec{}.Marshal(v)
	if err != nil {
		return nil, err
	}
	raw := bufs.Materialize()
	bufs.Free()
	resp := &rlsv3.RateLimitResponse{}
	if err := proto.Unmarshal(raw, resp); err != nil {
		return nil, fmt.Errorf("the codec's RateLimitResponse does not parse: %w", err)
	}
	return resp, nil
}

// compareRateLimit runs one RateLimitRequest's bytes through both paths: the same
// messages refused (InvalidArgument by the codec where proto.Unmarshal fails), the same
// errors, the same answers.
func (e *env) compareRateLimit(b []byte) (outcome, error) {
	var std rlsv3.RateLimitRequest
	stdErr := proto.Unmarshal(b, &std)
	wresp, werr := rateLimitWire(e.wireRLS, b)
	if stdErr != nil {
		if status.Code(werr) != codes.InvalidArgument {
			return 0, fmt.Errorf("proto.Unmarshal refuses it (%v), the codec answers %v, %v", stdErr, wresp, werr)
		}
		return refused, nil
	}
	sresp, serr := e.stdRLS.ShouldRateLimit(context.Background(), &std)
	if serr != nil || werr != nil {
		if status.Code(serr) != status.Code(werr) || status.Convert(serr).Message() != status.Convert(werr).Message() {
			return 0, fmt.Errorf("errors differ: standard %v, codec %v", serr, werr)
		}
		return failed, nil
	}
	if !proto.Equal(sresp, wresp) {
		return 0, fmt.Errorf("answers differ:\nstandard %v\ncodec    %v", sresp, wresp)
	}
	if sresp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		return denied, nil
	}
	return allowed, nil
}
