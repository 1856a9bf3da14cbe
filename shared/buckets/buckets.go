// Package buckets names the rate-limit buckets both programs use, with their built-in
// limits, how each is keyed, and the validation of per-tenant overrides (tenants.limits).
package buckets

import (
	"fmt"
	"strings"
	"time"
)

// Per says what a bucket is counted per.
type Per string

// The identities a bucket can be counted per.
const (
	PerTenant  Per = "tenant"
	PerChannel Per = "channel"
	PerIP      Per = "ip"
	PerAccount Per = "account"
)

// Limit is a number of hits allowed per fixed window.
type Limit struct {
	Count  uint32
	Window time.Duration
}

// String formats a limit as "100/1s".
func (l Limit) String() string { return fmt.Sprintf("%d/%s", l.Count, l.Window) }

// Spec writes a limit as `core limits set` takes it: 2000/1s, 10/1m, 3/1h, 5/1500ms.
func (l Limit) Spec() string {
	w := l.Window.String() // 1m0s, 1h0m0s, 1.5s, 500ms
	if strings.HasSuffix(w, "m0s") {
		w = strings.TrimSuffix(w, "0s")
	}
	if strings.HasSuffix(w, "h0m") {
		w = strings.TrimSuffix(w, "0m")
	}
	return fmt.Sprintf("%d/%s", l.Count, w)
}

// Bucket is one built-in bucket.
type Bucket struct {
	Name string
	// Default is the built-in limit, used when no override, installation limit or
	// route limit applies.
	Default Limit
	Per     Per
	// KeyPrefix stands between "<name>:" and the caller's part of the key, so that the
	// full key reads as in the documentation, e.g. "activity_create:tenant:<tenant id>".
	KeyPrefix string
	// Overridable buckets can be changed per tenant in tenants.limits.
	Overridable bool
}

// The built-in bucket names.
const (
	ActivityCreate       = "activity_create"
	Upload               = "upload"
	Inbound              = "inbound"
	TokenGenerate        = "token_generate"
	PublishableTokenIP   = "publishable_token_ip"
	PublishableToken     = "publishable_token"
	TokenCreate          = "token_create"
	LoginIP              = "login_ip"
	LoginAccount         = "login_account"
	PasswordResetIP      = "password_reset_ip"
	PasswordResetAccount = "password_reset_account"
	AdminWrite           = "admin_write"
)

// BuiltIn lists the built-in buckets in a stable order.
var BuiltIn = []Bucket{
	{ActivityCreate, Limit{100, time.Second}, PerTenant, "tenant:", true},
	{Upload, Limit{10, time.Second}, PerTenant, "tenant:", true},
	{Inbound, Limit{500, time.Second}, PerChannel, "channel:", true},
	{TokenGenerate, Limit{10, time.Minute}, PerChannel, "channel:", true},
	{PublishableTokenIP, Limit{10, time.Minute}, PerIP, "ip:", false},
	{PublishableToken, Limit{300, time.Minute}, PerChannel, "channel:", true},
	{TokenCreate, Limit{10, time.Minute}, PerIP, "ip:", false},
	{LoginIP, Limit{5, time.Minute}, PerIP, "", false},
	{LoginAccount, Limit{5, time.Minute}, PerAccount, "", false},
	{PasswordResetIP, Limit{5, time.Minute}, PerIP, "ip:", false},
	{PasswordResetAccount, Limit{3, time.Hour}, PerAccount, "", false},
	// The console's changes (the admin API's writes and the admin pages' forms), counted
	// before the admin is authenticated.
	{AdminWrite, Limit{60, time.Minute}, PerIP, "ip:", false},
}

// Lookup returns the built-in bucket with that name.
func Lookup(name string) (Bucket, bool) {
	for _, b := range BuiltIn {
		if b.Name == name {
			return b, true
		}
	}
	return Bucket{}, false
}

// ValidName reports whether s can name a bucket: 1 to 64 characters of a-z, 0-9 and "_".
func ValidName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789_") == ""
}

// ProtectsCredentials reports whether a bucket guards credentials: logins, password
// resets and the minting of tokens. When the check of such a bucket cannot be made
// (the sidecar unreachable, an error of ours), the request is refused rather than let
// through unlimited.
func ProtectsCredentials(name string) bool {
	switch name {
	case LoginIP, LoginAccount, PasswordResetIP, PasswordResetAccount,
		TokenGenerate, PublishableTokenIP, PublishableToken, TokenCreate:
		return true
	}
	return false
}
