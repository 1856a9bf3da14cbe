package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"
)

// clientToken exchanges the fixture's publishable key for a token and opens a
// conversation with it: the conversation's id and its bound token.
func clientToken(t *testing.T, base, publishable string) (conv, tok string) {
	t.Helper()
	a := send("POST", base+"/api/v1/converger/tokens/publishable", nil, map[string]string{"authorization": "Bearer " + publishable}, 5*time.Second)
	var issued struct{ Token string }
	if a.err != nil || a.status != 200 || json.Unmarshal(a.body, &issued) != nil {
		t.Fatalf("publishable token: %v %d %s", a.err, a.status, a.body)
	}
	a = send("POST", base+"/api/v1/converger/conversations", nil, map[string]string{"authorization": "Bearer " + issued.Token}, 5*time.Second)
	var c struct{ ConversationID, Token string }
	if a.err != nil || a.status != 201 || json.Unmarshal(a.body, &c) != nil {
		t.Fatalf("conversation: %v %d %s", a.err, a.status, a.body)
	}
	return c.ConversationID, c.Token
}

// bodyRoute is a route that takes a body, with a credential that holds and one that
// does not (nil: the route has none to give).
type bodyRoute struct {
	path        string
	good, wrong map[string]string
}

// slowBody opens a connection from source and sends a request's headers declaring
// declared bytes of body, then first bytes of it; the caller trickles the rest.
func slowBody(addr, source, path string, header map[string]string, declared, first int) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 3 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: core.test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, declared)
	for k, v := range header {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	b.WriteString(strings.Repeat("a", first))
	_ = c.SetWriteDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(b.String())); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// upload sends a multipart upload of n bytes of text to the conversation.
