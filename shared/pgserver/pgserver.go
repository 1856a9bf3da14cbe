// Package pgserver runs a throwaway PostgreSQL server for tests and for `make run`.
// It owns finding (or installing) the binaries, initdb, the server process and its data directory.
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configure Start. The zero value is a temporary server on a free port.
type Options struct {
	// Dir is the data directory. Empty means a new temporary directory, removed by Stop.
	// Otherwise the directory is initialised only if it holds no cluster yet, kept by Stop,
	// and the server runs with fsync on.
	Dir string
	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int
	// BinDir holds initdb and postgres. Empty searches PATH, then the newest
	// /usr/lib/postgresql/*/bin, installing Debian's postgresql package when root.
	BinDir string
	// Logf, if set, receives progress messages and the server's log lines.
	Logf func(format string, args ...any)
}

// Server is a PostgreSQL server process started by Start. It accepts connections from
// 127.0.0.1 as user postgres without a password.
type Server struct {
	bins binaries
	dir  string
	temp bool
	port int
	cred *syscall.Credential // nil: run as the current user
	log  *logTail

	mu   sync.Mutex
	proc *process // nil while stopped
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited; err is set before
	err  error
}

const readyTimeout = 30 * time.Second

var errAddrInUse = errors.New("address already in use")

// Start initialises the data directory if needed and starts the server. The server is a
// child of this process and receives a signal if this process dies, so it never outlives it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bins, err := findBinaries(ctx, opts.BinDir, opts.Logf)
	if err != nil {
		return nil, err
	}
	s := &Server{bins: bins, port: opts.Port, log: &logTail{logf: opts.Logf}}
	if os.Geteuid() == 0 {
		if s.cred, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	if err := s.prepareDir(ctx, opts.Dir); err != nil {
		s.removeTemp()
		return nil, err
	}
	if err := s.launchFreePort(ctx); err != nil {
		s.removeTemp()
		return nil, err
	}
	return s, nil
}

// URL is the DSN of the server's postgres database.
func (s *Server) URL() string { return s.databaseURL("postgres") }

// Dir is the data directory.
func (s *Server) Dir() string { return s.dir }

// Pid is the server's (the postmaster's) process id, 0 while it is stopped. The backends
// and background processes are its children.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

func (s *Server) databaseURL(name string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + name,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Stop shuts the server down (fast shutdown) and removes the data directory if it is
// temporary. The Server cannot be restarted afterwards.
func (s *Server) Stop() error {
	err := s.Shutdown()
	if rmErr := s.removeTemp(); err == nil {
		err = rmErr
	}
	return err
}

// Shutdown stops the server process (fast shutdown) but keeps the data directory and port,
// so that Restart can start it again. It is a no-op when the server is not running.
func (s *Server) Shutdown() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shutdownLocked()
}

// Restart starts the server again on the same port and data directory, shutting it down
// first if it is running.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.shutdownLocked(); err != nil {
		s.logf("%v", err) // it crashed or had to be killed; either way it is down now
	}
	if _, err := os.Stat(filepath.Join(s.dir, "PG_VERSION")); err != nil {
		return fmt.Errorf("pgserver: cannot restart, data directory is gone: %w", err)
	}
	return s.launchLocked(ctx)
}

// Pause stops every process of the server (SIGSTOP): it keeps its
// connections and port but answers nothing, as a hung database does, until Resume.
func (s *Server) Pause() error { return s.signalAll(syscall.SIGSTOP) }

// Resume lets a paused server run again (SIGCONT).
func (s *Server) Resume() error { return s.signalAll(syscall.SIGCONT) }

func (s *Server) signalAll(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("pgserver: the server is not running")
	}
	return signalTree(s.proc.cmd.Process.Pid, sig)
}

// signalTree signals the postmaster pid and its children (the backends and background
// processes, each of which makes itself a process group leader, so that a signal to the
// postmaster's group does not reach them). The postmaster is signalled first, so that
// it starts no child in between.
func signalTree(pid int, sig syscall.Signal) error {
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("pgserver: %v: %w", sig, err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone already
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			_ = syscall.Kill(child, sig)
		}
	}
	return nil
}

// CreateDatabase creates a database and returns its URL.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	return s.createDatabase(ctx, name, "")
}

func (s *Server) createDatabase(ctx context.Context, name, template string) (string, error) {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if err := s.execSQL(ctx, sql); err != nil {
		return "", fmt.Errorf("pgserver: create database %q: %w", name, err)
	}
	return s.databaseURL(name), nil
}

