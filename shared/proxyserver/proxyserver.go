// Package proxyserver runs real Caddy, nginx and Traefik with the repository's shipped
// configurations (deploy/caddy/Caddyfile, deploy/nginx/converger.conf,
// deploy/traefik/converger.yml) in front of a sidecar and an upstream on loopback, for
// the tests and the benchmarks.
package proxyserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/converger/edge/shared/debpkg"
)

// The proxies, by the name of their Debian package (Traefik has none).
const (
	Caddy   = "caddy"
	Nginx   = "nginx"
	Traefik = "traefik"
)

// TraefikBinary is the Traefik binary to run: $TRAEFIK, else traefik on PATH; "" when
// there is none. Debian has no package, and building one from the Go module proxy
// (`go build ./cmd/traefik` in github.com/traefik/traefik/v3@v3.6.12) takes half an hour
// on 2 cores, so the tests run Traefik only where one is provided.
func TraefikBinary() string {
	if b := os.Getenv("TRAEFIK"); b != "" {
		return b
	}
	b, _ := exec.LookPath("traefik")
	return b
}

// Binaries are the proxies' binaries where Debian's packages install them.
var Binaries = map[string]string{Caddy: "/usr/bin/caddy", Nginx: "/usr/sbin/nginx"}

// Missing lists the proxies that are not installed.
func Missing() []string {
	var out []string
	for _, name := range []string{Caddy, Nginx} {
		if !debpkg.IsExecutable(Binaries[name]) {
			out = append(out, name)
		}
	}
	return out
}

// Options describe a proxy to start.
type Options struct {
	Proxy string // Caddy or Nginx
	// Root is the repository root, where deploy/ is.
	Root string
	// Sidecar is the sidecar's HTTP address (SIDECAR_HTTP_ADDR). Empty: the proxy alone,
	// a plain reverse proxy without the check, as the baseline of a benchmark.
	Sidecar string
	// Upstream is the address of the service behind the proxy.
	Upstream string
	// Dir is a directory of its own for the proxy's files.
	Dir string
	// Output receives what the proxy writes (its logs); nil discards it.
	Output *Tail
}

// Proxy is a running proxy.
type Proxy struct {
	Name string
	Addr string // host:port it listens on
	Out  *Tail
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the proxy on a free loopback port and waits until it listens.
func Start(ctx context.Context, o Options) (*Proxy, error) {
	if o.Output == nil {
		o.Output = &Tail{}
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	switch o.Proxy {
	case Caddy:
		cmd, err = caddy(o, addr)
	case Nginx:
		cmd, err = nginx(o, addr)
	case Traefik:
		cmd, err = traefik(o, addr)
	default:
		return nil, fmt.Errorf("proxyserver: unknown proxy %q", o.Proxy)
	}
	if err != nil {
		return nil, err
	}
	p := &Proxy{Name: o.Proxy, Addr: addr, Out: o.Output, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = o.Output, o.Output
	// Its own process group (a Ctrl-C reaches only the caller, which stops it), and
	// killed by the kernel if the caller dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("proxyserver: starting %s: %w", o.Proxy, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if listening(o.Proxy, addr) {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("proxyserver: %s exited before it listened on %s:\n%s", o.Proxy, addr, o.Output.String())
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("proxyserver: %s does not listen on %s after 30 s:\n%s", o.Proxy, addr, o.Output.String())
		}
	}
}

// listening reports whether the proxy serves: it accepts connections, and Traefik, which
// loads its file provider after it listens, routes (answers anything but its 404).
func listening(proxy, addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	if proxy != Traefik {
		return true
	}
	resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + "/")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusNotFound
}

// Pid is the proxy's process id.
func (p *Proxy) Pid() int { return p.cmd.Process.Pid }

// Exited returns an error, with the end of the proxy's output, once it has exited.
func (p *Proxy) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited; its last output:\n%s", p.Name, p.Out.String())
	default:
		return nil
	}
}

// Stop stops the proxy (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (p *Proxy) Stop() {
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

// caddy runs deploy/caddy/Caddyfile as shipped, its addresses set through the
// environment variables it reads; alone, a Caddyfile with only the reverse proxy.
func caddy(o Options, addr string) (*exec.Cmd, error) {
	config := filepath.Join(o.Root, "deploy", "caddy", "Caddyfile")
	if o.Sidecar == "" {
		config = filepath.Join(o.Dir, "Caddyfile")
		alone := fmt.Sprintf("{\n\tadmin off\n}\n\nhttp://%s {\n\tbind 127.0.0.1\n\treverse_proxy %s\n}\n", addr, o.Upstream)
		if err := os.WriteFile(config, []byte(alone), 0o644); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(Binaries[Caddy], "run", "--adapter", "caddyfile", "--config", config)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + o.Dir, "XDG_DATA_HOME=" + o.Dir, "XDG_CONFIG_HOME=" + o.Dir,
		"CONVERGER_CADDY_ADMIN=off",
		"CONVERGER_SITE=http://" + addr,
		"CONVERGER_BIND=127.0.0.1",
		"CONVERGER_SIDECAR=" + o.Sidecar,
		"CONVERGER_CORE=" + o.Upstream,
	}
	return cmd, nil
}

