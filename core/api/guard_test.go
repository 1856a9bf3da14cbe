package api_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/metrics"
)

// A write whose client closed its connection before the core got to it (the request
// waited to be read on an overloaded machine) is not done: nobody is there for the
// answer, and under overload that work is what the core cannot spare. The requests
// are sent corked, so that their bytes and the client's FIN arrive together, as they
// do when a request waited behind others.
func TestWriteOfAClientGoneIsNotDone(t *testing.T) {
	m := metrics.New()
	e := newEnv(t, envOptions{deps: func(d *api.Deps, _ string) { d.Metrics = m }})
	s := e.setup("webhook")
	addr := strings.TrimPrefix(e.base, "http://")
	const gone = 20
	for i := range gone {
		body := `{"type":"message","text":"nobody waits"}`
		req := fmt.Sprintf("POST /api/v1/conversations/%s/activities HTTP/1.1\r\nHost: core\r\nx-api-key: %s\r\n"+
			"x-idempotency-key: gone-%d\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s",
			s.conv, s.key, i, len(body), body)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := c.(*net.TCPConn).SyscallConn()
		var corkErr error
		if err := raw.Control(func(fd uintptr) { corkErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, 1) }); err != nil || corkErr != nil {
			t.Fatal(err, corkErr)
		}
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		c.Close() // the corked request goes out with the FIN
	}
	// The control: the same write from a client that waits is stored.
	e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", map[string]any{"text": "someone waits"},
		withHeader(apiKey(s.key), "x-idempotency-key", "there")).data(t, 201, &tenantActivity{})

	deadline := time.Now().Add(5 * time.Second)
	for shed(t, m, metrics.ShedClientGone) < gone && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := shed(t, m, metrics.ShedClientGone); n != gone {
		t.Errorf("%v requests of gone clients shed (client_gone), want %d", n, gone)
	}
	var stored int
	if err := e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM activities WHERE idempotency_key LIKE 'gone-%'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != 0 {
		t.Errorf("%d of %d writes of clients that had gone were stored", stored, gone)
	}
}

// shed is converger_core_requests_shed_total{reason}.
func shed(t *testing.T, m *metrics.Metrics, reason string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "converger_core_requests_shed_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no converger_core_requests_shed_total{reason=%q}", reason)
	return 0
}
