package authzload

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/sidecar/routes"
)

// classID is a kind of request of the mix: a route and the credential it carries.
type classID uint8

// The request classes.
const (
	cGetTenantActivities classID = iota
	cGetClientActivities
	cGetTenantConversation
	cGetClientConversation
	cPostTenantActivity
	cPostClientActivity
	cUpload
	cInbound
	cStatus
	cGenerate
	cRefresh
	cPublishable
	cLegacyTokens
	cAdminReset
	cPortalReset
	cAdminPost
	cAdminPatch
	cAdminDelete
	numClasses
)

// class describes a request class.
type class struct {
	Name   string
	Method string
	// Kind is the kind of the key the request is counted or identified by.
	Kind Kind
	// Weight is the class's share of the normal traffic, per mille.
	Weight int
	// Bucket is the bucket the request is counted in first; "" for unlimited routes.
	Bucket string
	// Pattern is the route of routes.BuiltIn() the class exercises, "" for unlimited ones.
	Pattern string
}

// classes is the mix: reads are 38% of the traffic, activity writes and inbound webhooks
// most of the rest, credential minting and password resets 2.5%. The routes counted in
// 60-second windows are rare, as in production, so that a normal key stays within its
// budget (5 or 10 a minute) even when the sidecar answers tens of thousands of checks a
// second and passes over the mix's body several times a minute.
var classes = [numClasses]class{
	cGetTenantActivities:   {"GET activities (tenant API)", "GET", KindAPIKey, 137, "", ""},
	cGetClientActivities:   {"GET activities (client API)", "GET", KindToken, 175, "", ""},
	cGetTenantConversation: {"GET conversation (tenant API)", "GET", KindAPIKey, 30, "", ""},
	cGetClientConversation: {"GET conversation (client API)", "GET", KindToken, 30, "", ""},
	cPostTenantActivity:    {"POST activities (x-api-key)", "POST", KindAPIKey, 160, buckets.ActivityCreate, "/api/v1/conversations/:id/activities"},
	cPostClientActivity:    {"POST activities (token)", "POST", KindToken, 160, buckets.ActivityCreate, "/api/v1/converger/conversations/:id/activities"},
	cUpload:                {"POST upload (token)", "POST", KindToken, 20, buckets.Upload, "/api/v1/converger/conversations/:id/upload"},
	cInbound:               {"POST channels/:id/inbound", "POST", KindPath, 180, buckets.Inbound, "/api/v1/channels/:channel_id/inbound"},
	cStatus:                {"POST channels/:id/status", "POST", KindPath, 80, buckets.Inbound, "/api/v1/channels/:channel_id/status"},
	cGenerate:              {"POST tokens/generate (secret)", "POST", KindSecret, 5, buckets.TokenGenerate, "/api/v1/converger/tokens/generate"},
	cRefresh:               {"POST tokens/refresh (token)", "POST", KindToken, 5, buckets.TokenGenerate, "/api/v1/converger/tokens/refresh"},
	cPublishable:           {"POST tokens/publishable", "POST", KindPublishable, 5, buckets.PublishableTokenIP, "/api/v1/converger/tokens/publishable"},
	cLegacyTokens:          {"POST /api/v1/tokens (legacy)", "POST", KindIP, 5, buckets.TokenCreate, "/api/v1/tokens"},
	cAdminReset:            {"POST /admin/password/reset", "POST", KindIP, 3, buckets.PasswordResetIP, "/admin/password/reset"},
	cPortalReset:           {"POST /portal/password/reset", "POST", KindIP, 2, buckets.PasswordResetIP, "/portal/password/reset"},
	cAdminPost:             {"POST console writes", "POST", KindIP, 1, buckets.AdminWrite, "/admin/api/v1/tenants/:id/activate"},
	cAdminPatch:            {"PATCH console limits", "PATCH", KindIP, 1, buckets.AdminWrite, "/admin/api/v1/tenants/:id/limits"},
	cAdminDelete:           {"DELETE console limits", "DELETE", KindIP, 1, buckets.AdminWrite, "/admin/api/v1/tenants/:id/limits"},
}

