package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rssOf is a process's resident memory in bytes.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// dialFrom opens a connection from a loopback source address and sends s.
func dialFrom(addr, source, s string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 3 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if s != "" {
		_ = c.SetWriteDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte(s)); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// The HTTP port against slow clients: 400 connections declare a 1 MiB body to /json and
// send a byte a second, 200 send their headers a byte a second, 1,000 stay idle. The
// sidecar's heap grows by far less than the bodies declared, the slow bodies are cut
// off with 408 by the least rate, and a probe is answered throughout (within a second
// but on a busy machine under the race detector: the test allows 2 s and logs the
// probes over 1 s).
func TestHTTPPortAgainstSlowClients(t *testing.T) {
	n := startNode(t, "", "slow", map[string]string{"SIDECAR_GRPC_ADDR": "127.0.0.1:0", "SIDECAR_HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"})
	defer terminate(t, n)
	baseHeap := n.metric("go_memstats_heap_inuse_bytes")
	baseRSS := rssOf(t, n.cmd.Process.Pid)

	var bodies, headers, idle []net.Conn
	defer func() {
		for _, cs := range [][]net.Conn{bodies, headers, idle} {
			for _, c := range cs {
				c.Close()
			}
		}
	}()
	for i := range 400 {
		c, err := dialFrom(n.httpAddr, []string{"127.0.0.2", "127.0.0.3"}[i%2],
			"POST /json HTTP/1.1\r\nHost: sidecar.test\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{\"")
		if err == nil {
			bodies = append(bodies, c)
		}
	}
	for range 200 {
		if c, err := dialFrom(n.httpAddr, "127.0.0.4", "POST /json HTTP/1.1\r\nHost: sidecar.test\r\nX-Pad: "); err == nil {
			headers = append(headers, c)
		}
	}
	for i := range 1000 {
		if c, err := dialFrom(n.httpAddr, []string{"127.0.0.5", "127.0.0.6"}[i%2], ""); err == nil {
			idle = append(idle, c)
		}
	}
	if len(bodies) < 390 || len(headers) < 190 || len(idle) < 990 {
		t.Fatalf("opened %d, %d, %d connections", len(bodies), len(headers), len(idle))
	}

	var (
		mu               sync.Mutex
		slow             []string
		probes           int
		overSecond       int
		peakHeap, peakRS float64
		stop             = make(chan struct{})
		wg               sync.WaitGroup
	)
	wg.Go(func() { // a byte a second
		for range 7 {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			for _, c := range append(append([]net.Conn(nil), bodies...), headers...) {
				_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
				_, _ = c.Write([]byte("a"))
			}
		}
	})
	wg.Go(func() { // a probe every 200 ms, from another address
		tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.7")}}).DialContext, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr, Timeout: 2 * time.Second}
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			start := time.Now()
			resp, err := client.Get("http://" + n.httpAddr + "/healthz")
			took := time.Since(start)
			if err == nil {
				resp.Body.Close()
			}
			heap := n.metric("go_memstats_heap_inuse_bytes")
			rss := float64(rssOf(t, n.cmd.Process.Pid))
			mu.Lock()
			probes++
			peakHeap, peakRS = max(peakHeap, heap), max(peakRS, rss)
			if err != nil || resp.StatusCode != 200 || took > 2*time.Second {
				slow = append(slow, fmt.Sprintf("%v after %v", err, took))
			}
			if took > time.Second {
				overSecond++
			}
			mu.Unlock()
		}
	})
	time.Sleep(7500 * time.Millisecond)
	close(stop)
	wg.Wait()
	cut := 0
	for _, c := range bodies {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 408 {
				cut++
			}
		}
	}
	t.Logf("heap in use %.1f MiB before, peak %.1f MiB; RSS %.0f MiB before, peak %.0f MiB; %d of %d slow bodies cut off with 408; %d probes, %d over 1 s",
		baseHeap/(1<<20), peakHeap/(1<<20), float64(baseRSS)/(1<<20), peakRS/(1<<20), cut, len(bodies), probes, overSecond)
	// The connections' own buffers (24 KiB read, 4 KiB write, each of 1,600) are most of
	// it; the bodies declared 400 MiB.
	if growth := peakHeap - baseHeap; growth > 128<<20 {
		t.Errorf("heap grew by %.0f MiB (the bodies declared %d MiB)", growth/(1<<20), len(bodies))
	}
	if cut < len(bodies)*9/10 {
		t.Errorf("%d of %d bodies at a byte a second cut off with 408", cut, len(bodies))
	}
	if len(slow) > 0 {
		t.Errorf("%d of %d probes not answered within 2 s (the sidecar runs under the race detector): %v", len(slow), probes, slow)
	}
}
