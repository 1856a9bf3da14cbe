// Package metrics defines the core's Prometheus metrics: requests by route pattern and
// status with their latency, requests in flight and shed, and gauges and counters read
// at scrape time from the listener, the database pool and its monitor, and AUTHZ_ADDR.
package metrics

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/shared/pgguard"
)

// Reasons a request is shed, as the reason label of converger_core_requests_shed_total.
const (
	ShedInFlight     = "in_flight"     // CORE_MAX_IN_FLIGHT requests were in flight
	ShedDatabaseDown = "database_down" // the database monitor says PostgreSQL is down
	ShedClientGone   = "client_gone"   // the client closed its connection; the work was not started, or cancelled
)

// NoRoute is the route label of requests that matched no route (404s, and the answers
// given before routing: refused bodies, shed requests, errors of the HTTP server).
const NoRoute = "none"

// Metrics holds the core's collectors, registered on their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
	shed     *prometheus.CounterVec

	mu       sync.Mutex
	counters map[requestKey]prometheus.Counter
	observer map[string]prometheus.Observer
}

type requestKey struct {
	route, method string
	status        int
}

// New creates the collectors and registers them with the Go and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_core_requests_total",
			Help: "Answered requests by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "converger_core_request_duration_seconds",
			Help:    "Time from the request's headers to its answer, by route pattern.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "converger_core_requests_in_flight",
			Help: "Requests being handled now (bounded by CORE_MAX_IN_FLIGHT).",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_core_requests_shed_total",
			Help: "Requests answered 503 at once or cancelled instead of being worked on, by reason (in_flight, database_down, client_gone).",
		}, []string{"reason"}),
		counters: map[requestKey]prometheus.Counter{},
		observer: map[string]prometheus.Observer{},
	}
	m.Registry.MustRegister(m.requests, m.duration, m.inFlight, m.shed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{ShedInFlight, ShedDatabaseDown, ShedClientGone} {
		m.shed.WithLabelValues(r) // present from the start, at 0
	}
	return m
}

// ObserveRequest counts an answered request and its duration. The label handles are
// looked up once per route, method and status.
func (m *Metrics) ObserveRequest(route, method string, status int, d time.Duration) {
	k := requestKey{route, method, status}
	m.mu.Lock()
	c := m.counters[k]
	if c == nil {
		// Kept in maps: copies, in case a caller's strings are views of a buffer.
		k = requestKey{strings.Clone(route), strings.Clone(method), status}
		c = m.requests.WithLabelValues(k.route, k.method, strconv.Itoa(status))
		m.counters[k] = c
	}
	o := m.observer[route]
	if o == nil {
		route = strings.Clone(route)
		o = m.duration.WithLabelValues(route)
		m.observer[route] = o
	}
	m.mu.Unlock()
	c.Inc()
	o.Observe(d.Seconds())
}

// InFlight is the gauge of requests in flight.
func (m *Metrics) InFlight() prometheus.Gauge { return m.inFlight }

// Shed counts a shed request.
func (m *Metrics) Shed(reason string) { m.shed.WithLabelValues(reason).Inc() }

// GaugeFunc registers a gauge read at scrape time.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// CounterFunc registers a counter read at scrape time.
func (m *Metrics) CounterFunc(name, help string, f func() float64) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}

// Database registers the metrics of the database: the monitor's state and outages, the
// calls that failed for want of an answer, and the pool's connections and waits.
func (m *Metrics) Database(monitor *pgguard.Monitor, deadlines *pgguard.Deadlines, pool *pgxpool.Pool) {
	m.GaugeFunc("converger_core_database_up", "1 while PostgreSQL answers the monitor's probes, else 0.", func() float64 {
		if monitor.Up() {
			return 1
		}
		return 0
	})
	m.CounterFunc("converger_core_database_outages_total", "Times the monitor found the database down.",
		func() float64 { return float64(monitor.Stats().Outages) })
	m.CounterFunc("converger_core_database_errors_total", "Queries and new connections that failed because the database did not answer in time or could not be reached.",
		func() float64 { return float64(deadlines.Errors()) })
	m.CounterFunc("converger_core_db_pool_timeouts_total", "Requests that found no free database connection within DATABASE_ACQUIRE_TIMEOUT (overload) and were answered 503.",
		func() float64 { return float64(deadlines.PoolTimeouts()) })
	for _, g := range []struct {
		name, help string
		f          func(*pgxpool.Stat) float64
	}{
		{"converger_core_db_pool_connections", "Connections of the pool, in use or idle.", func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }},
		{"converger_core_db_pool_acquired_connections", "Connections of the pool in use.", func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }},
		{"converger_core_db_pool_max_connections", "The pool's bound on connections.", func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }},
	} {
		m.GaugeFunc(g.name, g.help, func() float64 { return g.f(pool.Stat()) })
	}
	for _, c := range []struct {
		name, help string
		f          func(*pgxpool.Stat) float64
	}{
		{"converger_core_db_pool_acquires_total", "Connections taken from the pool.", func(s *pgxpool.Stat) float64 { return float64(s.AcquireCount()) }},
		{"converger_core_db_pool_empty_acquires_total", "Acquisitions that had to wait for a connection.", func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }},
		{"converger_core_db_pool_canceled_acquires_total", "Acquisitions given up (a deadline, or the client gone).", func(s *pgxpool.Stat) float64 { return float64(s.CanceledAcquireCount()) }},
		{"converger_core_db_pool_acquire_seconds_total", "Time spent acquiring connections.", func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }},
	} {
		m.CounterFunc(c.name, c.help, func() float64 { return c.f(pool.Stat()) })
	}
}

// Listener registers the metrics of the API's listener.
func (m *Metrics) Listener(ln *netlimit.Listener) {
	m.GaugeFunc("converger_core_connections", "Open connections of the API listener.", func() float64 { return float64(ln.Stats().Open) })
	for _, c := range []struct {
		name, help string
		f          func(netlimit.Stats) uint64
	}{
		{"converger_core_connections_accepted_total", "Connections admitted by the API listener.", func(s netlimit.Stats) uint64 { return s.Accepted }},
		{"converger_core_accept_errors_total", "Failed accepts of the API listener (too many open files, aborted connections), each retried.", func(s netlimit.Stats) uint64 { return s.AcceptErrors }},
		{"converger_core_connections_refused_total", "Connections refused at CORE_MAX_CONNS with none idle.", func(s netlimit.Stats) uint64 { return s.RefusedTotal }},
		{"converger_core_connections_refused_per_ip_total", "Connections refused at CORE_MAX_CONNS_PER_IP.", func(s netlimit.Stats) uint64 { return s.RefusedPerIP }},
		{"converger_core_connections_evicted_total", "Idle connections closed to make room for a new one at CORE_MAX_CONNS.", func(s netlimit.Stats) uint64 { return s.Evicted }},
	} {
		m.CounterFunc(c.name, c.help, func() float64 { return float64(c.f(ln.Stats())) })
	}
}
