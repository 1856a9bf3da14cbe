package api

import (
	"encoding/base64"
	"strconv"
	"strings"
)

// Watermarks are opaque to clients: base64url without padding of "seq:<n>" (CORE_API §7).
// A list answers the activities with a higher seq, oldest first.

const watermarkPrefix = "seq:"

// encodeWatermark returns the watermark after the activity with this seq (0: the start).
func encodeWatermark(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(watermarkPrefix + strconv.FormatInt(seq, 10)))
}

// decodeWatermark parses a watermark; ok is false for anything encodeWatermark would
// not produce (bad base64, another prefix, a negative or non-decimal seq). Callers
// decide what "" means (the client API: from the start).
func decodeWatermark(s string) (seq int64, ok bool) {
	if s == "" || len(s) > 64 {
		return 0, false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return 0, false
	}
	digits, found := strings.CutPrefix(string(b), watermarkPrefix)
	if !found || digits == "" || len(digits) > 19 {
		return 0, false
	}
	for _, r := range digits {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}
