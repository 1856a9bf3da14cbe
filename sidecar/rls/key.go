package rls

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"unsafe"
)

// A counter is identified, as in the reference, by the domain, the request descriptor's
// own entries in order (a shared wildcard standing for the value where share_threshold
// says so) and the window; unlike the reference, the window's length is part of the id,
// so a minute counter and an hour counter of one descriptor never merge. Keys and values
// are escaped, not joined, so they cannot alias:
//
//	storefront|client_id=c9|60s
//
// An id longer than maxID is replaced by the SHA-256 of it ("#" and 64 hex digits), so
// that every id fits the cluster's wire format.
const maxID = 256

// appendID appends the counter id of a limit for a descriptor's entries.
func appendID(b []byte, domain string, entries []Entry, share []string, seconds int64) []byte {
	start := len(b)
	b = appendEscaped(b, domain)
	for i, e := range entries {
		b = append(b, '|')
		b = appendEscaped(b, e.Key)
		b = append(b, '=')
		if i < len(share) && share[i] != "" {
			b = appendEscaped(b, share[i])
		} else {
			b = appendEscaped(b, e.Value)
		}
	}
	b = append(b, '|')
	b = strconv.AppendInt(b, seconds, 10)
	b = append(b, 's')
	if len(b)-start > maxID {
		sum := sha256.Sum256(b[start:])
		b = append(b[:start], '#')
		b = hex.AppendEncode(b, sum[:])
	}
	return b
}

// appendEscaped appends s with the separators of ids (|, =) and % percent-encoded.
func appendEscaped(b []byte, s string) []byte {
	const hexDigits = "0123456789ABCDEF"
	for {
		i := 0
		for i < len(s) && s[i] != '%' && s[i] != '|' && s[i] != '=' {
			i++
		}
		b = append(b, s[:i]...)
		if i == len(s) {
			return b
		}
		c := s[i]
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		s = s[i+1:]
	}
}

// bytesString is a string over b's bytes without a copy. The limiter keeps no
// reference to an id once a call returns, so ids are built in a buffer reused per call.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
