package netlimit

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// RaiseOpenFiles raises the process's soft limit on open files (RLIMIT_NOFILE) to its
// hard limit, as servers should (Go's runtime does the same at start since Go 1.19; this
// makes it explicit and tells what the limit is), and returns the soft limit in force.
func RaiseOpenFiles() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		raised := syscall.Rlimit{Cur: rl.Max, Max: rl.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return rl.Cur, err
		}
		rl = raised
	}
	return rl.Cur, nil
}

// DefaultMaxConns is the connection cap for a process allowed openFiles descriptors:
// three quarters of them, leaving the rest for PostgreSQL, files and the other
// listeners, and at most 10,000.
func DefaultMaxConns(openFiles uint64) int {
	return int(min(openFiles*3/4, 10_000))
}

// PeerGone reports whether the client of a connection has closed it (or reset it),
// without taking any bytes it sent: a request whose client went away can stop its work.
// A connection it cannot look into (not TCP) is never gone.
func PeerGone(c net.Conn) bool {
	if lc, ok := c.(*Conn); ok {
		c = lc.Conn
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	var buf [1]byte
	_ = raw.Control(func(fd uintptr) {
		n, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			gone = n == 0 // an orderly shutdown: end of stream
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			// Alive, nothing to read.
		default:
			gone = true // reset, or otherwise broken
		}
	})
	return gone
}
