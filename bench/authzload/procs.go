package authzload

import (
	"bufio"
	"context"
	"errors"
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
)

// proc is a child process: the sidecar or the no-op server. It runs in its own process
// group (a Ctrl-C on the terminal reaches the load test only, which then stops it) and is
// killed by the kernel if the load test dies.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *tailWriter
	done chan struct{} // closed when the process has exited; err is set before
	err  error
}

func startProc(name string, cmd *exec.Cmd, out *tailWriter) (*proc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = out
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited returns an error when the process has exited.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("the %s exited (%v); its last output:\n%s", p.name, p.err, p.out.tail())
	default:
		return nil
	}
}

// stop asks the process to stop (SIGTERM), and kills it after 5 seconds.
func (p *proc) stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tailWriter passes a child's output on, prefixed, and keeps its end for error messages.
type tailWriter struct {
	prefix string
	w      io.Writer // nil: keep only

	mu  sync.Mutex
	buf []byte
}

const tailMax = 8 << 10

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - tailMax; over > 0 {
		t.buf = append([]byte(nil), t.buf[over:]...)
	}
	if t.w != nil {
		for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
			fmt.Fprintf(t.w, "%s%s\n", t.prefix, line)
		}
	}
	return len(p), nil
}

func (t *tailWriter) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// sidecarEnvPrefixes are the variables of the sidecar that the load test sets itself, or
// that must not leak into it from the caller's environment.
var sidecarEnvPrefixes = []string{"SIDECAR_", "DATABASE_URL=", "RATE_LIMIT_", "CLUSTER_", "TOKEN_", "TRUSTED_PROXIES=", "LOG_"}

// startSidecar starts the sidecar binary on free loopback ports and waits until /readyz
// answers 200. It returns the process and its gRPC and HTTP addresses.
func startSidecar(ctx context.Context, bin, databaseURL, verifyKey string, log io.Writer) (p *proc, grpcAddr, httpAddr string, err error) {
	var env []string
	for _, kv := range os.Environ() {
		keep := true
		for _, p := range sidecarEnvPrefixes {
			keep = keep && !strings.HasPrefix(kv, p)
		}
		if keep {
			env = append(env, kv)
		}
	}
	var lastErr error
	for range 3 {
		ports, err := freePorts(2)
		if err != nil {
			return nil, "", "", err
		}
		grpcAddr, httpAddr = ports[0], ports[1]
		cmd := exec.Command(bin)
		cmd.Env = append(env,
			"SIDECAR_GRPC_ADDR="+grpcAddr,
			"SIDECAR_HTTP_ADDR="+httpAddr,
			"DATABASE_URL="+databaseURL,
			"TOKEN_VERIFY_KEYS="+verifyKey,
			"TRUSTED_PROXIES="+TrustedProxies,
			"LOG_LEVEL=warn",
			"LOG_FORMAT=text",
		)
		p, err = startProc("sidecar", cmd, &tailWriter{prefix: "sidecar: ", w: log})
		if err != nil {
			return nil, "", "", err
		}
		err = waitReady(ctx, p, "http://"+httpAddr+"/readyz")
		if err == nil {
			return p, grpcAddr, httpAddr, nil
		}
		p.stop()
		if !strings.Contains(p.out.tail(), "address already in use") {
			return nil, "", "", err
		}
		lastErr = err // a port was taken in between: try others
	}
	return nil, "", "", lastErr
}

// waitReady polls url until it answers 200, the process exits, or 20 seconds pass.
func waitReady(ctx context.Context, p *proc, url string) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
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
		if perr := p.exited(); perr != nil {
			return perr
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s is not ready after 20s (%s: %v); its last output:\n%s", p.name, url, err, p.out.tail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startNoop starts `<this binary> noop-authz` on a free port and returns the address it
// prints.
func startNoop(ctx context.Context, log io.Writer) (*proc, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("finding the bench binary: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(exe, "noop-authz", "-addr", "127.0.0.1:0")
	cmd.Stdout = w
	p, err := startProc("no-op server", cmd, &tailWriter{prefix: "noop-authz: ", w: log})
	w.Close()
	if err != nil {
		r.Close()
		return nil, "", err
	}
	addrc := make(chan string, 1)
	go func() {
		// The pipe is read until the server exits, so that it never writes to a closed pipe.
		defer r.Close()
		line, _ := bufio.NewReader(r).ReadString('\n')
		addrc <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case addr := <-addrc:
		if _, _, err := net.SplitHostPort(addr); err != nil {
			p.stop()
			if perr := p.exited(); perr != nil {
				return nil, "", perr
			}
			return nil, "", fmt.Errorf("the no-op server printed %q instead of its address", addr)
		}
		return p, addr, nil
	case <-time.After(20 * time.Second):
		err = errors.New("the no-op server did not print its address within 20s")
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.stop()
	return nil, "", err
}

// freePorts returns n free loopback addresses.
func freePorts(n int) ([]string, error) {
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
