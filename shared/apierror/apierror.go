// Package apierror is the one JSON error envelope of the project, shared by the core's
// responses and the sidecar's denials, and the request ids that go in it.
package apierror

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
)

// Error is an error answer: an HTTP status and the envelope's code and message.
type Error struct {
	Status  int
	Code    string
	Message string
}

// The errors both programs answer with.
var (
	BadRequest   = Error{400, "bad_request", "The request is malformed."}
	Unauthorized = Error{401, "unauthorized", "A valid API key is required."}
	Forbidden    = Error{403, "forbidden", "The credentials are invalid or expired."}
	NotFound     = Error{404, "not_found", "Not found."}
	RateLimited  = Error{429, "rate_limited", "Too many requests. Please try again later."}
	Unavailable  = Error{503, "unavailable", "The service is unavailable. Please try again later."}

	// The HTTP servers' own refusals, before a request reaches a handler.
	RequestTimeout  = Error{408, "request_timeout", "The request was not received in time."}
	PayloadTooLarge = Error{413, "payload_too_large", "The request body is too large."}
	HeadersTooLarge = Error{431, "headers_too_large", "The request headers are too large or too many."}
)

// WithMessage returns e with another message.
func (e Error) WithMessage(msg string) Error {
	e.Message = msg
	return e
}

type envelope struct {
	Error body `json:"error"`
}

type body struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Details   any    `json:"details"`
	RequestID string `json:"request_id"`
}

// Body returns the JSON envelope
// {"error":{"code":…,"message":…,"details":{…},"request_id":…}}. Nil details are {}.
func (e Error) Body(details any, requestID string) []byte {
	if details == nil {
		details = struct{}{}
	}
	b, err := Marshal(envelope{body{e.Code, e.Message, details, requestID}})
	if err != nil {
		// details that cannot be encoded are left out rather than losing the error.
		b, _ = Marshal(envelope{body{e.Code, e.Message, struct{}{}, requestID}})
	}
	return b
}

// Marshal encodes JSON as the envelope and the core's answers are written: encoding/json
// without its HTML escaping, since they are application/json, never HTML, and "<", ">"
// and "&" read as themselves (a URL's "&" stays "&", not "\u0026").
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// RateLimitDetails are the details of a rate_limited error.
type RateLimitDetails struct {
	RetryAfterMS int64 `json:"retry_after_ms"`
}

// MaxRequestIDLength bounds an x-request-id taken from a request.
const MaxRequestIDLength = 128

// RequestID returns the request's x-request-id when it is a sensible one (printable
// ASCII, at most MaxRequestIDLength bytes), else a new id.
func RequestID(header string) string {
	if header == "" || len(header) > MaxRequestIDLength {
		return NewRequestID()
	}
	for i := 0; i < len(header); i++ {
		if header[i] < 0x21 || header[i] > 0x7e {
			return NewRequestID()
		}
	}
	return header
}

// NewRequestID returns a random 16-character id. Request ids correlate logs; they are
// not secrets.
func NewRequestID() string {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint32(b[8:], rand.Uint32())
	return base64.RawURLEncoding.EncodeToString(b[:])
}
