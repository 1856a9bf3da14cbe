package buckets

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// MaxOverrideWindow bounds scale_ms in an override (one day).
const MaxOverrideWindow = 24 * time.Hour

// Overrides are a tenant's limits by bucket name, as stored in tenants.limits.
type Overrides map[string]Limit

// OverridableNames lists the buckets a tenant override may set.
func OverridableNames() []string {
	var names []string
	for _, b := range BuiltIn {
		if b.Overridable {
			names = append(names, b.Name)
		}
	}
	return names
}

// ParseOverrides validates a tenants.limits document: an object whose keys are overridable
// buckets and whose values are exactly {"limit": <positive int>, "scale_ms": <positive int>}.
// The error names the offending bucket or field.
func ParseOverrides(doc []byte) (Overrides, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(doc, &raw); err != nil || raw == nil {
		return nil, fmt.Errorf("limits must be a JSON object")
	}
	out := make(Overrides, len(raw))
	for name, val := range raw {
		b, ok := Lookup(name)
		if !ok || !b.Overridable {
			return nil, fmt.Errorf("limits.%s: not an overridable bucket (allowed: %s)", name, strings.Join(OverridableNames(), ", "))
		}
		l, err := parseOverride(val)
		if err != nil {
			return nil, fmt.Errorf("limits.%s: %w", name, err)
		}
		out[name] = l
	}
	return out, nil
}

func parseOverride(val json.RawMessage) (Limit, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(val, &fields); err != nil || fields == nil {
		return Limit{}, fmt.Errorf(`must be {"limit": <positive int>, "scale_ms": <positive int>}`)
	}
	for k := range fields {
		if k != "limit" && k != "scale_ms" {
			return Limit{}, fmt.Errorf("unknown field %q (only limit and scale_ms)", k)
		}
	}
	limit, err := positiveInt(fields, "limit", math.MaxUint32)
	if err != nil {
		return Limit{}, err
	}
	scale, err := positiveInt(fields, "scale_ms", MaxOverrideWindow.Milliseconds())
	if err != nil {
		return Limit{}, err
	}
	return Limit{Count: uint32(limit), Window: time.Duration(scale) * time.Millisecond}, nil
}

func positiveInt(fields map[string]json.RawMessage, name string, max int64) (int64, error) {
	raw, ok := fields[name]
	if !ok {
		return 0, fmt.Errorf("%s is required", name)
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] < '0' || raw[0] > '9' {
		return 0, fmt.Errorf("%s must be a positive integer", name)
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		return 0, fmt.Errorf("%s must be a positive integer", name)
	}
	v, err := n.Int64()
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%s must be a positive integer", name)
	}
	if v > max {
		return 0, fmt.Errorf("%s must be at most %d", name, max)
	}
	return v, nil
}

// JSON encodes overrides in the stored form, keys sorted.
func (o Overrides) JSON() []byte {
	names := make([]string, 0, len(o))
	for n := range o {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:{\"limit\":%d,\"scale_ms\":%d}", n, o[n].Count, o[n].Window.Milliseconds())
	}
	b.WriteByte('}')
	return b.Bytes()
}
