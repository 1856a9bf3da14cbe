// Package inbound holds the pure parts of the inbound provider webhooks (CORE_API.md §6):
// the x-converger-signature header and its verification, and the decoding of the
// message and delivery-status bodies. The HTTP handlers and the storage live in
// core/api and core/store.
package inbound

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader is the header that carries an inbound request's signature:
//
//	x-converger-signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
//
// The elements are separated by commas without spaces. t appears exactly once; v1 one or
// more times (during a secret rotation a sender signs with both secrets, and the request
// is valid when any v1 matches). Elements with other names are ignored, so that a sender
// may add a newer scheme beside v1; a header of another scheme only, such as the legacy
// "sha256=<hex>", has no t and is malformed.
const SignatureHeader = "x-converger-signature"

// Tolerance is how far t may be from the server's clock, either way.
const Tolerance = 300 * time.Second

// Bounds of a signature header, so that parsing and verifying stay cheap.
const (
	// MaxSignatureHeader is the longest header accepted, in bytes.
	MaxSignatureHeader = 2048
	// MaxSignatures is the most v1 elements accepted.
	MaxSignatures = 8
	// maxTimestampDigits bounds t (12 digits reach the year 33658).
	maxTimestampDigits = 12
)

// The verification errors. Each is a 401 on the API; they differ so that a sender's
// mistake can be told apart in its answer.
var (
	// ErrMissing: the header is absent or empty.
	ErrMissing = errors.New("the x-converger-signature header is missing")
	// ErrMalformed: the header is not t=<unix seconds>,v1=<64 hex digits>[,v1=…].
	ErrMalformed = errors.New("the x-converger-signature header is malformed: want t=<unix seconds>,v1=<hex HMAC-SHA256>")
	// ErrStale: t is more than Tolerance away from the server's clock.
	ErrStale = errors.New("the x-converger-signature timestamp is outside the tolerance of 300 seconds")
	// ErrMismatch: no v1 is the HMAC of the body with the channel's secret.
	ErrMismatch = errors.New("the x-converger-signature does not match the body")
	// ErrReplayed: the signed request was received already (ReplayKey); a sender signs
	// every request afresh.
	ErrReplayed = errors.New("the x-converger-signature was used already: sign every request afresh")
)

// Signature is a parsed signature header.
type Signature struct {
	// Timestamp is t, in Unix seconds.
	Timestamp int64
	// V1 are the v1 signatures, each sha256.Size bytes, in header order.
	V1 [][]byte
}

// ParseSignature parses a signature header. It returns ErrMissing for an empty header and
// ErrMalformed for anything that is not exactly the form of SignatureHeader: an element
// without "=", an empty element or value, spaces, a t that is not a canonical decimal
// number (digits only, no sign, no leading zero), a second t, a v1 that is not 64 hex
// digits, no t or no v1, more than MaxSignatures v1 or a header longer than
// MaxSignatureHeader.
func ParseSignature(header string) (Signature, error) {
	if header == "" {
		return Signature{}, ErrMissing
	}
	if len(header) > MaxSignatureHeader {
		return Signature{}, ErrMalformed
	}
	var sig Signature
	seenT := false
	for element := range strings.SplitSeq(header, ",") {
		key, value, ok := strings.Cut(element, "=")
		if !ok || !validKey(key) || !validValue(value) {
			return Signature{}, ErrMalformed
		}
		switch key {
		case "t":
			ts, ok := parseTimestamp(value)
			if !ok || seenT {
				return Signature{}, ErrMalformed
			}
			sig.Timestamp, seenT = ts, true
		case "v1":
			mac, err := hex.DecodeString(value)
			if err != nil || len(mac) != sha256.Size || len(sig.V1) == MaxSignatures {
				return Signature{}, ErrMalformed
			}
			sig.V1 = append(sig.V1, mac)
		}
	}
	if !seenT || len(sig.V1) == 0 {
		return Signature{}, ErrMalformed
	}
	return sig, nil
}

// validKey reports whether an element's name is one: lower-case letters and digits,
// starting with a letter.
func validKey(k string) bool {
	if k == "" || k[0] < 'a' || k[0] > 'z' {
		return false
	}
	for i := 1; i < len(k); i++ {
		if (k[i] < 'a' || k[i] > 'z') && (k[i] < '0' || k[i] > '9') {
			return false
		}
	}
	return true
}

// validValue reports whether an element's value is one: printable ASCII without spaces,
// commas or "=", and not empty.
func validValue(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] > '~' || v[i] == ',' || v[i] == '=' {
			return false
		}
	}
	return true
}

// parseTimestamp reads a canonical decimal number of seconds.
func parseTimestamp(s string) (int64, bool) {
	if s == "" || len(s) > maxTimestampDigits || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// Verify checks a signature header against a request body and the channel's secret at
// the server's time now: ErrMissing, ErrMalformed, ErrStale (t more than Tolerance
// before or after now) or ErrMismatch (no v1 matches); nil when the request is
// authentic. The comparison is constant-time, and every v1 is compared.
func Verify(header string, secret, body []byte, now time.Time) error {
	sig, err := ParseSignature(header)
	if err != nil {
		return err
	}
	skew := now.Unix() - sig.Timestamp
	if skew > int64(Tolerance/time.Second) || skew < -int64(Tolerance/time.Second) {
		return ErrStale
	}
	want := mac(secret, sig.Timestamp, body)
	matched := false
	for _, got := range sig.V1 {
		if hmac.Equal(got, want) {
			matched = true
		}
	}
	if !matched {
		return ErrMismatch
	}
	return nil
}

// Sign returns the signature header of body signed with secret at time t, with one v1
// per secret (two during a rotation): what a sender puts in SignatureHeader.
func Sign(t time.Time, body []byte, secrets ...[]byte) string {
	var b strings.Builder
	b.WriteString("t=")
	b.WriteString(strconv.FormatInt(t.Unix(), 10))
	for _, secret := range secrets {
		b.WriteString(",v1=")
		b.WriteString(hex.EncodeToString(mac(secret, t.Unix(), body)))
	}
	return b.String()
}

// mac is HMAC-SHA256(secret, "<t>.<body>").
func mac(secret []byte, t int64, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(strconv.AppendInt(nil, t, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// ReplayKey is what identifies a signed request for replay protection: the SHA-256 of
// "<t>.<raw body>", which every v1 of its header signs, and when its signature goes
// stale (t + Tolerance). A second request with the same key within the tolerance is a
// replay.
func ReplayKey(header string, body []byte) (digest []byte, expires time.Time, ok bool) {
	sig, err := ParseSignature(header)
	if err != nil {
		return nil, time.Time{}, false
	}
	h := sha256.New()
	h.Write(strconv.AppendInt(nil, sig.Timestamp, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil), time.Unix(sig.Timestamp, 0).Add(Tolerance), true
}
