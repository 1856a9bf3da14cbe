package envoywire

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// recorded reads the Envoy-shaped requests of testdata/<dir>, in protobuf's JSON
// mapping, with {{TOKEN}} and {{PUBLISHABLE_TOKEN}} replaced by valid tokens, and returns
// them marshaled.
func (e *env) recorded(tb testing.TB, dir string, newMsg func() proto.Message) (names []string, msgs [][]byte) {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.json"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no testdata/%s: %v", dir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "{{TOKEN}}", e.tokens[0])
		s = strings.ReplaceAll(s, "{{PUBLISHABLE_TOKEN}}", e.publishableTokens[0])
		m := newMsg()
		if err := protojson.Unmarshal([]byte(s), m); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		out, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		names, msgs = append(names, filepath.Base(f)), append(msgs, out)
	}
	return names, msgs
}

// checkGen generates CheckRequests as Envoy sends them, over the sidecar's routes, with
// valid, invalid and missing credentials of every kind and few enough keys that some go
// over their limits; in the headers map or in header_map (encode_raw_headers); with the
// odd parts a proxy in front may add.
type checkGen struct {
	rng *rand.Rand
	e   *env
}

func (g *checkGen) pick(s ...string) string { return s[g.rng.IntN(len(s))] }

func (g *checkGen) uuid() string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", g.rng.IntN(4))
}

func (g *checkGen) ip() string {
	switch g.rng.IntN(6) {
	case 0:
		return fmt.Sprintf("2001:db8:%x::%x", g.rng.IntN(3), g.rng.IntN(9))
	case 1:
		return g.pick("", "garbage", "[2001:db8::1]:443", "198.51.100.7:8080", "::ffff:198.51.100.8", "fe80::1%eth0")
	}
	return fmt.Sprintf("198.51.100.%d", g.rng.IntN(5))
}

