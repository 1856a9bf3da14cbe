package apierror

import (
	"strconv"
	"unicode/utf8"
)

// AppendBody appends Body's envelope to b without encoding/json, for answers written
// from reused buffers: details are none ({}) when nil. The bytes are Body's.
func (e Error) AppendBody(b []byte, details *RateLimitDetails, requestID string) []byte {
	b = append(b, `{"error":{"code":`...)
	b = AppendJSONString(b, e.Code)
	b = append(b, `,"message":`...)
	b = AppendJSONString(b, e.Message)
	b = append(b, `,"details":{`...)
	if details != nil {
		b = append(b, `"retry_after_ms":`...)
		b = strconv.AppendInt(b, details.RetryAfterMS, 10)
	}
	b = append(b, `},"request_id":`...)
	b = AppendJSONString(b, requestID)
	return append(b, "}}"...)
}

// AppendJSONString appends s as a JSON string, escaped as Marshal escapes it without
// HTML escaping: quote, backslash and control characters, invalid UTF-8 as U+FFFD, and
// U+2028 and U+2029; "<", ">" and "&" as themselves. The core's answers written without
// encoding/json use it too.
func AppendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(append(b, s[start:i]...), `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(append(b, s[start:i]...), '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(append(b, s[start:]...), '"')
}
