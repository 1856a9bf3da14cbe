// Package bodybudget bounds the memory a fasthttp server holds for request bodies: the
// bytes held for bodies being read (and then handled) are bounded in total and per
// client, a body's buffer grows with what has arrived rather than with what its
// Content-Length declares, and a body that arrives slower than a minimum rate is cut
// off. The server streams request bodies (fasthttp's StreamRequestBody) and reads next
// to nothing of them before the handler runs (a MaxRequestBodySize of 1), so that a
// body is read here.
package bodybudget

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Why a body was refused.
var (
	// ErrTooLarge: the body is (or is declared) longer than its bound.
	ErrTooLarge = errors.New("request body too large")
	// ErrBudget: holding the body would take the server, or its client, over budget.
	ErrBudget = errors.New("request body budget used up")
	// ErrTooSlow: the body arrives slower than the minimum rate, or not within the
	// time given.
	ErrTooSlow = errors.New("request body too slow")
	// ErrRead: the body could not be read (the client left, a malformed chunk).
	ErrRead = errors.New("request body unreadable")
)

// firstChunk is the least buffer a body gets; it doubles as bytes arrive.
const firstChunk = 4 << 10

// Budget is the bytes the bodies of a server may hold, in total and per client.
type Budget struct {
	total, perClient int64
	mu               sync.Mutex
	used             int64
	clients          map[string]int64
	refused          [4]atomic.Uint64 // by reason, as Reasons
}

// Reasons name the refusals for metrics, in the order of Refused.
var Reasons = [4]string{"too_large", "budget", "too_slow", "unreadable"}

// New returns a budget of total bytes, perClient of them for one client (0: total).
func New(total, perClient int64) *Budget {
	if perClient <= 0 || perClient > total {
		perClient = total
	}
	return &Budget{total: total, perClient: perClient, clients: map[string]int64{}}
}

// Used is the bytes held now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Total and PerClient are the budget's bounds.
func (b *Budget) Total() int64     { return b.total }
func (b *Budget) PerClient() int64 { return b.perClient }

// Refused is how many bodies were refused for Reasons[i].
func (b *Budget) Refused(i int) uint64 { return b.refused[i].Load() }

func (b *Budget) reserve(client string, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.total || b.clients[client]+n > b.perClient {
		return false
	}
	b.used += n
	b.clients[client] += n
	return true
}

func (b *Budget) give(client string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.clients[client] -= n; b.clients[client] <= 0 {
		delete(b.clients, client)
	}
}

// Held is the part of the budget a body holds.
type Held struct {
	b      *Budget
	client string
	n      int64
	once   sync.Once
}

// Release gives the body's bytes back to the budget (once; nil does nothing). Call it
// once the request is handled.
func (h *Held) Release() {
	if h == nil || h.b == nil {
		return
	}
	h.once.Do(func() { h.b.give(h.client, h.n) })
}

// Rules bound one body.
type Rules struct {
	// Max is the most bytes the body may have.
	Max int
	// Timeout bounds reading the whole body, from the call of Read.
	Timeout time.Duration
	// MinRate is the least average rate, in bytes per second, once Grace has passed
	// (0: none).
	MinRate int
	Grace   time.Duration
}

// Read reads ctx's streamed body within the budget and the rules, and makes it the
// request's body (what Request.Body returns). The caller releases what it returns
// once the request is handled. On an error nothing stays held, the body is partly
// read at most, and the caller answers and closes the connection.
func (b *Budget) Read(ctx *fasthttp.RequestCtx, client string, r Rules) (*Held, error) {
	h, err := b.read(ctx, client, r)
	if err != nil {
		b.Refuse(err)
	}
	return h, err
}

// Refuse counts a refusal the server made for one of the reasons itself (a body
// declared over its bound and refused before Read).
func (b *Budget) Refuse(err error) {
	for i, e := range []error{ErrTooLarge, ErrBudget, ErrTooSlow, ErrRead} {
		if err == e {
			b.refused[i].Add(1)
		}
	}
}

func (b *Budget) read(ctx *fasthttp.RequestCtx, client string, r Rules) (*Held, error) {
	req := &ctx.Request
	declared := req.Header.ContentLength() // -1: chunked
	stream := req.BodyStream()
	if stream == nil || declared == 0 {
		// Nothing to stream: no body, or one fasthttp read already (a server that
		// does not stream), bounded by its own limit.
		if len(req.Body()) > r.Max {
			return nil, ErrTooLarge
		}
		return nil, nil
	}
	if declared > r.Max {
		return nil, ErrTooLarge
	}
	limit := r.Max + 1 // one more byte than allowed tells a chunked body over the bound
	if declared > 0 {
		limit = declared
	}
	h := &Held{b: b, client: client}
	start := time.Now()
	deadline := start.Add(r.Timeout)
	conn := ctx.Conn()
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			next := min(max(2*cap(buf), firstChunk), limit)
			if next <= cap(buf) {
				// The declared length has arrived; the stream ends here.
				break
			}
			if !b.reserve(client, int64(next-cap(buf))) {
				h.Release()
				return nil, ErrBudget
			}
			h.n += int64(next - cap(buf))
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		if conn != nil {
			d := deadline
			if r.MinRate > 0 {
				if rd := start.Add(r.Grace + time.Duration(float64(len(buf)+1)/float64(r.MinRate)*float64(time.Second))); rd.Before(d) {
					d = rd
				}
			}
			_ = conn.SetReadDeadline(d)
		}
		n, err := stream.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > r.Max {
			h.Release()
			return nil, ErrTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			h.Release()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, ErrTooSlow
			}
			return nil, ErrRead
		}
	}
	if declared > 0 && len(buf) != declared {
		h.Release()
		return nil, ErrRead
	}
	req.SetBodyRaw(buf)
	return h, nil
}
