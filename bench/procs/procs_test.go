package procs

import (
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestTailWriter(t *testing.T) {
	var out strings.Builder
	var mu sync.Mutex
	var lines []string
	tw := &TailWriter{Prefix: "x: ", W: &out, Line: func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() }}
	if _, err := tw.Write([]byte("one\ntwo\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(strings.Repeat("a", tailMax) + "\n")); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.HasPrefix(got, "x: one\nx: two\nx: aaa") {
		t.Errorf("passed on %q…", got[:min(len(got), 20)])
	}
	if len(lines) != 3 || lines[0] != "one" || lines[1] != "two" {
		t.Errorf("lines %q", lines[:min(len(lines), 2)])
	}
	if tail := tw.Tail(); len(tail) != tailMax || strings.Contains(tail, "one") {
		t.Errorf("tail of %d bytes, want the last %d", len(tail), tailMax)
	}
}

func TestStartStop(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	p, err := Start("sleeper", exec.Command(sleep, "60"), &TailWriter{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Exited(); err != nil {
		t.Fatalf("exited at once: %v", err)
	}
	start := time.Now()
	StopAll([]*Proc{p, nil})
	if time.Since(start) > 4*time.Second {
		t.Errorf("SIGTERM took %v", time.Since(start))
	}
	select {
	case <-p.Done():
	default:
		t.Error("still running after Stop")
	}
	if err := p.Exited(); err == nil || !strings.Contains(err.Error(), "sleeper exited") {
		t.Errorf("Exited after Stop = %v", err)
	}
}

func TestFreeTCPUDPPorts(t *testing.T) {
	addrs, err := FreeTCPUDPPorts(3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Errorf("%s twice", a)
		}
		seen[a] = true
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Errorf("TCP %s: %v", a, err)
			continue
		}
		u, err := net.ListenPacket("udp", a)
		if err != nil {
			t.Errorf("UDP %s: %v", a, err)
		} else {
			u.Close()
		}
		l.Close()
	}
}

func TestSidecarEnv(t *testing.T) {
	t.Setenv("CLUSTER_JOIN", "x:1")
	t.Setenv("RATE_LIMIT_SHARE_MODE", "false")
	t.Setenv("BENCH_PROCS_KEEP", "1")
	env := strings.Join(SidecarEnv(), "\n")
	if strings.Contains(env, "CLUSTER_JOIN") || strings.Contains(env, "RATE_LIMIT_SHARE_MODE") {
		t.Error("a sidecar variable leaked")
	}
	if !strings.Contains(env, "BENCH_PROCS_KEEP=1") {
		t.Error("another variable was dropped")
	}
}