func (g *checkGen) request() *authv3.CheckRequest {
	method := g.pick("POST", "POST", "POST", "GET", "post", "PUT", "")
	path := g.pick(
		"/api/v1/conversations/"+g.uuid()+"/activities",
		"/api/v1/converger/conversations/c/activities?watermark=x",
		"/api/v1/converger/conversations/c/upload",
		"/api/v1/channels/"+g.uuid()+"/inbound",
		"/api/v1/channels/"+strings.ToUpper(g.uuid())+"/status",
		"/api/v1/channels/%2e%2e/inbound",
		"/api/v1/converger/tokens/generate",
		"/api/v1/converger/tokens/refresh",
		"/api/v1/converger/tokens/publishable",
		"/api/v1/tokens", "/API/V1/TOKENS?x=1", "/admin/password/reset", "/portal/login", "/", "", "/api//v1/./tokens",
	)
	h := map[string]string{
		":authority": "api.converger.example", ":method": method, ":path": path, ":scheme": "https",
		"x-forwarded-proto": "https", "accept": "application/json", "user-agent": "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
		"accept-language": "en-US,en;q=0.9", "origin": "https://shop.example", "content-type": "application/json",
		"content-length": fmt.Sprint(g.rng.IntN(5000)), "x-envoy-expected-rq-timeout-ms": "15000",
		"x-b3-traceid": "80f198ee56343ba864fe8b2a57d3eff7", "x-b3-spanid": "e457b5a2e4d86bd1", "x-b3-sampled": "1",
		"cookie": "_ga=GA1.2.1; theme=dark", "sec-fetch-mode": "cors",
	}
	switch g.rng.IntN(4) {
	case 0:
		delete(h, "x-request-id")
	case 1:
		h["x-request-id"] = g.pick("has space", "ü", strings.Repeat("r", 200), "", `q"uote\`)
	default:
		h["x-request-id"] = fmt.Sprintf("req-%d", g.rng.IntN(1000))
	}
	if g.rng.IntN(3) > 0 {
		xff := g.ip()
		for range g.rng.IntN(3) {
			xff += ", " + g.pick("10.0.0.1", g.ip(), "10.1.2.3")
		}
		h["x-forwarded-for"] = xff
	}
	switch g.rng.IntN(8) {
	case 0, 1:
		h["authorization"] = "Bearer " + g.e.tokens[g.rng.IntN(len(g.e.tokens))]
	case 2:
		h["authorization"] = "bearer " + g.e.publishableTokens[g.rng.IntN(len(g.e.publishableTokens))]
	case 3:
		h["authorization"] = g.pick("Bearer cvg_pk_"+strings.Repeat("A", 20+g.rng.IntN(3)), "Bearer sec"+strings.Repeat("s", 30), "Bearer eyJ.a.b", "Basic x", "Bearer ")
	}
	if g.rng.IntN(3) == 0 {
		h["x-api-key"] = g.pick("cvg_live_"+strings.Repeat("k", 20+g.rng.IntN(3)), "nope", "cvg_live_"+strings.Repeat("!", 20))
	}
	src := &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: g.pick("10.0.0.11", "10.0.0.12", g.ip()), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(1024 + g.rng.IntN(60000))}}}}
	if g.rng.IntN(20) == 0 {
		src = &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/run/envoy.sock"}}}
	}
	http := &authv3.AttributeContext_HttpRequest{
		Id: fmt.Sprint(g.rng.Uint64()), Method: method, Headers: h, Path: path, Host: "api.converger.example",
		Scheme: "https", Protocol: g.pick("HTTP/1.1", "HTTP/2"), Size: int64(g.rng.IntN(5000)) - 1,
	}
	if g.rng.IntN(4) == 0 {
		// encode_raw_headers: the headers as a list, in any letter case, raw.
		hm := &corev3.HeaderMap{}
		for k, v := range h {
			if g.rng.IntN(3) == 0 {
				k = strings.ToUpper(k)
			}
			hv := &corev3.HeaderValue{Key: k, RawValue: []byte(v)}
			if g.rng.IntN(4) == 0 {
				hv = &corev3.HeaderValue{Key: k, Value: v}
			}
			hm.Headers = append(hm.Headers, hv)
			if g.rng.IntN(10) == 0 {
				hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte("second \xff")})
			}
		}
		http.HeaderMap, http.Headers = hm, nil
		if g.rng.IntN(5) == 0 {
			http.Headers = map[string]string{"x-other": "1"} // the map wins when it has entries
		}
	}
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: src, Principal: g.pick("", "spiffe://cluster.local/ns/edge/sa/envoy")},
		Destination: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "10.0.1.10", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 443}}}}},
		Request:     &authv3.AttributeContext_Request{Time: timestamppb.New(epoch), Http: http},
	}}
	if g.rng.IntN(5) == 0 {
		st, _ := structpb.NewStruct(map[string]any{"k": "v", "n": 1.5, "l": []any{true, nil, map[string]any{"x": "y"}}})
		req.Attributes.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": st}}
		req.Attributes.ContextExtensions = map[string]string{"virtual_host": "edge"}
		req.Attributes.TlsSession = &authv3.AttributeContext_TLSSession{Sni: "api.converger.example"}
	}
	return req
}

// rateLimitGen generates RateLimitRequests over testRules' domains and keys, with
// overrides, hits_addend and refunds, some over the bounds and some refused.
type rateLimitGen struct{ rng *rand.Rand }

func (g *rateLimitGen) pick(s ...string) string { return s[g.rng.IntN(len(s))] }

func (g *rateLimitGen) request() *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: g.pick("shop", "shop", "beyond", "beyond", "unknown", "")}
	if g.rng.IntN(4) == 0 {
		req.HitsAddend = uint32(g.rng.IntN(4))
	}
	n := g.rng.IntN(4)
	if g.rng.IntN(50) == 0 {
		n = 250 + g.rng.IntN(20)
	}
	for range n {
		d := &rlv3.RateLimitDescriptor{}
		k := g.rng.IntN(3) + 1
		if g.rng.IntN(60) == 0 {
			k = 60 + g.rng.IntN(10)
		}
		for range k {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{
				Key:   g.pick("client_id", "promo", "route", "quota", "files", "tenant", "api", "client", "window", "careful", "job", "other", ""),
				Value: g.pick("c1", "c2", "partner-7", "healthcheck", "/checkout/x", "img/a.png", "t1", "tiles", "x|y=%", ""),
			})
		}
		switch g.rng.IntN(8) {
		case 0:
			d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(g.rng.IntN(5)), Unit: typeUnit(g.rng.IntN(9) - 1)}
			if g.rng.IntN(3) == 0 {
				d.Limit.UnitMultiplier = wrapperspb.UInt32(uint32(g.rng.IntN(3)) * uint32(1+g.rng.IntN(100000)))
			}
		case 1:
			d.HitsAddend = wrapperspb.UInt64(uint64(g.rng.IntN(3)))
		case 2:
			d.IsNegativeHits = true
			d.HitsAddend = wrapperspb.UInt64(1)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// merge concatenates the encodings of msgs: to proto.Unmarshal, one message that merges
// them (later scalars win, repeated fields and maps add up, messages merge, a oneof's
// last member wins).
func merge(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = append(b, m...)
	}
	return b
}

// mutate returns b damaged in one of the ways a hostile or broken client damages it.
func mutate(rng *rand.Rand, b []byte) []byte {
	b = append([]byte(nil), b...)
	if len(b) == 0 {
		return []byte{0x0a}
	}
	switch rng.IntN(8) {
	case 0: // truncated
		return b[:rng.IntN(len(b))]
	case 1: // one byte changed
		b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
	case 2: // a byte that is not UTF-8
		b[rng.IntN(len(b))] = 0xff
	case 3: // an unknown field of every wire type, at the top
		b = protowire.AppendTag(b, protowire.Number(100+rng.IntN(1000)), protowire.Type(rng.IntN(8)))
		b = append(b, byte(rng.IntN(256)), byte(rng.IntN(256)))
	case 4: // a huge length
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, 1<<uint(20+rng.IntN(40)))
	case 5: // bytes inserted
		i := rng.IntN(len(b))
		b = append(b[:i], append([]byte{byte(rng.IntN(256)), byte(rng.IntN(256))}, b[i:]...)...)
	case 6: // a prefix repeated: the start of a message merged with itself
		b = append(b, b[:rng.IntN(len(b))]...)
	default: // a field number out of range, or a stray end-group
		b = append(b, []byte{0xf8, 0xff, 0xff, 0xff, 0x1f, 0x00}[rng.IntN(2)*5:]...)
	}
	return b
}

// wireMsg builds a message from fields: num and its value (a string or []byte as
// length-delimited, a uint64 as varint, a nested []field as a message).
type wireField struct {
	num protowire.Number
	v   any
}

func wireMsg(fields ...wireField) []byte {
	var b []byte
	for _, f := range fields {
		switch v := f.v.(type) {
		case string:
			b = protowire.AppendTag(b, f.num, protowire.BytesType)
			b = protowire.AppendString(b, v)
		case []byte:
			b = protowire.AppendTag(b, f.num, protowire.BytesType)
			b = protowire.AppendBytes(b, v)
		case uint64:
			b = protowire.AppendTag(b, f.num, protowire.VarintType)
			b = protowire.AppendVarint(b, v)
		case []wireField:
			b = protowire.AppendTag(b, f.num, protowire.BytesType)
			b = protowire.AppendBytes(b, wireMsg(v...))
		default:
			panic(fmt.Sprintf("wireMsg: %T", v))
		}
	}
	return b
}

// crafted are CheckRequests and RateLimitRequests no marshaler writes, built field by
// field: what the standard path refuses or reads in its own way must be refused or
// read the same.
func craftedChecks() map[string][]byte {
	http := func(fs ...wireField) []byte {
		return wireMsg(wireField{1, []wireField{{4, []wireField{{2, fs}}}}})
	}
	header := func(k, v string) wireField { return wireField{3, []wireField{{1, k}, {2, v}}} }
	source := func(addr ...wireField) wireField {
		return wireField{1, []wireField{{1, []wireField{{1, addr}}}}}
	}
	socket := func(ip string) wireField { return wireField{1, []wireField{{2, ip}}} }
	cases := map[string][]byte{
		"method and path":              http(wireField{2, "POST"}, wireField{4, "/api/v1/tokens"}),
		"non-UTF-8 header value":       http(wireField{2, "POST"}, header("x-api-key", "\xff")),
		"non-UTF-8 header key":         http(header("x-\xfe", "v")),
		"non-UTF-8 path":               http(wireField{4, "/api/v1/\xc3"}),
		"non-UTF-8 raw_value":          http(wireField{2, "POST"}, wireField{4, "/api/v1/tokens"}, wireField{13, []wireField{{1, []wireField{{1, "X-Forwarded-For"}, {3, []byte("198.51.100.1\xff")}}}}}),
		"header entry without key":     http(wireField{3, []wireField{{2, "v"}}}),
		"header entry twice":           http(header("x-request-id", "a"), header("x-request-id", "b")),
		"header entry, key twice":      http(wireField{3, []wireField{{1, "x"}, {1, "x-request-id"}, {2, "v"}}}),
		"header entry, value twice":    http(wireField{3, []wireField{{1, "x-request-id"}, {2, "v1"}, {2, "v2"}}}),
		"header entry, value varint":   http(wireField{3, []wireField{{1, "x-request-id"}, {2, uint64(7)}}}),
		"header entry, unknown field":  http(wireField{3, []wireField{{1, "x-request-id"}, {9, "?"}, {2, "v"}}}),
		"method as a varint":           http(wireField{2, uint64(1)}, wireField{4, "/api/v1/tokens"}),
		"path as a message":            http(wireField{4, []wireField{{1, "x"}}}),
		"http twice, merged":           merge(http(wireField{2, "POST"}), http(wireField{4, "/api/v1/tokens"}, header("x-forwarded-for", "198.51.100.4"))),
		"source, pipe, then socket":    wireMsg(source(wireField{2, []wireField{{1, "/p"}}}, socket("198.51.100.5"))),
		"source, socket, then pipe":    wireMsg(source(socket("198.51.100.5"), wireField{2, []wireField{{1, "/p"}}})),
		"source, socket merged":        merge(wireMsg(source(socket("198.51.100.5"))), wireMsg(source(wireField{1, []wireField{{3, uint64(80)}}}))),
		"source, internal then socket": merge(wireMsg(source(wireField{3, []wireField{{1, "l"}}})), wireMsg(source(wireField{1, []wireField{{3, uint64(80)}}}))),
		"socket address not UTF-8":     wireMsg(source(socket("198.51.100.\xff"))),
		"empty":                        {},
		"field 0":                      {0x00},
		"field 2^29":                   protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType),
		"wire type 6":                  {0x0e},
		"stray end-group":              {0x0c},
		"group of an unknown field":    {0x5b, 0x08, 0x01, 0x5c},
		"unbalanced group":             {0x5b, 0x08, 0x01},
		"overlong varint":              {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
		"10-byte varint":               {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"huge length":                  {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"truncated fixed64":            {0x09, 0x01, 0x02},
		"headers map as a varint":      http(wireField{3, uint64(1)}),
	}
	for total := 9998; total <= 10002; total++ {
		cases[fmt.Sprintf("metadata %d deep", total)] = metadataDeep(total, nil)
		// A map field with another wire type still takes its level (Struct.fields as a
		// varint, in a Struct one level above), a message field does not (Value.list_value).
		cases[fmt.Sprintf("metadata %d deep, a map as a varint", total)] = metadataDeep(total-2, []byte{0x2a, 0x02, 0x08, 0x01})
		cases[fmt.Sprintf("metadata %d deep, a list as a varint", total)] = metadataDeep(total-1, []byte{0x30, 0x01})
	}
	return cases
}

// metadataDeep is a CheckRequest whose metadata_context nests total levels deep, counted
// as proto.Unmarshal counts them (each message and each map entry one), the innermost a
// google.protobuf.Value holding inner: CheckRequest, AttributeContext, Metadata, its
// filter_metadata entry, Struct, its fields entry, then Values in lists (two levels each:
// ListValue, Value) and in structs (three: Struct, entry, Value). The nesting is built
// from the inside out as prefixes, so that it takes linear time.
func metadataDeep(total int, inner []byte) []byte {
	rest := total - 7 // the first Value is level 7
	structs := 0
	for rest%2 != 0 {
		rest -= 3
		structs++
	}
	var prefixes [][]byte
	n := len(inner)
	wrap := func(num protowire.Number, p []byte) {
		p = protowire.AppendVarint(protowire.AppendTag(p, num, protowire.BytesType), uint64(n))
		n += len(p)
		prefixes = append(prefixes, p)
	}
	for range rest / 2 {
		wrap(1, nil) // ListValue.values
		wrap(6, nil) // Value.list_value
	}
	for range structs {
		wrap(2, []byte{0x0a, 0x01, 'k'}) // the entry's key, then its value
		wrap(1, nil)                     // Struct.fields
		wrap(5, nil)                     // Value.struct_value
	}
	var v []byte
	for i := len(prefixes) - 1; i >= 0; i-- {
		v = append(v, prefixes[i]...)
	}
	v = append(v, inner...)
	return wireMsg(wireField{1, []wireField{{11, []wireField{{1, []wireField{{1, "a"}, {2, []wireField{{1, []wireField{{1, "b"}, {2, v}}}}}}}}}}})
}

func craftedRateLimits() map[string][]byte {
	desc := func(fs ...wireField) wireField { return wireField{2, fs} }
	entry := func(k, v string) wireField { return wireField{1, []wireField{{1, k}, {2, v}}} }
	many := func(n int, f wireField) []byte {
		fs := []wireField{{1, "shop"}}
		for range n {
			fs = append(fs, f)
		}
		return wireMsg(fs...)
	}
	manyEntries := []wireField{}
	for range 70 {
		manyEntries = append(manyEntries, entry("client_id", "c"))
	}
	return map[string][]byte{
		"one descriptor":             wireMsg(wireField{1, "shop"}, desc(entry("client_id", "c1"))),
		"domain twice":               wireMsg(wireField{1, "nope"}, wireField{1, "shop"}, desc(entry("client_id", "c1"))),
		"domain not UTF-8":           wireMsg(wireField{1, "sh\xffop"}, desc(entry("client_id", "c1"))),
		"entry value not UTF-8":      wireMsg(wireField{1, "shop"}, desc(entry("client_id", "\xc3"))),
		"hits_addend over 32 bits":   wireMsg(wireField{1, "shop"}, wireField{3, uint64(1<<32 + 2)}, desc(entry("client_id", "c2"))),
		"limit merged":               wireMsg(wireField{1, "shop"}, desc(entry("x", "y"), wireField{2, []wireField{{1, uint64(5)}}}, wireField{2, []wireField{{2, uint64(3)}}})),
		"empty limit":                wireMsg(wireField{1, "shop"}, desc(entry("x", "y"), wireField{2, []wireField{}})),
		"unit over 32 bits":          wireMsg(wireField{1, "shop"}, desc(entry("x", "y"), wireField{2, []wireField{{1, uint64(5)}, {2, uint64(1<<32 + 2)}}})),
		"empty hits_addend":          wireMsg(wireField{1, "shop"}, desc(entry("client_id", "c3"), wireField{3, []wireField{}})),
		"refund as a big varint":     merge(wireMsg(wireField{1, "beyond"}, desc(entry("job", "j"))), wireMsg(desc(entry("job", "j"), wireField{4, uint64(256)}, wireField{3, []wireField{{1, uint64(1)}}}))),
		"257 descriptors":            many(257, desc(entry("client_id", "c4"))),
		"300 empty descriptors":      many(300, desc()),
		"70 entries":                 wireMsg(wireField{1, "shop"}, desc(manyEntries...)),
		"entries over, domain empty": wireMsg(wireField{1, ""}, desc(manyEntries...)),
		"descriptor as a varint":     wireMsg(wireField{1, "shop"}, wireField{2, uint64(1)}),
		"no descriptors":             wireMsg(wireField{1, "shop"}),
	}
}

func typeUnit(u int) typev3.RateLimitUnit { return typev3.RateLimitUnit(u) }
