// Package promscrape reads selected samples from a Prometheus text endpoint, such as the
// sidecar's /metrics, for a benchmark's report.
package promscrape

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/converger/edge/bench/benchtls"
)

// Sample is one sample: a metric name with its labels, as written, and its value.
type Sample struct {
	Name  string // e.g. `converger_cluster_sync_bytes_total{direction="sent"}`
	Value float64
}

// Parse returns the samples of the text exposition format whose name with labels begins
// with one of the prefixes, in order.
func Parse(r io.Reader, prefixes []string) []Sample {
	var out []Sample
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, p := range prefixes {
			if !strings.HasPrefix(line, p) {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			if i < 0 {
				break
			}
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				break
			}
			out = append(out, Sample{Name: line[:i], Value: v})
			break
		}
	}
	return out
}

// Scrape fetches url (within 5 seconds) and parses it.
func Scrape(ctx context.Context, url string, prefixes []string) ([]Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	client, err := benchtls.HTTPClient(0) // https:// URLs on mutual TLS
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return Parse(resp.Body, prefixes), nil
}

// Map returns the samples by name (with labels).
func Map(samples []Sample) map[string]float64 {
	m := make(map[string]float64, len(samples))
	for _, s := range samples {
		m[s.Name] = s.Value
	}
	return m
}