// adminWrites are the console's write routes (routes.AdminWrites) by method, which the
// classes cAdminPost, cAdminPatch and cAdminDelete take turns at.
var adminWrites = func() map[string][]string {
	m := map[string][]string{}
	for _, r := range routes.AdminWrites() {
		m[r.Method] = append(m[r.Method], r.Pattern)
	}
	return m
}()

// homeClass is the class of a key's prologue request: one that looks the key up.
var homeClass = [numKinds]classID{
	KindIP: cLegacyTokens, KindAPIKey: cPostTenantActivity, KindToken: cPostClientActivity,
	KindSecret: cGenerate, KindPublishable: cPublishable, KindPath: cInbound,
}

// normalPerKey is the number of normal requests per key in one pass over the mix's body.
// With the class weights, a normal key on a 60-second route is seen about once per pass.
const normalPerKey = 20

// hotClass returns the class of the i-th hot key of a kind's bursts.
func hotClass(k Kind, i int) classID {
	switch k {
	case KindIP:
		return [...]classID{cLegacyTokens, cAdminReset, cPortalReset}[i%3]
	case KindToken:
		// Tokens with i%3 == 0 have src publishable (NewPopulation); the others are
		// secret tokens, whose refresh counts in token_generate.
		return [...]classID{cPostClientActivity, cUpload, cRefresh}[i%3]
	}
	return homeClass[k]
}

// burstSize is the number of requests of a hot key's burst: enough to run its bucket's
// default budget out (1.5× the limit of a 1-second bucket, twice that of a longer one).
func burstSize(c classID) int {
	b, ok := buckets.Lookup(classes[c].Bucket)
	if !ok {
		return 0
	}
	if b.Default.Window <= time.Second {
		return int(math.Ceil(1.5 * float64(b.Default.Count)))
	}
	return 2 * int(b.Default.Count)
}

// Mix is the pre-built request sequence: a prologue that sends every key once (so that
// the warm-up fills the sidecar's caches), then a body that repeats. In the body, normal
// keys are spread evenly and hot keys come in bursts, each half of the requests in its span.
type Mix struct {
	Pop      *Population
	Prologue int

	data  []byte // the marshaled CheckRequests, back to back
	off   []int  // request i is data[off[i]:off[i+1]]
	class []classID
	key   []int32
}

