package procs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/converger/edge/bench/benchtls"
)

// StartSidecar starts the sidecar binary on free loopback ports, with SidecarEnv and the
// variables of env (KEY=value), and waits until /readyz answers 200. It returns the process
// and its gRPC and HTTP addresses.
func StartSidecar(ctx context.Context, bin string, env []string, log io.Writer) (p *Proc, grpcAddr, httpAddr string, err error) {
	return StartSidecarUnder(ctx, nil, bin, env, log)
}

// StartSidecarUnder is StartSidecar with the binary run by the command prefix (for
// example taskset -c 0), none when prefix is empty.
func StartSidecarUnder(ctx context.Context, prefix []string, bin string, env []string, log io.Writer) (p *Proc, grpcAddr, httpAddr string, err error) {
	base := SidecarEnv()
	var lastErr error
	for range 3 {
		ports, err := FreePorts(2)
		if err != nil {
			return nil, "", "", err
		}
		grpcAddr, httpAddr = ports[0], ports[1]
		argv := append(prefix[:len(prefix):len(prefix)], bin)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(append(append(base[:len(base):len(base)], "SIDECAR_GRPC_ADDR="+grpcAddr, "SIDECAR_HTTP_ADDR="+httpAddr), benchtls.SidecarEnv()...), env...)
		p, err = Start("sidecar", cmd, &TailWriter{Prefix: "sidecar: ", W: log})
		if err != nil {
			return nil, "", "", err
		}
		err = WaitReady(ctx, p, benchtls.URL(httpAddr, "/readyz"), nil)
		if err == nil {
			return p, grpcAddr, httpAddr, nil
		}
		p.Stop()
		if !strings.Contains(p.Out.Tail(), "address already in use") {
			return nil, "", "", err
		}
		lastErr = err // a port was taken in between: try others
	}
	return nil, "", "", lastErr
}

// StartNoop starts `<this binary> <command> [args]` on a free port and returns the
// address it prints: command is noop (the no-op Envoy services, over gRPC) or
// noop-forward-auth (the no-op HTTP check).
func StartNoop(ctx context.Context, command string, log io.Writer, args ...string) (*Proc, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("finding the bench binary: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(exe, append([]string{command, "-addr", "127.0.0.1:0"}, args...)...)
	cmd.Stdout = w
	p, err := Start("no-op server", cmd, &TailWriter{Prefix: command + ": ", W: log})
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
			p.Stop()
			if perr := p.Exited(); perr != nil {
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
	p.Stop()
	return nil, "", err
}