// execSQL runs statements, one per call so that none is wrapped in a transaction, on the
// postgres database.
func (s *Server) execSQL(ctx context.Context, statements ...string) error {
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, sql := range statements {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: PostgreSQL refuses to run as root, and there is no postgres user to run it as (install Debian's postgresql package): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: uid of postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: gid of postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepareDir creates the data directory, owned by the user that runs the server, and runs
// initdb unless it already holds a cluster.
func (s *Server) prepareDir(ctx context.Context, dir string) error {
	var err error
	if dir == "" {
		s.temp = true
		if s.dir, err = os.MkdirTemp("", "pgserver-"); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
	} else {
		if s.dir, err = filepath.Abs(dir); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
	}
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if err := checkReachable(s.dir, s.cred.Uid, s.cred.Gid); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(s.dir, "PG_VERSION")); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pgserver: %w", err)
	}
	s.logf("initdb %s", s.dir)
	args := []string{"-D", s.dir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8"}
	if s.temp {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, s.bins.initdb, args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgserver: initdb: %w\n%s", err, out)
	}
	return nil
}

// checkReachable reports whether the user uid:gid (without supplementary groups, as the
// server runs) can search every parent of dir.
func checkReachable(dir string, uid, gid uint32) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		m, st := fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t)
		if m&0o001 == 0 && (st.Uid != uid || m&0o100 == 0) && (st.Gid != gid || m&0o010 == 0) {
			return fmt.Errorf("pgserver: the postgres user cannot reach %s: %s (mode %v) is not searchable by it; use a directory under a world-searchable path", dir, p, m)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// launchFreePort launches the server on the configured port, or on a free one, retrying
// with another port if it was taken in the meantime.
func (s *Server) launchFreePort(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.port != 0 {
		return s.launchLocked(ctx)
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		s.port = port
		err = s.launchLocked(ctx)
		if err == nil || attempt == 3 || !errors.Is(err, errAddrInUse) {
			return err
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) launchLocked(ctx context.Context) error {
	// Loopback TCP only: no Unix socket, so no socket directory to own and no path length limit.
	args := []string{"-D", s.dir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="}
	// SIGQUIT is an immediate shutdown; a persistent cluster gets a clean fast shutdown.
	deathSig := syscall.SIGINT
	if s.temp {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
		deathSig = syscall.SIGQUIT
	}
	cmd := exec.Command(s.bins.postgres, args...)
	cmd.Dir = s.dir
	s.log.reset()
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// Pdeathsig fires when the thread that started the server exits, which the Go runtime
	// only does when the process exits (or for goroutines that end while locked to a thread).
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: deathSig, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second // the server's children may hold stderr open
	s.logf("starting postgres on 127.0.0.1:%d, data directory %s", s.port, s.dir)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: starting postgres: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	if err := s.waitReady(ctx, p); err != nil {
		_ = s.shutdownLocked()
		return err
	}
	return nil
}

// waitReady polls until the server accepts connections, it exits, or readyTimeout passes.
func (s *Server) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		attemptCtx, cancelAttempt := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(attemptCtx, s.URL())
		cancelAttempt()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-p.done:
			log := s.log.String()
			if strings.Contains(log, "Address already in use") {
				return fmt.Errorf("pgserver: postgres could not listen on port %d: %w\n%s", s.port, errAddrInUse, log)
			}
			return fmt.Errorf("pgserver: postgres exited during start-up (%v):\n%s", p.err, log)
		case <-ctx.Done():
			return fmt.Errorf("pgserver: postgres not accepting connections on port %d: %w (last error: %v)\n%s",
				s.port, ctx.Err(), err, s.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *Server) shutdownLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	select {
	case <-p.done:
		return fmt.Errorf("pgserver: postgres had exited unexpectedly (%v):\n%s", p.err, s.log.String())
	default:
	}
	_ = signalTree(p.cmd.Process.Pid, syscall.SIGCONT) // a paused server could not stop
	_ = p.cmd.Process.Signal(syscall.SIGINT)           // fast shutdown
	select {
	case <-p.done:
		return nil
	case <-time.After(readyTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("pgserver: postgres did not shut down within %v and was killed", readyTimeout)
	}
}

func (s *Server) removeTemp() error {
	if !s.temp || s.dir == "" {
		return nil
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

func (s *Server) logf(format string, args ...any) {
	if s.log.logf != nil {
		s.log.logf("pgserver: "+format, args...)
	}
}

// logTail keeps the end of the server's output for error messages and passes lines on
// to logf.
type logTail struct {
	logf func(format string, args ...any)
	mu   sync.Mutex
	buf  []byte
}

const logTailMax = 16 << 10

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - logTailMax; over > 0 {
		l.buf = append([]byte(nil), l.buf[over:]...)
	}
	if l.logf != nil {
		for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
			l.logf("postgres: %s", line)
		}
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

func (l *logTail) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = nil
}
