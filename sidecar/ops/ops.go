// Package ops serves the sidecar's operator endpoints over HTTP: /metrics for
// Prometheus, /healthz (the process is alive), /readyz (it is ready for checks) and
// /debug/counter (one counter's state, per node of a cluster).
package ops

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness reports whether the sidecar is ready, with details for operators.
type Readiness func() (ready bool, details map[string]any)

// Counter describes one counter for /debug/counter?bucket=…&key=….
type Counter func(bucket, key string) any

// Handler returns the operator endpoints.
func Handler(reg *prometheus.Registry, ready Readiness, counter Counter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/counter", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		bucket, key := q.Get("bucket"), q.Get("key")
		if bucket == "" || key == "" || len(bucket) > 64 || len(key) > 512 {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "bucket and key are required, e.g. /debug/counter?bucket=inbound&key=<channel id>"})
			return
		}
		writeJSON(w, http.StatusOK, counter(bucket, key))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, details := ready()
		if details == nil {
			details = map[string]any{}
		}
		code := http.StatusOK
		details["status"] = "ready"
		if !ok {
			code = http.StatusServiceUnavailable
			details["status"] = "not ready"
		}
		writeJSON(w, code, details)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