func upload(base, source, conv, tok string, n int) answer {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="file"; filename="big.txt"`)
	h.Set("Content-Type", "text/plain")
	p, _ := w.CreatePart(h)
	_, _ = p.Write(bytes.Repeat([]byte("0123456789abcdef"), n/16))
	w.Close()
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}).DialContext, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("POST", base+"/api/v1/converger/conversations/"+conv+"/upload?userId=u1", &buf)
	req.Header.Set("content-type", w.FormDataContentType())
	req.Header.Set("authorization", "Bearer "+tok)
	start := time.Now()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, body: body.Bytes(), took: time.Since(start)}
}

// 1,000 connections send the headers of a 4,000,000-byte body to every route that
// takes one, with and without a credential that holds, then a byte a second for 8 s
// (half of those with a credential send 20 KiB first, so that their bodies reach the
// budget before the least rate cuts them off): the core's memory grows by less than 200 MiB, a new client is answered
// within a second throughout, a 4 MB upload from another client works, a body slower
// than CORE_BODY_MIN_RATE is cut off with 408, and the core stays up.
func TestSlowBodies(t *testing.T) {
	f := newFixture(t, "", 1)
	core := newProc(t, f.env(map[string]string{"CORE_BODY_MIN_RATE": "4096"})).start(t)
	addr := strings.TrimPrefix(core.base, "http://")
	conv, tok := clientToken(t, core.base, f.publishable)
	key := map[string]string{"x-api-key": f.apiKey}
	badKey := map[string]string{"x-api-key": "cvg_live_" + strings.Repeat("x", 43)}
	bearer := map[string]string{"authorization": "Bearer " + tok}
	badBearer := map[string]string{"authorization": "Bearer not-a-token"}
	signed := map[string]string{"x-converger-signature": fmt.Sprintf("t=%d,v1=%s", time.Now().Unix(), strings.Repeat("ab", 32))}
	routes := []bodyRoute{
		{"/api/v1/conversations", key, badKey},
		{"/api/v1/conversations/" + f.convs[0] + "/activities", key, badKey},
		{"/api/v1/conversations/" + f.convs[0] + "/close", key, nil},
		{"/api/v1/tokens", key, badKey},
		{"/api/v1/converger/tokens/generate", nil, badBearer},
		{"/api/v1/converger/tokens/publishable", nil, map[string]string{"authorization": "Bearer " + f.publishable}},
		{"/api/v1/converger/tokens/refresh", bearer, badBearer},
		{"/api/v1/converger/conversations", bearer, nil},
		{"/api/v1/converger/conversations/" + conv + "/activities", bearer, badBearer},
		{"/api/v1/converger/conversations/" + conv + "/upload?userId=u1", bearer, badBearer},
		{"/api/v1/channels/" + f.channelID + "/inbound", signed, nil},
		{"/api/v1/channels/" + f.channelID + "/status", signed, nil},
		{"/admin/login", nil, nil},
		{"/portal/login", nil, nil},
		{"/admin/api/v1/tenants/" + f.tenantID + "/limits", nil, map[string]string{"cookie": "converger_session=forged"}},
	}
	baseRSS, _ := memory(t, core.cmd.Process.Pid)

	// A body declared over its route's limit is answered 413 at once, before a byte of it.
	over, err := slowBody(addr, "127.0.0.9", "/api/v1/conversations", key, 4_000_000, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if resp, err := http.ReadResponse(bufio.NewReader(over), nil); err != nil || resp.StatusCode != 413 || time.Since(start) > 2*time.Second {
		t.Errorf("a body declared over the limit, none sent: %v %v after %v, want 413 at once", resp, err, time.Since(start))
	}
	over.Close()

	// A body slower than the minimum rate, on the upload route (60 s to read): cut off
	// once 5 s of grace and 10 KiB at 4 KiB/s have passed.
	slowStart := time.Now()
	slow, err := slowBody(addr, "127.0.0.6", "/api/v1/converger/conversations/"+conv+"/upload?userId=u1", bearer, 4_000_000, 10<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slowAnswer := make(chan string, 1)
	go func() {
		_ = slow.SetReadDeadline(time.Now().Add(15 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
		if err != nil {
			slowAnswer <- fmt.Sprintf("no answer after %v: %v", time.Since(slowStart), err)
			return
		}
		resp.Body.Close()
		slowAnswer <- fmt.Sprintf("%d after %.1fs", resp.StatusCode, time.Since(slowStart).Seconds())
	}()

	sources := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}
	var conns []net.Conn
	opened, withCredential := 0, 0
	for i := range 1000 {
		r := routes[i%len(routes)]
		h, first := r.wrong, 0
		if k := i / len(routes); k%2 == 0 && r.good != nil {
			h, first = r.good, 0
			withCredential++
			if k%4 == 0 {
				first = 20 << 10
			}
		}
		c, err := slowBody(addr, sources[i%len(sources)], r.path, h, 4_000_000, first)
		if err != nil {
			continue
		}
		opened++
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if opened < 900 {
		t.Fatalf("only %d of 1,000 connections opened", opened)
	}

	var (
		mu              sync.Mutex
		slowProbes      []string
		probes, peakRSS = 0, int64(0)
		uploaded        answer
		stop            = make(chan struct{})
		wg              sync.WaitGroup
	)
	wg.Go(func() { // a byte a second on every connection
		for range 8 {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			for _, c := range conns {
				_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
				_, _ = c.Write([]byte("a"))
			}
		}
	})
	wg.Go(func() { // a new client, every 200 ms
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			a := probe(core.base, "127.0.0.7", time.Second)
			mu.Lock()
			probes++
			if a.err != nil || a.status != 401 || a.took > time.Second {
				slowProbes = append(slowProbes, fmt.Sprintf("%v %d after %v", a.err, a.status, a.took))
			}
			mu.Unlock()
			rss, _ := memory(t, core.cmd.Process.Pid)
			mu.Lock()
			peakRSS = max(peakRSS, rss)
			mu.Unlock()
		}
	})
	wg.Go(func() { // a normal upload from another client, during the flood
		time.Sleep(2 * time.Second)
		a := upload(core.base, "127.0.0.8", conv, tok, 4_000_000)
		mu.Lock()
		uploaded = a
		mu.Unlock()
	})
	time.Sleep(8 * time.Second)
	close(stop)
	wg.Wait()
	core.alive()
	_, hwm := memory(t, core.cmd.Process.Pid)
	peakRSS = max(peakRSS, hwm)
	t.Logf("%d connections (%d with a credential); RSS %.0f MiB before, peak %.0f MiB; %d probes, %d slow; upload %d in %v",
		opened, withCredential, float64(baseRSS)/(1<<20), float64(peakRSS)/(1<<20), probes, len(slowProbes), uploaded.status, uploaded.took)
	defer func() {
		t.Logf("bodies refused: over budget %.0f, too large %.0f, too slow %.0f",
			metric(t, core.ops, "converger_core_bodies_refused_budget_total"), metric(t, core.ops, "converger_core_bodies_refused_too_large_total"),
			metric(t, core.ops, "converger_core_bodies_refused_too_slow_total"))
	}()
	if growth := peakRSS - baseRSS; growth > 200<<20 {
		t.Errorf("RSS grew by %.0f MiB, want less than 200", float64(growth)/(1<<20))
	}
	if len(slowProbes) > 0 {
		t.Errorf("%d of %d new clients not answered 401 within 1 s: %v", len(slowProbes), probes, slowProbes)
	}
	if uploaded.err != nil || uploaded.status != 200 {
		t.Errorf("a 4 MB upload during the flood: %v %d %s", uploaded.err, uploaded.status, uploaded.body)
	}
	select {
	case got := <-slowAnswer:
		if !strings.HasPrefix(got, "408 ") {
			t.Errorf("a body slower than the minimum rate: %s, want 408 after about 7.5 s", got)
		}
	case <-time.After(5 * time.Second):
		t.Error("a body slower than the minimum rate: no answer after 13 s, want 408 after about 7.5 s")
	}
}
