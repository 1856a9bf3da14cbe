// Package cputime reads CPU time from /proc and getrusage: of a process, of this process,
// and of the whole machine, so that a benchmark can tell what its processes cost and how
// busy the rest of a shared machine was.
package cputime

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// Process returns the CPU time (user + system, all threads) a process has used so far.
func Process(pid int) (time.Duration, error) {
	st, err := readStat(strconv.Itoa(pid))
	if err != nil {
		return 0, err
	}
	return st.own, nil
}

// Tree returns the CPU time a process and its children have used so far: its own, that
// of the children it has waited for, and that of its children alive — a server that
// forks a process per connection, such as PostgreSQL's postmaster, with its backends.
func Tree(pid int) (time.Duration, error) {
	root, err := readStat(strconv.Itoa(pid))
	if err != nil {
		return 0, err
	}
	total := root.own + root.children
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if st, err := readStat(e.Name()); err == nil && st.ppid == pid {
			total += st.own + st.children
		}
	}
	return total, nil
}

// stat is what Process and Tree read of /proc/<pid>/stat.
type stat struct {
	ppid          int
	own, children time.Duration
}

func readStat(pid string) (stat, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return stat{}, err
	}
	// The command name may hold spaces; the fields after it start at its closing ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, errors.New("malformed /proc/<pid>/stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return stat{}, errors.New("malformed /proc/<pid>/stat")
	}
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15, cutime 16, cstime 17.
	var n [5]int64
	for j, k := range []int{1, 11, 12, 13, 14} {
		if n[j], err = strconv.ParseInt(f[k], 10, 64); err != nil {
			return stat{}, err
		}
	}
	return stat{ppid: int(n[0]), own: time.Duration(n[1]+n[2]) * clockTick, children: time.Duration(n[3]+n[4]) * clockTick}, nil
}

// Self returns the CPU time (user + system) this process has used so far.
func Self() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// Machine returns the CPU time all processes of the machine have spent in user and
// system mode so far (the first line of /proc/stat).
func Machine() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "cpu" {
		return 0, errors.New("malformed /proc/stat")
	}
	var ticks int64
	for _, s := range f[1:4] { // user, nice, system
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
