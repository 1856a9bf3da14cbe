// Package metrics defines the sidecar's Prometheus metrics and the handles the hot path
// uses to update them without looking up labels on every request.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/converger/edge/sidecar/tenants"
)

// Decisions, as the decision label of the checks counter.
const (
	Allowed  = "allowed"  // within the limit, or not a limited route
	Denied   = "denied"   // 429
	Rejected = "rejected" // missing or invalid credentials, answered by the sidecar
)

// NoBucket is the bucket label of requests on routes that are not limited.
const NoBucket = "none"

// Metrics holds the sidecar's collectors, registered on their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	exceeded *prometheus.CounterVec
	checks   *prometheus.CounterVec
	duration prometheus.Histogram
	cache    *prometheus.CounterVec
	dbErrors *prometheus.CounterVec
	shed     prometheus.Counter

	mu      sync.Mutex
	buckets map[string]*Bucket
}

// Bucket holds one bucket's counters, resolved once.
type Bucket struct {
	Allowed, Denied, Rejected, Exceeded prometheus.Counter
}

// New creates the collectors and registers them with Go and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		exceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_rate_limit_exceeded_count",
			Help: "Requests and lockout checks denied because a rate limit was used up, by bucket.",
		}, []string{"bucket"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_sidecar_checks_total",
			Help: "Authorization checks by bucket and decision (allowed, denied, rejected).",
		}, []string{"bucket", "decision"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "converger_sidecar_check_duration_seconds",
			Help:    "Time to answer an authorization check.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		cache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_sidecar_cache_lookups_total",
			Help: "Lookups of tenants, channels and overrides by cache and result (hit, miss, fallback: decided without the database).",
		}, []string{"cache", "result"}),
		dbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_sidecar_db_errors_total",
			Help: "Failed database calls by operation.",
		}, []string{"op"}),
		shed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converger_sidecar_checks_shed_total",
			Help: "Checks that got no turn within their deadline (SIDECAR_MAX_CHECKS_IN_FLIGHT) and were answered at once: 503 on limited routes, allowed on the others.",
		}),
		buckets: map[string]*Bucket{},
	}
	m.Registry.MustRegister(m.exceeded, m.checks, m.duration, m.cache, m.dbErrors, m.shed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Bucket returns the counters of a bucket, creating them on first use.
func (m *Metrics) Bucket(name string) *Bucket {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[name]
	if b == nil {
		b = &Bucket{
			Allowed:  m.checks.WithLabelValues(name, Allowed),
			Denied:   m.checks.WithLabelValues(name, Denied),
			Rejected: m.checks.WithLabelValues(name, Rejected),
			Exceeded: m.exceeded.WithLabelValues(name),
		}
		m.buckets[name] = b
	}
	return b
}

// Unlimited counts a check of a request on no limited route.
func (m *Metrics) Unlimited() prometheus.Counter { return m.checks.WithLabelValues(NoBucket, Allowed) }

// Shed is the counter of Checks answered at once for want of a turn.
func (m *Metrics) Shed() prometheus.Counter { return m.shed }

// ObserveCheck records how long a check took.
func (m *Metrics) ObserveCheck(d time.Duration) { m.duration.Observe(d.Seconds()) }

// CacheCounter returns the counter of a cache's lookups with a result.
func (m *Metrics) CacheCounter(cache, result string) tenants.Counter {
	return m.cache.WithLabelValues(cache, result)
}

// DBError counts a failed database call.
func (m *Metrics) DBError(op string) { m.dbErrors.WithLabelValues(op).Inc() }

// GaugeFunc registers a gauge read at scrape time.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// CounterFunc registers a counter read at scrape time.
func (m *Metrics) CounterFunc(name, help string, f func() float64) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}
