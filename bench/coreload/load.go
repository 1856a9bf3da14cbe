package coreload

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/cputime"
	"github.com/converger/edge/bench/rawhttp"
)

// Target names.
const (
	TargetCore     = "core"
	TargetBaseline = "baseline"
)

// Scenario names.
const (
	ScenarioMany = "many"
	ScenarioHot  = "hot"
)

// target creates one activity in a conversation.
type target interface {
	name() string
	create(ctx context.Context, conversationID string) error
	// pid is the process whose CPU the target costs besides the generator and
	// PostgreSQL (the core), 0 for none.
	pid() int
}

// coreTarget posts activities to the core's tenant API: pre-built requests (one per
// conversation) over keep-alive connections that read only the answer's status, so that
// the generator's own cost per request stays small beside the core's (net/http's client
// costs about as much CPU as the baseline's pgx calls).
type coreTarget struct {
	reqs  map[string][]byte // by conversation id
	conns chan *rawhttp.Conn
	proc  int
}

func newCoreTarget(base, apiKey string, body []byte, conversations []string, concurrency, pid int) *coreTarget {
	u, _ := url.Parse(base)
	t := &coreTarget{reqs: make(map[string][]byte, len(conversations)), conns: make(chan *rawhttp.Conn, concurrency), proc: pid}
	header := map[string]string{"Content-Type": "application/json", "X-Api-Key": apiKey}
	for _, conv := range conversations {
		t.reqs[conv] = rawhttp.RequestWithBody(http.MethodPost, "/api/v1/conversations/"+conv+"/activities", u.Host, header, body)
	}
	for range concurrency {
		t.conns <- &rawhttp.Conn{Addr: u.Host}
	}
	return t
}

func (t *coreTarget) name() string { return TargetCore }
func (t *coreTarget) pid() int     { return t.proc }

func (t *coreTarget) create(ctx context.Context, conv string) error {
	req, ok := t.reqs[conv]
	if !ok {
		return fmt.Errorf("no request built for conversation %s", conv)
	}
	c := <-t.conns
	defer func() { t.conns <- c }()
	status, err := c.Do(ctx, req)
	if err != nil {
		return err
	}
	if status != http.StatusCreated {
		return fmt.Errorf("status %d", status)
	}
	return nil
}

func (t *coreTarget) close() {
	for range cap(t.conns) {
		(<-t.conns).Close()
	}
}

// baselineTarget inserts the same row itself: the seq update and the insert in one
// transaction, through pgx.
type baselineTarget struct {
	pool     *pgxpool.Pool
	tenantID string
	text     string
}

func (t *baselineTarget) name() string { return TargetBaseline }
func (t *baselineTarget) pid() int     { return 0 }

// The baseline's statements: the seq is taken under the conversation's row lock, as the
// core does, and the row is the core's (type, sender, text, attachments, metadata).
const (
	baselineUpdate = `UPDATE conversations SET last_seq = last_seq + 1, updated_at = now()
		WHERE id = $1 AND tenant_id = $2 AND status = 'active' RETURNING last_seq`
	baselineInsert = `INSERT INTO activities (tenant_id, conversation_id, seq, type, sender, text, attachments, metadata)
		VALUES ($1, $2, $3, 'message', 'user', $4, '[]', '{}') RETURNING id::text`
)

func (t *baselineTarget) create(ctx context.Context, conv string) error {
	return pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, baselineUpdate, conv, t.tenantID).Scan(&seq); err != nil {
			return err
		}
		var id string
		return tx.QueryRow(ctx, baselineInsert, t.tenantID, conv, seq, t.text).Scan(&id)
	})
}

// picker hands out the conversations of a scenario round robin, shared by the workers.
type picker struct {
	convs []string
	next  atomic.Uint64
}

func (p *picker) pick() string {
	return p.convs[(p.next.Add(1)-1)%uint64(len(p.convs))]
}

