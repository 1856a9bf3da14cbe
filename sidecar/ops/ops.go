// Package ops serves the sidecar's operator endpoints over HTTP: /metrics for
// Prometheus, /healthz (the process is alive) and /readyz (it is ready for checks).
package ops

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness reports whether the sidecar is ready, with details for operators.
type Readiness func() (ready bool, details map[string]any)

// Handler returns the operator endpoints.
func Handler(reg *prometheus.Registry, ready Readiness) http.Handler {
	mux := http.NewServeMux()
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
