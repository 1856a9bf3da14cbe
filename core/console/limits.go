package console

import (
	"context"
	"encoding/json"
	"time"

	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
)

// The sources of a tenant's effective limit, the first that has one winning.
const (
	sourceOverride     = "override"     // the tenant's tenants.limits
	sourceInstallation = "installation" // the sidecars' RATE_LIMIT_CONFIG
	sourceBuiltIn      = "built_in"     // the built-in default
	sourceUnknown      = "unknown"      // no override, and the sidecar did not say
)

// limitJSON is a limit as the admin API writes and reads it: the stored form.
type limitJSON struct {
	Limit   uint32 `json:"limit"`
	ScaleMS int64  `json:"scale_ms"`
}

func toJSON(l buckets.Limit) *limitJSON {
	return &limitJSON{Limit: l.Count, ScaleMS: l.Window.Milliseconds()}
}

// String writes a limit as `core limits set` takes it: 2000/1s.
func (l *limitJSON) String() string {
	if l == nil {
		return ""
	}
	return buckets.Limit{Count: l.Limit, Window: time.Duration(l.ScaleMS) * time.Millisecond}.Spec()
}

// bucketLimit is one overridable bucket of a tenant: every source's limit and the one
// that applies.
type bucketLimit struct {
	Bucket       string     `json:"bucket"`
	Per          string     `json:"per"`
	Key          string     `json:"key"`
	Override     *limitJSON `json:"override"`
	Installation *limitJSON `json:"installation"`
	BuiltIn      *limitJSON `json:"built_in"`
	Effective    *limitJSON `json:"effective"`
	Source       string     `json:"source"`
}

// limitsView is a tenant's limits.
type limitsView struct {
	TenantID string `json:"tenant_id"`
	// Stored is tenants.limits as stored.
	Stored json.RawMessage `json:"stored"`
	// StoredError says why the stored document is ignored by the sidecars (written by
	// hand); null when it is valid.
	StoredError *string `json:"stored_error"`
	// InstallationKnown is false when the sidecar did not say its installation limits.
	InstallationKnown bool          `json:"installation_known"`
	Buckets           []bucketLimit `json:"buckets"`
}

// installation asks the sidecar for its installation limits; ok is false without an
// answer.
func (c *Console) installation(ctx context.Context) (map[string]buckets.Limit, bool) {
	if c.Sidecar == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, c.SidecarTimeout)
	defer cancel()
	resp, err := c.Sidecar.Buckets(ctx)
	if err != nil {
		c.Logger.Warn("console: the sidecar did not list its buckets", "error", err)
		return nil, false
	}
	out := map[string]buckets.Limit{}
	for _, b := range resp.GetBuckets() {
		if in := b.GetInstallation(); in != nil {
			out[b.GetName()] = buckets.Limit{Count: uint32(in.GetLimit()), Window: time.Duration(in.GetWindowMs()) * time.Millisecond}
		}
	}
	return out, true
}

// tenantLimits reads a tenant's overrides and resolves every overridable bucket's limit
// as the sidecars do.
func (c *Console) tenantLimits(ctx context.Context, tenantID string) (limitsView, error) {
	l, err := c.Store.Limits(ctx, tenantID)
	if err != nil {
		return limitsView{}, err
	}
	return c.resolve(ctx, tenantID, l), nil
}

func (c *Console) resolve(ctx context.Context, tenantID string, l store.TenantLimits) limitsView {
	inst, known := c.installation(ctx)
	v := limitsView{TenantID: tenantID, Stored: l.Raw, InstallationKnown: known}
	if l.Invalid != nil {
		msg := l.Invalid.Error()
		v.StoredError = &msg
	}
	for _, name := range buckets.OverridableNames() {
		b, _ := buckets.Lookup(name)
		id := tenantID
		if b.Per == buckets.PerChannel {
			id = "<channel id>"
		}
		bl := bucketLimit{Bucket: name, Per: string(b.Per), Key: name + ":" + b.KeyPrefix + id, BuiltIn: toJSON(b.Default)}
		if o, ok := l.Overrides[name]; ok {
			bl.Override = toJSON(o)
		}
		if in, ok := inst[name]; ok {
			bl.Installation = toJSON(in)
		}
		switch {
		case bl.Override != nil:
			bl.Effective, bl.Source = bl.Override, sourceOverride
		case bl.Installation != nil:
			bl.Effective, bl.Source = bl.Installation, sourceInstallation
		case known:
			bl.Effective, bl.Source = bl.BuiltIn, sourceBuiltIn
		default:
			bl.Source = sourceUnknown
		}
		v.Buckets = append(v.Buckets, bl)
	}
	return v
}
