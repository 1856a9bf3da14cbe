// Package activity is the activity type and its trust boundary (ADR-0005): the fields a
// client may set (an allowlist, beside the type), their validation, and the server
// fields that only credentials, the URL, headers or a channel adapter provide.
package activity

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Activity is a stored activity.
type Activity struct {
	ID             string
	TenantID       string
	ConversationID string
	Seq            int64
	Type           string
	Sender         string
	Text           string
	Attachments    json.RawMessage // a JSON array, never null
	Metadata       json.RawMessage // a JSON object, never null
	IdempotencyKey string
	InsertedAt     time.Time
	// ChannelID is the conversation's channel. It is not stored with the activity; the
	// store fills it in when it creates one.
	ChannelID string
}

// Types are the activity types.
var Types = []string{"message", "event", "typing", "conversationUpdate", "endOfConversation"}

// ClientFields are the only fields a client may set. Every other field is the server's:
// a new field is server-only until someone deliberately adds it here.
var ClientFields = []string{"type", "text", "attachments", "metadata"}

// Client is what an untrusted caller gave: the allowlisted fields only.
type Client struct {
	Type        string
	Text        string
	Attachments []json.RawMessage
	Metadata    json.RawMessage
}

// System is what only the server sets: from the credentials, the URL, headers or the
// channel adapter, never from a request body.
type System struct {
	TenantID       string
	ConversationID string
	Sender         string
	// IdempotencyKey is the x-idempotency-key header, or an inbound provider's message
	// id; "" for none.
	IdempotencyKey string
}

// Limits bound what a client may send.
type Limits struct {
	MaxTextBytes       int // bytes of text
	MaxAttachments     int // attachments per activity
	MaxAttachmentBytes int // JSON bytes per attachment
	MaxMetadataBytes   int // JSON bytes of metadata
}

// DefaultLimits are ADR-0005's defaults.
var DefaultLimits = Limits{MaxTextBytes: 65536, MaxAttachments: 10, MaxAttachmentBytes: 4096, MaxMetadataBytes: 16384}

// FieldErrors are validation errors by field, as the 422 envelope carries them.
type FieldErrors map[string][]string

func (f FieldErrors) add(field, msg string) { f[field] = append(f[field], msg) }

// Error lists the fields.
func (f FieldErrors) Error() string {
	names := make([]string, 0, len(f))
	for k := range f {
		names = append(names, k)
	}
	slices.Sort(names)
	return fmt.Sprintf("invalid activity fields: %v", names)
}

// FromBody takes a tenant-API body's allowlisted keys; every other key is ignored.
func FromBody(body []byte) (Client, FieldErrors) {
	c, _, errs := fromFields(body, "metadata")
	return c, errs
}

// FromTenantBody is FromBody and BodySender(body, def) from one reading of the body.
func FromTenantBody(body []byte, def string) (Client, string, FieldErrors) {
	c, fields, errs := fromFields(body, "metadata")
	if errs != nil {
		return c, def, errs
	}
	for k := range fields {
		// BodySender decodes into a struct, whose field also takes a key that differs
		// from "sender" in case only (the last one of the body wins): such bodies, rare,
		// are read its way.
		if k != "sender" && len(k) >= len("sender") && (strings.EqualFold(k, "sender") || !isASCII(k)) {
			return c, BodySender(body, def), nil
		}
	}
	return c, senderFrom(fields["sender"], def), nil
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// FromDirectLine takes a Direct Line activity's allowlisted keys: channelData is the
// metadata (metadata is accepted when channelData is absent); from.id is the sender,
// which the caller reads itself with Sender, as a server-side decision of that path.
func FromDirectLine(body []byte) (Client, FieldErrors) {
	metadataKey := "metadata"
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) == nil {
		if _, ok := probe["channelData"]; ok {
			metadataKey = "channelData"
		}
	}
	c, _, errs := fromFields(body, metadataKey)
	return c, errs
}

// Sender returns the from.id of a Direct Line activity, or def.
func Sender(body []byte, def string) string {
	var a struct {
		From struct {
			ID any `json:"id"`
		} `json:"from"`
	}
	if json.Unmarshal(body, &a) == nil {
		if s, ok := a.From.ID.(string); ok && validSender(s) {
			return s
		}
	}
	return def
}

func fromFields(body []byte, metadataKey string) (Client, map[string]json.RawMessage, FieldErrors) {
	errs := FieldErrors{}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		errs.add("body", "must be a JSON object")
		return Client{}, nil, errs
	}
	var c Client
	str := func(key string, dst *string) {
		raw, ok := fields[key]
		if !ok || isNull(raw) {
			return
		}
		if !decodeString(raw, dst) {
			errs.add(key, "must be a string")
		}
	}
	str("type", &c.Type)
	str("text", &c.Text)
	if raw, ok := fields["attachments"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &c.Attachments) != nil {
			errs.add("attachments", "must be a list of objects")
		}
	}
	if raw, ok := fields[metadataKey]; ok && !isNull(raw) {
		c.Metadata = raw
	}
	if len(errs) > 0 {
		return Client{}, nil, errs
	}
	return c, fields, nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// decodeString decodes a JSON value that must be a string, as json.Unmarshal into a
// string does; one without escapes, of valid UTF-8, is taken as it is.
func decodeString(raw json.RawMessage, dst *string) bool {
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' {
		in := raw[1 : n-1]
		plain := utf8.Valid(in)
		for _, b := range in {
			if b == '\\' || b == '"' || b < 0x20 {
				plain = false
				break
			}
		}
		if plain {
			*dst = string(in)
			return true
		}
	}
	return json.Unmarshal(raw, dst) == nil
}

