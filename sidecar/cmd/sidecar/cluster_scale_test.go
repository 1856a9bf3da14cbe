package main

// Cluster tests of membership at the size of a sidecar in every pod (20 processes), and
// of rolling restarts under load. The 20-node test starts its cluster once and runs its
// scenarios on it one after the other, since 20 race-instrumented processes are most of
// what two cores can run; its rolling restart runs only with CLUSTER_TEST_LONG=1 (the
// 3-node rolling restart always runs).

import (
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// longClusterTests says whether the long cluster tests run (CLUSTER_TEST_LONG=1).
func longClusterTests() bool { return os.Getenv("CLUSTER_TEST_LONG") == "1" }

// stopNode stops a node with SIGTERM and waits (at most 10 s) for it to exit with 0.
func stopNode(t *testing.T, n *node) time.Duration {
	t.Helper()
	began := time.Now()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := n.wait(10 * time.Second); code != 0 {
		t.Fatalf("%s exited with %d after SIGTERM; stderr:\n%s", n.name, code, tail(n.stderr.String()))
	}
	return time.Since(began)
}

// restartNode starts a stopped node again with its name, environment and addresses.
func restartNode(t *testing.T, old *node) *node {
	t.Helper()
	env := maps.Clone(old.env)
	env["SIDECAR_GRPC_ADDR"], env["SIDECAR_HTTP_ADDR"] = old.grpcAddr, old.httpAddr
	n := startNodeClients(t, old.netns, startIn(t, old.netns, env))
	n.name, n.env = old.name, env
	t.Cleanup(func() { terminate(t, n) })
	return n
}

// windowTally is what a load saw of one window: the checks allowed and denied, and
// whether a check's answer came in another window than it was sent in (then the
// window's figures are not the sidecars'; it is left out).
type windowTally struct {
	allowed, denied int
	straddled       bool
}

// loadResult sums up a load's windows.
type loadResult struct {
	windows  []int   // allowed per measured window, in order
	worst    float64 // the most allowed in a window, × L
	under    int     // checks denied in windows whose allowed total ended below L
	underMax int     // the most of those in one window
	left     int     // windows left out (straddled, or the last)
	warmup   []int   // allowed per window of the warm-up, not measured
}

func (r loadResult) String() string {
	return fmt.Sprintf("%d windows measured (%d left out), allowed per window %v, most %.3f × L, under-admission %d checks (at most %d in a window); warm-up windows %v",
		len(r.windows), r.left, r.windows, r.worst, r.under, r.underMax, r.warmup)
}

// rollingLoad offers one key rate checks a second, each to the next member that is up
// (a load balancer over the pods), until stop is closed; up[i] false takes member i
// out. Checks are sent only more than guard from a window's edges, so that each lands
// in the window it was sent in.
type rollingLoad struct {
	t                  *testing.T
	bucket, key        string
	windowMS, offsetMS int64
	limit              int

	mu      sync.RWMutex // held for writing to change the members
	members []*node
	up      []bool
	inUse   []sync.RWMutex // a check holds its member's for reading

	tallyMu sync.Mutex
	tally   map[int64]*windowTally
	from    int64 // the first window measured
	errs    atomic.Int64
}

func (l *rollingLoad) clock() int64 { return time.Now().UnixMilli() + l.offsetMS }

func (l *rollingLoad) run(rate float64, stop <-chan struct{}) {
	const guard = 40
	every := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	turn := 0
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-stop:
			return
		default:
		}
		next = next.Add(every)
		time.Sleep(time.Until(next))
		if at := l.clock() % l.windowMS; at < guard || at > l.windowMS-guard {
			continue
		}
		l.mu.RLock()
		i := -1
		for j := range l.members {
			if k := (turn + j) % len(l.members); l.up[k] {
				i = k
				break
			}
		}
		turn++
		if i < 0 {
			l.mu.RUnlock()
			continue
		}
		n := l.members[i]
		l.inUse[i].RLock()
		l.mu.RUnlock()
		wg.Go(func() {
			defer l.inUse[i].RUnlock()
			sent := l.clock()
			ctx, cancel := n.ctx()
			r, err := n.limiter.Check(ctx, l.bucket, l.key, 1)
			cancel()
			if err != nil {
				l.errs.Add(1)
				return
			}
			got := l.clock()
			w := sent / l.windowMS
			l.tallyMu.Lock()
			wt := l.tally[w]
			if wt == nil {
				wt = &windowTally{}
				l.tally[w] = wt
			}
			if r.Allowed {
				wt.allowed++
			} else {
				wt.denied++
			}
			wt.straddled = wt.straddled || got/l.windowMS != w
			l.tallyMu.Unlock()
		})
	}
}

// setUp takes member i out of the load (false), waiting for its checks in flight, or
// puts n in its place (true).
func (l *rollingLoad) setUp(i int, n *node, up bool) {
	l.mu.Lock()
	l.up[i] = false
	l.mu.Unlock()
	l.inUse[i].Lock() // the checks in flight on it are answered
	l.inUse[i].Unlock()
	if up {
		l.mu.Lock()
		l.members[i], l.up[i] = n, true
		l.mu.Unlock()
	}
}

