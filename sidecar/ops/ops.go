// Package ops serves the sidecar's operator endpoints over HTTP: /metrics for
// Prometheus, /healthz (the process is alive), /readyz (it is ready for checks) and
// /debug/counter (one counter's state, per node of a cluster).
package ops

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	sharedops "github.com/converger/edge/shared/ops"
)

// Readiness reports whether the sidecar is ready, with details for operators.
type Readiness = sharedops.Readiness

// Counter describes one counter for /debug/counter?bucket=…&key=….
type Counter func(bucket, key string) any

// Handler returns the operator endpoints.
func Handler(reg *prometheus.Registry, ready Readiness, counter Counter) http.Handler {
	mux := sharedops.Mux(reg, ready)
	mux.HandleFunc("GET /debug/counter", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		bucket, key := q.Get("bucket"), q.Get("key")
		if bucket == "" || key == "" || len(bucket) > 64 || len(key) > 512 {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "bucket and key are required, e.g. /debug/counter?bucket=inbound&key=<channel id>"})
			return
		}
		writeJSON(w, http.StatusOK, counter(bucket, key))
	})
	return mux
}

var writeJSON = sharedops.WriteJSON
