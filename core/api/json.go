package api

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
)

// The response shapes: snake_case for the tenant API (§4), Direct Line camelCase for the
// client API and its stream (§5).

// marshalJSON is how every JSON answer and frame is encoded (fiber's JSONEncoder too):
// without HTML escaping, so that a streamUrl reads "…?t=…&watermark=…" rather than
// "\u0026watermark", and texts keep their "<", ">" and "&".
var marshalJSON = apierror.Marshal

// timestampLayout is RFC 3339 with milliseconds, as Direct Line clients expect.
const timestampLayout = "2006-01-02T15:04:05.000Z07:00"

func jsonTime(t time.Time) string { return t.UTC().Format(timestampLayout) }

// orEmpty returns raw, or def when raw is empty or JSON null, so that attachments and
// metadata are never null in a response.
func orEmpty(raw json.RawMessage, def string) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage(def)
	}
	return raw
}

// tenantActivityJSON is an activity on the tenant API.
type tenantActivityJSON struct {
	ID             string          `json:"id"`
	Type           string          `json:"type"`
	Sender         string          `json:"sender"`
	Text           string          `json:"text"`
	Attachments    json.RawMessage `json:"attachments"`
	Metadata       json.RawMessage `json:"metadata"`
	Seq            int64           `json:"seq"`
	ConversationID string          `json:"conversation_id"`
	TenantID       string          `json:"tenant_id"`
	InsertedAt     string          `json:"inserted_at"`
}

// tenantActivityData is the answer of one activity: {"data": …}.
type tenantActivityData struct {
	Data tenantActivityJSON `json:"data"`
}

func tenantActivity(a activity.Activity) tenantActivityJSON {
	return tenantActivityJSON{
		ID: a.ID, Type: a.Type, Sender: a.Sender, Text: a.Text,
		Attachments: orEmpty(a.Attachments, "[]"), Metadata: orEmpty(a.Metadata, "{}"),
		Seq: a.Seq, ConversationID: a.ConversationID, TenantID: a.TenantID, InsertedAt: jsonTime(a.InsertedAt),
	}
}

// tenantConversationJSON is a conversation on the tenant API.
type tenantConversationJSON struct {
	ID         string          `json:"id"`
	TenantID   string          `json:"tenant_id"`
	ChannelID  string          `json:"channel_id"`
	Status     string          `json:"status"`
	LastSeq    int64           `json:"last_seq"`
	Metadata   json.RawMessage `json:"metadata"`
	InsertedAt string          `json:"inserted_at"`
	UpdatedAt  string          `json:"updated_at"`
}

func tenantConversation(c store.Conversation) tenantConversationJSON {
	return tenantConversationJSON{
		ID: c.ID, TenantID: c.TenantID, ChannelID: c.ChannelID, Status: c.Status, LastSeq: c.LastSeq,
		Metadata: orEmpty(c.Metadata, "{}"), InsertedAt: jsonTime(c.InsertedAt), UpdatedAt: jsonTime(c.UpdatedAt),
	}
}

// directLineFrom is a Direct Line ChannelAccount.
type directLineFrom struct {
	ID string `json:"id"`
}

// directLineActivityJSON is an activity on the client API and the stream, Direct Line
// 3.0 shaped. ID is the activity's id, the one POST …/activities answered, which is how
// botframework-directlinejs recognises its own activity coming back; channelData is the
// stored metadata, so Web Chat's clientActivityID round-trips.
type directLineActivityJSON struct {
	ID             string          `json:"id"`
	Type           string          `json:"type"`
	From           directLineFrom  `json:"from"`
	Text           string          `json:"text"`
	Timestamp      string          `json:"timestamp"`
	Attachments    json.RawMessage `json:"attachments"`
	ConversationID string          `json:"conversationId"`
	ChannelData    json.RawMessage `json:"channelData"`
}

// directLineActivity is the Direct Line shape of a stored activity.
func directLineActivity(a activity.Activity) directLineActivityJSON {
	return directLineActivityJSON{
		ID: a.ID, Type: a.Type, From: directLineFrom{ID: a.Sender}, Text: a.Text, Timestamp: jsonTime(a.InsertedAt),
		Attachments: orEmpty(a.Attachments, "[]"), ConversationID: a.ConversationID, ChannelData: orEmpty(a.Metadata, "{}"),
	}
}

// directLineActivities is a page of activities in the Direct Line shape (never null).
func directLineActivities(list []activity.Activity) []directLineActivityJSON {
	out := make([]directLineActivityJSON, 0, len(list))
	for _, a := range list {
		out = append(out, directLineActivity(a))
	}
	return out
}

// directLineActivitySet is the body of a Direct Line activity list and of a stream
// frame: {"activities":[...],"watermark":"..."}.
type directLineActivitySet struct {
	Activities []directLineActivityJSON `json:"activities"`
	Watermark  string                   `json:"watermark"`
}

// appendJSON appends {"data": a} as marshalJSON encodes it, without reflection: the
// activity POST's answer. Attachments and metadata are compacted as encoding/json
// compacts a RawMessage; ok is false when one of them is not valid JSON, and the caller
// then encodes with marshalJSON, which reports it.
func (d tenantActivityData) appendJSON(b []byte) (_ []byte, ok bool) {
	a := d.Data
	b = append(b, `{"data":{"id":`...)
	b = apierror.AppendJSONString(b, a.ID)
	b = append(b, `,"type":`...)
	b = apierror.AppendJSONString(b, a.Type)
	b = append(b, `,"sender":`...)
	b = apierror.AppendJSONString(b, a.Sender)
	b = append(b, `,"text":`...)
	b = apierror.AppendJSONString(b, a.Text)
	b = append(b, `,"attachments":`...)
	if b, ok = appendCompactJSON(b, a.Attachments); !ok {
		return b, false
	}
	b = append(b, `,"metadata":`...)
	if b, ok = appendCompactJSON(b, a.Metadata); !ok {
		return b, false
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, a.Seq, 10)
	b = append(b, `,"conversation_id":`...)
	b = apierror.AppendJSONString(b, a.ConversationID)
	b = append(b, `,"tenant_id":`...)
	b = apierror.AppendJSONString(b, a.TenantID)
	b = append(b, `,"inserted_at":`...)
	b = apierror.AppendJSONString(b, a.InsertedAt)
	return append(b, "}}"...), true
}

// appendCompactJSON appends raw without insignificant whitespace, or reports it invalid.
func appendCompactJSON(b []byte, raw json.RawMessage) ([]byte, bool) {
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, raw); err != nil {
		return b, false
	}
	return buf.Bytes(), true
}