func (l *rollingLoad) result() loadResult {
	l.tallyMu.Lock()
	defer l.tallyMu.Unlock()
	ws := slices.Sorted(maps.Keys(l.tally))
	var r loadResult
	for i, w := range ws {
		wt := l.tally[w]
		if w < l.from {
			r.warmup = append(r.warmup, wt.allowed)
			continue
		}
		if i == len(ws)-1 || wt.straddled {
			r.left++ // the last is partly offered
			continue
		}
		r.windows = append(r.windows, wt.allowed)
		r.worst = math.Max(r.worst, float64(wt.allowed)/float64(l.limit))
		if wt.allowed < l.limit && wt.denied > 0 {
			u := min(wt.denied, l.limit-wt.allowed)
			r.under += u
			r.underMax = max(r.underMax, u)
		}
	}
	return r
}

// rollingRestart restarts every member, one after the other (SIGTERM, then back with its
// name and addresses; the next only once every member sees the one that came back),
// while a key with limit limit per window is offered load × limit per window over the
// members that are up, and returns what the windows allowed and the members after.
func rollingRestart(t *testing.T, nodes []*node, bucket, key string, windowMS, offsetMS int64, limit int, load float64) (loadResult, []*node) {
	t.Helper()
	l := &rollingLoad{t: t, bucket: bucket, key: key, windowMS: windowMS, offsetMS: offsetMS, limit: limit,
		members: slices.Clone(nodes), up: make([]bool, len(nodes)), inUse: make([]sync.RWMutex, len(nodes)),
		tally: map[int64]*windowTally{}}
	for i := range l.up {
		l.up[i] = true
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(load*float64(limit)*1000/float64(windowMS), stop)
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-done
		}
	}()
	// Three windows of load before the first restart, so that every member has claimed
	// its part of the key: the first windows of a key that moves from one member to all
	// are share mode's warm-up (a newcomer gets headroom until its demand is reported),
	// not the restarts', and are reported apart.
	time.Sleep(time.Duration(3*windowMS) * time.Millisecond)
	l.tallyMu.Lock()
	l.from = l.clock()/windowMS + 1
	l.tallyMu.Unlock()
	for i := range nodes {
		l.mu.RLock()
		old := l.members[i]
		l.mu.RUnlock()
		l.setUp(i, nil, false)
		took := stopNode(t, old)
		n := restartNode(t, old)
		l.mu.RLock()
		cur := slices.Clone(l.members)
		l.mu.RUnlock()
		cur[i] = n
		settled := waitMembers(t, cur, names(cur), 30*time.Second)
		l.setUp(i, n, true)
		t.Logf("%s: stopped in %v, back and seen by every member %v after", n.name, took.Round(time.Millisecond), settled.Round(time.Millisecond))
	}
	time.Sleep(time.Duration(2*windowMS) * time.Millisecond)
	close(stop)
	<-done
	if e := l.errs.Load(); e > 0 {
		t.Errorf("%d checks failed (a member that was up did not answer)", e)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.result(), slices.Clone(l.members)
}

// The bounds of a rolling restart: the most any window may allow, and the refusals below
// the limit a window may have. A restarted member is new to the key (a new origin) and
// share mode gives a newcomer only headroom until its demand is reported, about two
// sync intervals; the rest of the members claimed the remainder meanwhile.
const (
	rollingMaxOver    = 1.05
	rollingUnderShare = 0.05 // of L, per window
)

func checkRolling(t *testing.T, r loadResult, limit int) {
	t.Helper()
	if len(r.windows) == 0 {
		t.Fatalf("no window measured: %v", r)
	}
	if r.worst > rollingMaxOver {
		t.Errorf("a window allowed %.3f × L, bound %.2f: %v", r.worst, rollingMaxOver, r)
	}
	if bound := int(math.Ceil(rollingUnderShare * float64(limit))); r.underMax > bound {
		t.Errorf("a window refused %d checks below the limit, bound %d: %v", r.underMax, bound, r)
	}
}

// A rolling restart of a 3-node cluster under load: every member in turn stops with
// SIGTERM (handing its counts to the others) and comes back (getting the current
// windows on join), while a key is offered 1.5 × its limit over the members up.
func TestClusterRollingRestartUnderLoad(t *testing.T) {
	t.Parallel()
	const limit, window = 40, 1000
	yaml := fmt.Sprintf("limits:\n  login_ip: {limit: %d, window: 1s}\n", limit)
	offset := clockOffset(time.Hour)
	nodes := startCluster(t, 3, yaml, offset, nil)
	r, _ := rollingRestart(t, nodes, "login_ip", "192.0.2.250", window, offset, limit, 1.5)
	t.Logf("rolling restart of 3, limit %d per 1 s window, offered 1.5 × L: %v", limit, r)
	checkRolling(t, r, limit)
}
