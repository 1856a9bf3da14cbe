package main_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// upgrade opens a connection from source and asks for the stream of conv with tok;
// it returns the status and, for a 101, the open connection.
func upgrade(addr, source, conv, tok string) (int, net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 3 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return 0, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /api/v1/converger/conversations/%s/stream?t=%s HTTP/1.1\r\nHost: core.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", conv, url.QueryEscape(tok))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return 0, nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return resp.StatusCode, nil, nil
	}
	_ = c.SetDeadline(time.Time{})
	return resp.StatusCode, c, nil
}

// 400 streams of one token: CORE_MAX_STREAMS_PER_TOKEN (10) held, the rest refused 429
// at once; then 2,000 sockets
// from one address over 60 conversations: CORE_MAX_SOCKETS_PER_IP (256) held, the rest
// refused; meanwhile the core's memory stays bounded and a new client is answered
// within a second.
func TestStreamAndSocketCaps(t *testing.T) {
	f := newFixture(t, "", 0)
	core := newProc(t, f.env(nil)).start(t)
	addr := strings.TrimPrefix(core.base, "http://")
	type conv struct{ id, tok string }
	var convs []conv
	for range 60 {
		id, tok := clientToken(t, core.base, f.publishable)
		convs = append(convs, conv{id, tok})
	}
	baseRSS, _ := memory(t, core.cmd.Process.Pid)
	var (
		mu       sync.Mutex
		slow     []string
		probes   int
		peakRSS  int64
		stop     = make(chan struct{})
		probing  sync.WaitGroup
		held     []net.Conn
		statuses = map[string]map[int]int{}
		worst    time.Duration
	)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	probing.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			a := probe(core.base, "127.0.0.7", time.Second)
			rss, _ := memory(t, core.cmd.Process.Pid)
			mu.Lock()
			probes++
			peakRSS = max(peakRSS, rss)
			if a.err != nil || a.status != 401 || a.took > time.Second {
				slow = append(slow, fmt.Sprintf("%v %d after %v", a.err, a.status, a.took))
			}
			mu.Unlock()
		}
	})
	run := func(phase, source string, n int, pick func(i int) conv) {
		statuses[phase] = map[int]int{}
		var wg sync.WaitGroup
		next := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range next {
					cv := pick(i)
					start := time.Now()
					code, c, err := upgrade(addr, source, cv.id, cv.tok)
					took := time.Since(start)
					mu.Lock()
					if err != nil {
						code = -1
					}
					statuses[phase][code]++
					if c != nil {
						held = append(held, c)
					} else {
						worst = max(worst, took)
					}
					mu.Unlock()
				}
			})
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	run("one token", "127.0.0.2", 400, func(int) conv { return convs[0] })
	run("one address", "127.0.0.3", 2000, func(i int) conv { return convs[1+i%(len(convs)-1)] })
	time.Sleep(500 * time.Millisecond)
	close(stop)
	probing.Wait()
	core.alive()
	t.Logf("%v; slowest refusal %v; RSS %.0f MiB before, peak %.0f MiB; %d probes, %d slow; open sockets %.0f",
		statuses, worst, float64(baseRSS)/(1<<20), float64(peakRSS)/(1<<20), probes, len(slow), metric(t, core.ops, "converger_core_sockets"))
	if got := statuses["one token"]; got[101] != 10 || got[429] != 390 {
		t.Errorf("400 streams of one token: %v, want 10 × 101 and 390 × 429", got)
	}
	if got := statuses["one address"]; got[101] != 256 || got[101]+got[429] != 2000 {
		t.Errorf("2,000 streams from one address: %v, want 256 × 101 and the rest 429", got)
	}
	// At once: well under a second on a quiet machine; 2 s allows for a shared one.
	if worst > 2*time.Second {
		t.Errorf("a refusal took %v", worst)
	}
	// Each refusal is counted by the first bound it met (the second phase's meet the
	// per-token bound too, once a token's 10 are held).
	tokenRefusals := metric(t, core.ops, "converger_core_sockets_refused_stream_token_total")
	ipRefusals := metric(t, core.ops, "converger_core_sockets_refused_client_ip_total")
	if tokenRefusals < 390 || ipRefusals == 0 || tokenRefusals+ipRefusals != 390+1744 {
		t.Errorf("refusals counted: %v per token, %v per address; want 2,134 in all, at least 390 per token", tokenRefusals, ipRefusals)
	}
	if growth := peakRSS - baseRSS; growth > 100<<20 {
		t.Errorf("RSS grew by %.0f MiB with %d sockets held", float64(growth)/(1<<20), len(held))
	}
	if len(slow) > 0 {
		t.Errorf("%d of %d new clients not answered within 1 s: %v", len(slow), probes, slow)
	}
}