// Validate checks a client's fields against the type list and the limits, and fills
// the defaults: type "message", no attachments, empty metadata.
func (c *Client) Validate(l Limits) FieldErrors {
	errs := FieldErrors{}
	if c.Type == "" {
		c.Type = "message"
	}
	if !slices.Contains(Types, c.Type) {
		errs.add("type", fmt.Sprintf("must be one of %v", Types))
	}
	if len(c.Text) > l.MaxTextBytes {
		errs.add("text", fmt.Sprintf("must be at most %d bytes", l.MaxTextBytes))
	}
	if len(c.Attachments) > l.MaxAttachments {
		errs.add("attachments", fmt.Sprintf("must be at most %d", l.MaxAttachments))
	}
	if strings.ContainsRune(c.Text, 0) {
		errs.add("text", "must not contain NUL characters")
	}
	for i, a := range c.Attachments {
		norm, msg := CheckObject(a, l.MaxAttachmentBytes)
		if msg == "" {
			msg = checkContentType(norm)
		}
		if msg != "" {
			errs.add("attachments", fmt.Sprintf("attachment %d: %s", i, msg))
			continue
		}
		c.Attachments[i] = norm
	}
	if len(c.Metadata) == 0 {
		c.Metadata = json.RawMessage("{}")
	} else if norm, msg := CheckObject(c.Metadata, l.MaxMetadataBytes); msg != "" {
		errs.add("metadata", msg)
	} else {
		c.Metadata = norm
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// checkContentType returns why an attachment (a JSON object) has no usable
// contentType, or "": every attachment says what it is, as in Direct Line.
func checkContentType(attachment json.RawMessage) string {
	// A map, not a struct: encoding/json would also take "contenttype" for a struct's
	// field.
	var a map[string]json.RawMessage
	_ = json.Unmarshal(attachment, &a) // an object: CheckObject said so
	raw, ok := a["contentType"]
	if !ok || isNull(raw) {
		return "contentType can't be blank"
	}
	var ct string
	if json.Unmarshal(raw, &ct) != nil {
		return "contentType must be a string"
	}
	if strings.TrimSpace(ct) == "" {
		return "contentType can't be blank"
	}
	return ""
}

// AttachmentsJSON returns the attachments as one JSON array.
func (c *Client) AttachmentsJSON() json.RawMessage {
	if len(c.Attachments) == 0 {
		return json.RawMessage("[]")
	}
	b, _ := json.Marshal(c.Attachments)
	return b
}

// CheckObject checks that raw is a JSON object that PostgreSQL's jsonb can store, of at
// most maxBytes bytes once re-encoded, and returns it re-encoded from its parsed value
// (compact, valid UTF-8, lone surrogates replaced, keys sorted, no optional escapes; jsonb
// normalises key order and spacing anyway), or a message for the field ("must be an
// object", …). The size is the re-encoded one, which is what is stored: it does not
// depend on how the client escaped the object, so an object accepted once is accepted
// again as any API answers it.
func CheckObject(raw json.RawMessage, maxBytes int) (json.RawMessage, string) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if dec.Decode(&obj) != nil || obj == nil || dec.More() {
		return nil, "must be an object"
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(obj) != nil {
		return nil, "must be an object"
	}
	norm := bytes.TrimRight(b.Bytes(), "\n")
	if len(norm) > maxBytes {
		return nil, fmt.Sprintf("must be at most %d bytes of JSON", maxBytes)
	}
	if msg := storable(obj); msg != "" {
		return nil, msg
	}
	return json.RawMessage(norm), ""
}

// storable finds what jsonb refuses in a parsed JSON value: NUL characters in strings
// or keys, and numbers beyond its numeric range.
func storable(v any) string {
	switch v := v.(type) {
	case string:
		if strings.ContainsRune(v, 0) {
			return "must not contain NUL characters"
		}
	case json.Number:
		if !numericInRange(string(v)) {
			return "must not contain numbers out of range"
		}
	case []any:
		for _, e := range v {
			if msg := storable(e); msg != "" {
				return msg
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, 0) {
				return "must not contain NUL characters"
			}
			if msg := storable(e); msg != "" {
				return msg
			}
		}
	}
	return ""
}

// numericInRange reports whether PostgreSQL's numeric, which holds jsonb's numbers, can
// hold a JSON number: an exponent within ±1000, and at most 16383 digits after the
// decimal point and 131072 before it once the exponent is applied.
func numericInRange(n string) bool {
	mantissa, exp := strings.ToLower(n), 0
	if i := strings.IndexByte(mantissa, 'e'); i >= 0 {
		var err error
		if exp, err = strconv.Atoi(strings.TrimPrefix(mantissa[i+1:], "+")); err != nil || exp > 1000 || exp < -1000 {
			return false
		}
		mantissa = mantissa[:i]
	}
	intPart, frac, _ := strings.Cut(strings.TrimPrefix(mantissa, "-"), ".")
	return len(frac)-exp <= 16383 && (intPart == "0" || len(intPart)+exp <= 131072)
}

// BodySender returns the "sender" string of a tenant-API body (a server-to-server API,
// whose caller names the sender), or def.
func BodySender(body []byte, def string) string {
	var a struct {
		Sender any `json:"sender"`
	}
	if json.Unmarshal(body, &a) == nil {
		if s, ok := a.Sender.(string); ok && validSender(s) {
			return s
		}
	}
	return def
}

// senderFrom is BodySender of a body whose "sender" value is raw (nil: none).
func senderFrom(raw json.RawMessage, def string) string {
	var s string
	if len(raw) > 0 && raw[0] == '"' && decodeString(raw, &s) && validSender(s) {
		return s
	}
	return def
}

// validSender reports whether a sender named in a body can be stored: 1 to 256 bytes
// without NUL characters.
func validSender(s string) bool {
	return s != "" && len(s) <= 256 && !strings.ContainsRune(s, 0)
}
