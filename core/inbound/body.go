package inbound

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/converger/edge/core/activity"
)

// MaxBodyBytes bounds an inbound request's body (message or status), checked before the
// signature is computed. An activity within the default limits (65,536 bytes of text,
// ten attachments of 4,096 bytes, 16,384 bytes of metadata) fits with room to spare.
const MaxBodyBytes = 256 << 10

// DefaultSender is the sender of an inbound message that names none.
const DefaultSender = "external"

// Bounds of the server-side fields an inbound body names, in bytes.
const (
	// MaxSenderBytes bounds sender.
	MaxSenderBytes = 256
	// MaxMessageIDBytes bounds idempotency_key, conversation_id, provider_message_id and
	// delivery_id.
	MaxMessageIDBytes = 255
)

// ErrNotObject: the body is not a JSON object (a 400 on the API).
var ErrNotObject = errors.New("the body must be a JSON object")

// Message is a decoded inbound message body.
//
// Client holds the fields of the activity a client may set (ADR-0005: type, text,
// attachments, metadata), not yet validated against the activity limits. The others are
// the channel adapter's, and become the activity's server fields.
type Message struct {
	Client activity.Client
	// Sender is the body's sender, DefaultSender when it names none.
	Sender string
	// ProviderMessageID is the body's idempotency_key: the provider's message id, ""
	// when absent. A repeat of it on the same channel answers the original activity.
	ProviderMessageID string
	// ConversationID is the body's conversation_id as sent, "" when absent (a new
	// conversation of the channel).
	ConversationID string
}

// DecodeMessage decodes an inbound message body: ErrNotObject when it is not a JSON
// object, activity.FieldErrors when a field has the wrong type or is out of bounds.
// Keys other than text, sender, type, attachments, metadata, idempotency_key and
// conversation_id are ignored.
func DecodeMessage(body []byte) (Message, error) {
	fields, err := object(body)
	if err != nil {
		return Message{}, err
	}
	errs := activity.FieldErrors{}
	client, clientErrs := activity.FromBody(body)
	for k, v := range clientErrs {
		errs[k] = append(errs[k], v...)
	}
	m := Message{Client: client}
	m.Sender = stringField(fields, "sender", errs, MaxSenderBytes)
	if m.Sender == "" {
		m.Sender = DefaultSender
	}
	m.ProviderMessageID = stringField(fields, "idempotency_key", errs, MaxMessageIDBytes)
	m.ConversationID = stringField(fields, "conversation_id", errs, MaxMessageIDBytes)
	if len(errs) > 0 {
		return Message{}, errs
	}
	return m, nil
}

// MsgEmpty is the field error (on "text") of a message that carries nothing.
const MsgEmpty = "no text and no attachments"

// Check validates the message's activity fields against the limits, as the store will,
// and refuses a message (type "message", the default) with neither text (blank text
// counts as none) nor attachments: a provider's delivery of nothing is a 422, not an
// empty activity. Other types need neither.
func (m Message) Check(l activity.Limits) activity.FieldErrors {
	c := m.Client
	c.Attachments = slices.Clone(c.Attachments) // Validate normalises them in place
	if errs := c.Validate(l); errs != nil {
		return errs
	}
	if c.Type == "message" && strings.TrimSpace(c.Text) == "" && len(c.Attachments) == 0 {
		return activity.FieldErrors{"text": {MsgEmpty}}
	}
	return nil
}

// Status is a delivery status.
type Status string

// The delivery statuses. A message's status only moves forward:
//
//	queued → sent → delivered → read
//	queued, sent → failed
//
// Any status may be the first one recorded; read and failed are final.
const (
	Queued    Status = "queued"
	Sent      Status = "sent"
	Delivered Status = "delivered"
	Read      Status = "read"
	Failed    Status = "failed"
)

// Statuses are the delivery statuses, in their order.
var Statuses = []Status{Queued, Sent, Delivered, Read, Failed}

// rank orders the statuses of the successful path.
var rank = map[Status]int{Queued: 1, Sent: 2, Delivered: 3, Read: 4}

// Advances reports whether a message whose recorded status is from may move to s: a
// later status of the path queued < sent < delivered < read, or failed from queued or
// sent. A repeat of the same status does not advance.
func (s Status) Advances(from Status) bool {
	if s == Failed {
		return from == Queued || from == Sent
	}
	r, ok := rank[s]
	fr, fromOK := rank[from]
	return ok && fromOK && r > fr
}

// StatusUpdate is a decoded delivery-status body.
type StatusUpdate struct {
	// IDField is the name of the field that named the message: "provider_message_id" or
	// "delivery_id"; ID its value. Each names its own messages.
	IDField, ID string
	Status      Status
}

// The names of the fields of a status body that name the message.
const (
	ProviderMessageIDField = "provider_message_id"
	DeliveryIDField        = "delivery_id"
)

// DecodeStatus decodes a delivery-status body {"provider_message_id" | "delivery_id",
// "status"}: ErrNotObject when it is not a JSON object, activity.FieldErrors when the
// id is missing, both ids are given, or the status is not one of Statuses. Other keys
// are ignored.
func DecodeStatus(body []byte) (StatusUpdate, error) {
	fields, err := object(body)
	if err != nil {
		return StatusUpdate{}, err
	}
	errs := activity.FieldErrors{}
	var u StatusUpdate
	providerID := stringField(fields, ProviderMessageIDField, errs, MaxMessageIDBytes)
	deliveryID := stringField(fields, DeliveryIDField, errs, MaxMessageIDBytes)
	switch {
	case providerID != "" && deliveryID != "":
		errs[DeliveryIDField] = append(errs[DeliveryIDField], "must not be given with provider_message_id")
	case providerID != "":
		u.IDField, u.ID = ProviderMessageIDField, providerID
	case deliveryID != "":
		u.IDField, u.ID = DeliveryIDField, deliveryID
	case len(errs) == 0:
		errs[ProviderMessageIDField] = append(errs[ProviderMessageIDField], "is required (or delivery_id)")
	}
	status := stringField(fields, "status", errs, 32)
	if _, known := rank[Status(status)]; known || Status(status) == Failed {
		u.Status = Status(status)
	} else if _, bad := errs["status"]; !bad {
		errs["status"] = append(errs["status"], fmt.Sprintf("must be one of %v", Statuses))
	}
	if len(errs) > 0 {
		return StatusUpdate{}, errs
	}
	return u, nil
}

// object decodes a body that must be one JSON object.
func object(body []byte) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return nil, ErrNotObject
	}
	return fields, nil
}

// stringField reads an optional string field: "" when absent, null or empty. A value of
// another type, longer than max bytes, or with control characters is a field error.
func stringField(fields map[string]json.RawMessage, key string, errs activity.FieldErrors, max int) string {
	raw, ok := fields[key]
	if !ok || string(bytes.TrimSpace(raw)) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		errs[key] = append(errs[key], "must be a string")
		return ""
	}
	if len(s) > max || !utf8.ValidString(s) || strings.ContainsFunc(s, isControl) {
		errs[key] = append(errs[key], fmt.Sprintf("must be at most %d bytes without control characters", max))
		return ""
	}
	return s
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