// nginx runs deploy/nginx/converger.conf, included in the http block of a minimal
// nginx.conf, with only its addresses replaced; alone, without its auth_request line.
func nginx(o Options, addr string) (*exec.Cmd, error) {
	shipped, err := os.ReadFile(filepath.Join(o.Root, "deploy", "nginx", "converger.conf"))
	if err != nil {
		return nil, err
	}
	conf := string(shipped)
	edits := [][2]string{
		{"server 127.0.0.1:8082;", "server " + o.Sidecar + ";"},
		{"server 127.0.0.1:8080;", "server " + o.Upstream + ";"},
		{"listen 8000;", "listen " + addr + ";"},
	}
	if o.Sidecar == "" {
		edits[0][1] = "server 127.0.0.1:9;" // never asked
		edits = append(edits, [2]string{"auth_request /.converger/check;", ""})
	}
	for _, e := range edits {
		if n := strings.Count(conf, e[0]); n != 1 {
			return nil, fmt.Errorf("proxyserver: deploy/nginx/converger.conf has %q %d times, want once", e[0], n)
		}
		conf = strings.Replace(conf, e[0], e[1], 1)
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "converger.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	var temps strings.Builder
	for _, k := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&temps, "  %s_temp_path %s;\n", k, filepath.Join(o.Dir, k))
	}
	// One process, in the foreground: stopped and killed with the caller.
	main := fmt.Sprintf("daemon off;\nmaster_process off;\npid %s;\nerror_log stderr notice;\n"+
		"events { worker_connections 1024; }\nhttp {\n  access_log off;\n%s  include %s;\n}\n",
		filepath.Join(o.Dir, "nginx.pid"), temps.String(), filepath.Join(o.Dir, "converger.conf"))
	if err := os.WriteFile(filepath.Join(o.Dir, "nginx.conf"), []byte(main), 0o644); err != nil {
		return nil, err
	}
	return exec.Command(Binaries[Nginx], "-p", o.Dir, "-c", filepath.Join(o.Dir, "nginx.conf")), nil
}

// traefik runs deploy/traefik/converger.yml with the file provider, only its addresses
// replaced, and the static configuration it describes given as flags.
func traefik(o Options, addr string) (*exec.Cmd, error) {
	bin := TraefikBinary()
	if bin == "" {
		return nil, errors.New("proxyserver: no Traefik binary: set TRAEFIK or put traefik on PATH")
	}
	if o.Sidecar == "" {
		return nil, errors.New("proxyserver: Traefik runs only with the check")
	}
	shipped, err := os.ReadFile(filepath.Join(o.Root, "deploy", "traefik", "converger.yml"))
	if err != nil {
		return nil, err
	}
	conf := string(shipped)
	for _, e := range [][2]string{
		{"address: http://127.0.0.1:8082/check", "address: http://" + o.Sidecar + "/check"},
		{"url: http://127.0.0.1:8080", "url: http://" + o.Upstream},
	} {
		if n := strings.Count(conf, e[0]); n != 1 {
			return nil, fmt.Errorf("proxyserver: deploy/traefik/converger.yml has %q %d times, want once", e[0], n)
		}
		conf = strings.Replace(conf, e[0], e[1], 1)
	}
	file := filepath.Join(o.Dir, "converger.yml")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--entryPoints.web.address="+addr, "--providers.file.filename="+file,
		"--log.level=INFO", "--global.checkNewVersion=false", "--global.sendAnonymousUsage=false")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + o.Dir}
	cmd.Dir = o.Dir
	return cmd, nil
}

var (
	portsMu sync.Mutex
	ports   = map[string]bool{}
)

// freeAddr returns a free loopback address, never the same twice in one process.
func freeAddr() (string, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := l.Addr().String()
		l.Close()
		portsMu.Lock()
		used := ports[addr]
		ports[addr] = true
		portsMu.Unlock()
		if !used {
			return addr, nil
		}
	}
	return "", errors.New("proxyserver: no free port")
}

// Tail keeps the end of a proxy's output, for error messages.
type Tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 16 << 10

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - tailMax; over > 0 {
		t.buf = append([]byte(nil), t.buf[over:]...)
	}
	return len(p), nil
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
