package envoywire

import (
	"math/rand/v2"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/sidecar/authz"
)

// Answering a request through the codec allocates nothing once its pools are warm:
// decode, decide and encode, allowed or denied, for every kind of identity, the headers
// map or header_map.
func TestHotPathDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	e := newEnv(t)
	names, msgs := e.recorded(t, "check", newCheckRequest)
	g := &checkGen{rng: rand.New(rand.NewPCG(9, 9)), e: e}
	for range 100 {
		b, err := proto.Marshal(g.request())
		if err != nil {
			t.Fatal(err)
		}
		names, msgs = append(names, "generated"), append(msgs, b)
	}
	tested := 0
	for i, b := range msgs {
		var req authv3.CheckRequest
		if proto.Unmarshal(b, &req) != nil {
			continue // refused: its error is the one allocation
		}
		// Not in the claim: a path with percent-escapes or dot segments, resolved into a
		// new string; an x-request-id the answer cannot echo (none with Envoy), which a
		// denial replaces with a new one.
		r := authz.RequestOf(&req)
		if strings.ContainsAny(r.Path, "%\\") || strings.Contains(r.Path, "/.") {
			continue
		}
		if id := r.Header(authz.HeaderRequestID); apierror.RequestID(id) != id {
			continue
		}
		tested++
		if n := testing.AllocsPerRun(200, func() { _ = answerCheck(e.wire, b) }); n != 0 {
			var v checkCall
			v.decode(b)
			t.Errorf("%s: %v allocations per Check of %q %q", names[i], n, v.req.Method, v.req.Path)
		}
	}
	if tested < 20 {
		t.Fatalf("only %d requests tested", tested)
	}
	for i := range 10 {
		b := typicalRateLimit(t, i)
		if n := testing.AllocsPerRun(200, func() { _ = answerRateLimit(e.wireRLS, b) }); n != 0 {
			t.Errorf("%v allocations per ShouldRateLimit", n)
		}
	}
	_, rmsgs := e.recorded(t, "ratelimit", newRateLimitRequest)
	for _, b := range rmsgs {
		if n := testing.AllocsPerRun(200, func() { _ = answerRateLimit(e.wireRLS, b) }); n != 0 {
			t.Errorf("%v allocations per ShouldRateLimit", n)
		}
	}
}
