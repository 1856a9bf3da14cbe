// Package procs runs the child processes of a benchmark (sidecars, servers): each in its
// own process group and killed with the benchmark, its output kept for error messages.
package procs

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/converger/edge/bench/benchtls"
)

// Proc is a running child process. It runs in its own process group (a Ctrl-C on the
// terminal reaches the benchmark only, which then stops it) and is killed by the kernel
// if the benchmark dies.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Out  *TailWriter
	done chan struct{} // closed when the process has exited; err is set before
	err  error
}

// Start starts cmd with its stderr going to out.
func Start(name string, cmd *exec.Cmd, out *TailWriter) (*Proc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = out
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited returns an error, with the end of the process's output, when it has exited.
func (p *Proc) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("the %s exited (%v); its last output:\n%s", p.Name, p.err, p.Out.Tail())
	default:
		return nil
	}
}

// Stop asks the process to stop (SIGTERM), and kills it after 5 seconds. It does nothing
// on a nil Proc.
func (p *Proc) Stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// StopAll stops the processes in parallel and returns when all have exited.
func StopAll(ps []*Proc) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.Stop)
	}
	wg.Wait()
}

// TailWriter passes a child's output on, prefixed, and keeps its end for error messages.
type TailWriter struct {
	Prefix string
	W      io.Writer // nil: keep only
	// Line, when set, is called with each line of the output (outside any lock of the
	// writer). A child that logs one record per write, as slog does, gives whole lines.
	Line func(line string)

	mu  sync.Mutex
	buf []byte
}

const tailMax = 8 << 10

func (t *TailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - tailMax; over > 0 {
		t.buf = append([]byte(nil), t.buf[over:]...)
	}
	if t.W != nil {
		for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
			fmt.Fprintf(t.W, "%s%s\n", t.Prefix, line)
		}
	}
	t.mu.Unlock()
	if t.Line != nil {
		for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
			t.Line(line)
		}
	}
	return len(p), nil
}

// Tail returns the end of the output.
func (t *TailWriter) Tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// SidecarEnvPrefixes are the variables of the sidecar that a benchmark sets itself, or
// that must not leak into it from the caller's environment.
var SidecarEnvPrefixes = []string{"SIDECAR_", "DATABASE_URL=", "RATE_LIMIT_", "CLUSTER_", "TOKEN_", "TRUSTED_PROXIES=", "LOG_"}

// SidecarEnv returns this process's environment without the sidecar's variables, for a
// sidecar whose configuration the benchmark sets in full.
func SidecarEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		keep := true
		for _, p := range SidecarEnvPrefixes {
			keep = keep && !strings.HasPrefix(kv, p)
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}

// readyWait is how long WaitReady waits for a process to answer.
const readyWait = 30 * time.Second

// WaitReady polls url, with header (nil for none), until it answers 200, the process
// exits, or readyWait passes.
func WaitReady(ctx context.Context, p *Proc, url string, header http.Header) error {
	client, err := benchtls.HTTPClient(time.Second) // https:// URLs on mutual TLS
	if err != nil {
		return err
	}
	deadline := time.Now().Add(readyWait)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if perr := p.Exited(); perr != nil {
			return perr
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s is not ready after %v (%s: %v); its last output:\n%s", p.Name, readyWait, url, err, p.Out.Tail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// FreePorts returns n free loopback TCP addresses.
func FreePorts(n int) ([]string, error) {
	var addrs []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// FreeTCPUDPPorts returns n loopback addresses whose port is free for both TCP and UDP,
// as memberlist binds both.
func FreeTCPUDPPorts(n int) ([]string, error) {
	var addrs []string
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	for tries := 0; len(addrs) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("no port free for both TCP and UDP after %d tries", tries)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		closers = append(closers, l)
		u, err := net.ListenPacket("udp", l.Addr().String())
		if err != nil {
			continue // taken for UDP: try another
		}
		closers = append(closers, u)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}
