// Package ops serves the operator endpoints both programs have on an HTTP address of
// their own: /metrics for Prometheus, /healthz (the process is alive) and /readyz (it
// is ready for traffic, with details for operators).
package ops

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness reports whether the program is ready, with details for operators.
type Readiness func() (ready bool, details map[string]any)

// Mux returns a mux with /metrics, /healthz and /readyz; callers may add their own
// endpoints to it.
func Mux(reg *prometheus.Registry, ready Readiness) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]any{"status": "ok"})
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
		WriteJSON(w, code, details)
	})
	return mux
}

// WriteJSON answers v as JSON, never cached.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