// PhaseResult is the outcome of one measured phase.
type PhaseResult struct {
	Scenario, Target string
	Round            int // from 1
	Requests         int // answered successfully
	Elapsed          time.Duration
	RPS              float64
	P50, P90, P99    time.Duration
	Max              time.Duration
	Errors           int
	FirstErr         string
	// CPU per successful request: of the core process (0 for the baseline), of the load
	// generator, of PostgreSQL (the postmaster and its backends) and of the rest of the
	// machine (other processes: on a shared machine, other people's work). Zero when
	// unknown.
	CoreCPU, GenCPU, PGCPU, RestCPU time.Duration
}

// StackCPU is the CPU per request of what serves the target: the core (for the core),
// the generator (the baseline's pgx calls, the core's HTTP client) and PostgreSQL.
func (p PhaseResult) StackCPU() time.Duration { return p.CoreCPU + p.GenCPU + p.PGCPU }

type worker struct {
	lat      []time.Duration
	errors   int
	firstErr error
}

// runPhase drives t for d with concurrency closed loops over p's conversations;
// pgPid is PostgreSQL's postmaster. Unmeasured phases (warm-up) keep no latencies.
func runPhase(ctx context.Context, t target, p *picker, concurrency int, d time.Duration, measured bool, pgPid int) PhaseResult {
	cpu0 := readCPU(t.pid(), pgPid)
	workers := make([]worker, concurrency)
	start := time.Now()
	deadline := start.Add(d)
	pctx, cancel := context.WithDeadline(ctx, deadline.Add(30*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for i := range workers {
		w := &workers[i]
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				err := t.create(pctx, p.pick())
				if err != nil {
					if w.firstErr == nil {
						w.firstErr = err
					}
					w.errors++
					continue
				}
				if measured {
					w.lat = append(w.lat, time.Since(t0))
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1 := readCPU(t.pid(), pgPid)
	res := PhaseResult{Target: t.name(), Elapsed: elapsed}
	var all []time.Duration
	for _, w := range workers {
		all = append(all, w.lat...)
		res.Errors += w.errors
		if w.firstErr != nil && res.FirstErr == "" {
			res.FirstErr = w.firstErr.Error()
		}
	}
	slices.Sort(all)
	res.Requests = len(all)
	res.RPS = float64(len(all)) / elapsed.Seconds()
	res.P50, res.P90, res.P99 = closedloop.Percentile(all, 0.50), closedloop.Percentile(all, 0.90), closedloop.Percentile(all, 0.99)
	if len(all) > 0 {
		res.Max = all[len(all)-1]
	}
	res.CoreCPU, res.GenCPU, res.PGCPU, res.RestCPU = cpu1.perRequest(cpu0, res.Requests)
	return res
}

// cpuSample is the CPU time used so far by the target's process, this process,
// PostgreSQL and the machine.
type cpuSample struct {
	target, self, pg, machine time.Duration
	ok                        bool
}

func readCPU(pid, pgPid int) cpuSample {
	s := cpuSample{ok: true}
	var err error
	if pid > 0 {
		if s.target, err = cputime.Process(pid); err != nil {
			s.ok = false
		}
	}
	if pgPid > 0 {
		if s.pg, err = cputime.Tree(pgPid); err != nil {
			s.ok = false
		}
	}
	if s.self, err = cputime.Self(); err != nil {
		s.ok = false
	}
	if s.machine, err = cputime.Machine(); err != nil {
		s.ok = false
	}
	return s
}

// perRequest splits the CPU used between two samples over n requests: the target's,
// the generator's, PostgreSQL's and the rest of the machine's.
func (s cpuSample) perRequest(before cpuSample, n int) (target, gen, pg, rest time.Duration) {
	if !s.ok || !before.ok || n == 0 {
		return 0, 0, 0, 0
	}
	target, gen, pg = s.target-before.target, s.self-before.self, s.pg-before.pg
	rest = max(s.machine-before.machine-target-gen-pg, 0)
	per := time.Duration(n)
	return target / per, gen / per, pg / per, rest / per
}