// BuildMix builds the requests of the mix, as Envoy sends them, and marshals them.
func BuildMix(p *Population, seed uint64, now time.Time) (*Mix, error) {
	rng := rand.New(rand.NewPCG(seed, 0x6d1c_5eed))
	type slot struct {
		t     float64
		class classID
		key   int32
	}

	// Normal traffic: classes by weight, keys of each kind in a shuffled round robin.
	var cum []int
	var cls []classID
	total := 0
	for c := range numClasses {
		if len(p.Normal[classes[c].Kind]) > 0 {
			total += classes[c].Weight
			cum = append(cum, total)
			cls = append(cls, c)
		}
	}
	if total == 0 {
		return nil, fmt.Errorf("the population has no normal keys")
	}
	var order [numKinds][]int
	var next [numKinds]int
	for k := range numKinds {
		order[k] = slices.Clone(p.Normal[k])
		rng.Shuffle(len(order[k]), func(i, j int) { order[k][i], order[k][j] = order[k][j], order[k][i] })
	}
	nNormal := normalPerKey * len(p.Keys)
	nHot := 0
	for k := range numKinds {
		for i := range p.Hot[k] {
			nHot += burstSize(hotClass(k, i))
		}
	}
	slots := make([]slot, 0, nNormal+nHot)
	for j := range nNormal {
		x := rng.IntN(total)
		c := cls[sortSearch(cum, x)]
		k := classes[c].Kind
		key := order[k][next[k]%len(order[k])]
		next[k]++
		slots = append(slots, slot{t: (float64(j) + rng.Float64()) / float64(nNormal), class: c, key: int32(key)})
	}
	// Hot traffic: one burst per hot key, every other request of its span.
	step := 2 / float64(nNormal+nHot)
	for k := range numKinds {
		for i, key := range p.Hot[k] {
			c := hotClass(k, i)
			u := rng.Float64()
			for h := range burstSize(c) {
				t := u + float64(h)*step
				t -= math.Floor(t)
				hc := c
				if c == cInbound && rng.IntN(10) < 3 {
					hc = cStatus
				}
				slots = append(slots, slot{t: t, class: hc, key: int32(key)})
			}
		}
	}
	slices.SortStableFunc(slots, func(a, b slot) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	// Prologue: every key once, in random order.
	prologue := rng.Perm(len(p.Keys))

	n := len(prologue) + len(slots)
	m := &Mix{Pop: p, Prologue: len(prologue), off: make([]int, 1, n+1), class: make([]classID, 0, n), key: make([]int32, 0, n)}
	m.data = make([]byte, 0, n*900)
	b := &builder{p: p, rng: rng, now: now}
	opts := proto.MarshalOptions{}
	add := func(c classID, key int) error {
		var err error
		m.data, err = opts.MarshalAppend(m.data, b.request(c, key))
		if err != nil {
			return err
		}
		m.off = append(m.off, len(m.data))
		m.class = append(m.class, c)
		m.key = append(m.key, int32(key))
		return nil
	}
	for _, key := range prologue {
		if err := add(homeClass[p.Keys[key].Kind], key); err != nil {
			return nil, err
		}
	}
	for _, s := range slots {
		if err := add(s.class, int(s.key)); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// sortSearch returns the first i with x < cum[i].
func sortSearch(cum []int, x int) int {
	i, _ := slices.BinarySearch(cum, x+1)
	return i
}

// Len is the number of pre-built requests.
func (m *Mix) Len() int { return len(m.class) }

// Position returns the sequence position of the i-th request sent: the prologue once, then
// the body over and over.
func (m *Mix) Position(i uint64) int {
	if i < uint64(m.Prologue) {
		return int(i)
	}
	return m.Prologue + int((i-uint64(m.Prologue))%uint64(m.Len()-m.Prologue))
}

// Bytes returns the marshaled request at a position.
func (m *Mix) Bytes(pos int) []byte { return m.data[m.off[pos]:m.off[pos+1]:m.off[pos+1]] }

// Request returns the request at a position, unmarshaled.
func (m *Mix) Request(pos int) (*authv3.CheckRequest, error) {
	r := &authv3.CheckRequest{}
	return r, proto.Unmarshal(m.Bytes(pos), r)
}

// Key returns the index of the key of the request at a position.
func (m *Mix) Key(pos int) int { return int(m.key[pos]) }

// Class returns the class of the request at a position.
func (m *Mix) Class(pos int) classID { return m.class[pos] }

// Size is the size of all requests in bytes.
func (m *Mix) Size() int { return len(m.data) }

// builder makes CheckRequests as Envoy sends them: Envoy behind a load balancer
// (TRUSTED_PROXIES covers it), which puts the client in x-forwarded-for.
type builder struct {
	p      *Population
	rng    *rand.Rand
	now    time.Time
	stream uint64
}

// lbAddrs are the load balancer's addresses: Envoy's direct peers.
var lbAddrs = []string{"10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"}

// TrustedProxies is the TRUSTED_PROXIES the sidecar runs with.
const TrustedProxies = "10.0.0.0/8"

const host = "api.converger.example"

var (
	serverAgents  = []string{"converger-node/2.4.1 node/22.11.0", "python-requests/2.32.3", "Go-http-client/2.0", "converger-ruby/1.9.0"}
	browserAgents = []string{
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
		"Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
	}
	webhookAgents = []string{"WhatsApp-Webhooks/1.0", "Twilio.TmeWs/1.0", "Slackbot 1.0 (+https://api.slack.com/robots)"}
)

func (b *builder) pick(s []string) string { return s[b.rng.IntN(len(s))] }

// clientOf returns the client address of a request by key: the key itself on IP routes,
// else an address of the same world (hot or normal).
func (b *builder) clientOf(k *Key, key int) string {
	if k.Kind == KindIP {
		return k.Value
	}
	if k.Hot && len(b.p.Hot[KindIP]) > 0 {
		hot := b.p.Hot[KindIP]
		return b.p.Keys[hot[key%len(hot)]].Value
	}
	normal := b.p.Normal[KindIP]
	return b.p.Keys[normal[b.rng.IntN(len(normal))]].Value
}

// apiKeyOf returns a tenant API key for a request whose counted key is not one (the legacy
// token route is counted per IP but authenticated with x-api-key).
func (b *builder) apiKeyOf(k *Key) string {
	list := b.p.Normal[KindAPIKey]
	if k.Hot && len(b.p.Hot[KindAPIKey]) > 0 {
		list = b.p.Hot[KindAPIKey]
	}
	return b.p.Keys[list[b.rng.IntN(len(list))]].Value
}

func (b *builder) uuid() string { return formatUUID(uuid(b.rng)) }

// conversation returns one of a few conversations of a key.
func (b *builder) conversation(key int) string {
	x := uint64(key)<<3 | uint64(b.rng.IntN(4))
	var id [16]byte
	for i := range 2 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		for j := range 8 {
			id[8*i+j] = byte(z >> (8 * j))
		}
	}
	id[6], id[8] = id[6]&0x0f|0x40, id[8]&0x3f|0x80
	return formatUUID(id)
}

func (b *builder) watermark() string {
	return base64.RawURLEncoding.EncodeToString([]byte("seq:" + strconv.Itoa(b.rng.IntN(5000))))
}

// request builds the CheckRequest of class c for a key.
func (b *builder) request(c classID, key int) *authv3.CheckRequest {
	k := &b.p.Keys[key]
	cl := &classes[c]
	client := b.clientOf(k, key)
	h := make(map[string]string, 16)
	h[":authority"] = host
	h[":method"] = cl.Method
	h[":scheme"] = "https"
	h["x-request-id"] = b.uuid()
	h["x-forwarded-for"] = client
	h["x-forwarded-proto"] = "https"
	h["accept"] = "application/json"
	bearer := func(v string) { h["authorization"] = "Bearer " + v }
	body := 0
	jsonBody := func(lo, hi int) {
		body = lo + b.rng.IntN(hi-lo)
		h["content-type"] = "application/json"
	}
	browser := func() {
		h["user-agent"] = b.pick(browserAgents)
		h["origin"] = "https://shop-" + strconv.Itoa(k.Tenant) + ".example"
		h["accept-language"] = "en-US,en;q=0.9"
	}
	var path string
	switch c {
	case cGetTenantActivities:
		path = "/api/v1/conversations/" + b.conversation(key) + "/activities?limit=100"
		if b.rng.IntN(4) != 0 {
			path += "&watermark=" + b.watermark()
		}
		h["x-api-key"] = k.Value
		h["user-agent"] = b.pick(serverAgents)
	case cGetClientActivities:
		path = "/api/v1/converger/conversations/" + b.conversation(key) + "/activities?watermark=" + b.watermark()
		bearer(k.Value)
		browser()
	case cGetTenantConversation:
		path = "/api/v1/conversations/" + b.conversation(key)
		h["x-api-key"] = k.Value
		h["user-agent"] = b.pick(serverAgents)
	case cGetClientConversation:
		path = "/api/v1/converger/conversations/" + b.conversation(key) + "?watermark=" + strconv.Itoa(b.rng.IntN(500))
		bearer(k.Value)
		browser()
	case cPostTenantActivity:
		path = "/api/v1/conversations/" + b.conversation(key) + "/activities"
		h["x-api-key"] = k.Value
		h["user-agent"] = b.pick(serverAgents)
		h["x-idempotency-key"] = b.uuid()
		jsonBody(60, 2000)
	case cPostClientActivity:
		path = "/api/v1/converger/conversations/" + b.conversation(key) + "/activities"
		bearer(k.Value)
		browser()
		jsonBody(80, 600)
	case cUpload:
		path = "/api/v1/converger/conversations/" + b.conversation(key) + "/upload?userId=user-" + strconv.Itoa(key)
		bearer(k.Value)
		browser()
		body = 20_000 + b.rng.IntN(2_000_000)
		h["content-type"] = "multipart/form-data; boundary=----WebKitFormBoundary" + randomB64(b.rng, 12)
	case cInbound, cStatus:
		path = "/api/v1/channels/" + k.Value + "/inbound"
		if c == cStatus {
			path = "/api/v1/channels/" + k.Value + "/status"
		}
		sig := make([]byte, 32)
		for i := range sig {
			sig[i] = byte(b.rng.Uint32())
		}
		h["x-converger-signature"] = "t=" + strconv.FormatInt(b.now.Unix(), 10) + ",v1=" + hex.EncodeToString(sig)
		h["user-agent"] = b.pick(webhookAgents)
		jsonBody(120, 4000)
	case cGenerate:
		path = "/api/v1/converger/tokens/generate"
		bearer(k.Value)
		h["user-agent"] = b.pick(serverAgents)
		jsonBody(20, 60)
	case cRefresh:
		path = "/api/v1/converger/tokens/refresh"
		bearer(k.Value)
		browser()
	case cPublishable:
		path = "/api/v1/converger/tokens/publishable"
		bearer(k.Value)
		browser()
		jsonBody(20, 60)
	case cLegacyTokens:
		path = "/api/v1/tokens"
		h["x-api-key"] = b.apiKeyOf(k)
		h["user-agent"] = b.pick(serverAgents)
		jsonBody(80, 120)
	case cAdminReset, cPortalReset:
		path = "/admin/password/reset"
		if c == cPortalReset {
			path = "/portal/password/reset"
		}
		browser()
		h["accept"] = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
		h["content-type"] = "application/x-www-form-urlencoded"
		h["cookie"] = "_converger_session=" + randomB64(b.rng, 24)
		body = 90 + b.rng.IntN(60)
	case cAdminPost, cAdminPatch, cAdminDelete:
		patterns := adminWrites[cl.Method]
		path = strings.NewReplacer(":id", b.uuid(), ":bucket", buckets.Inbound).Replace(patterns[b.rng.IntN(len(patterns))])
		browser()
		h["cookie"] = "_converger_session=" + randomB64(b.rng, 24)
		h["x-csrf-token"] = randomB64(b.rng, 24)
		switch {
		case c == cAdminPatch:
			jsonBody(30, 200)
		case c == cAdminPost && strings.HasPrefix(path, "/admin/api/"):
			jsonBody(2, 60)
		case c == cAdminPost:
			h["content-type"] = "application/x-www-form-urlencoded"
			body = 60 + b.rng.IntN(60)
		}
	}
	if body > 0 {
		h["content-length"] = strconv.Itoa(body)
	}
	h[":path"] = path
	b.stream++
	lb := lbAddrs[b.rng.IntN(len(lbAddrs))]
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: socket(lb, uint32(1024+b.rng.IntN(64511)))},
		Destination: &authv3.AttributeContext_Peer{Address: socket("10.0.1.10", 10000)},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(b.now.Add(time.Duration(b.stream) * 50 * time.Microsecond)),
			Http: &authv3.AttributeContext_HttpRequest{
				Id:       strconv.FormatUint(b.stream*7919%1_000_000_007, 10),
				Method:   cl.Method,
				Headers:  h,
				Path:     path,
				Host:     host,
				Scheme:   "https",
				Protocol: "HTTP/1.1",
				Size:     int64(body),
			},
		},
	}}
}

func socket(addr string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}
