package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Attachment is a stored upload.
type Attachment struct {
	ID             string
	TenantID       string
	ConversationID string
	Name           string
	ContentType    string
	Size           int64
	Bytes          []byte
	InsertedAt     time.Time
	// Active is whether the conversation's channel and its tenant are active: the
	// attachments of an inactive one are not served.
	Active bool
}

// NewAttachment is a file to store. ID is chosen by the caller (a random UUID), so that
// the activity that carries the file can name it before it is stored.
type NewAttachment struct {
	ID          string
	Name        string
	ContentType string
	Bytes       []byte
}

// CreateAttachments stores files of a tenant's conversation, all or none. A
// conversation of another tenant is ErrNotFound.
func (s *Store) CreateAttachments(ctx context.Context, tenantID, conversationID string, files []NewAttachment) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		for _, f := range files {
			tag, err := tx.Exec(ctx, `
				INSERT INTO attachments (id, tenant_id, conversation_id, name, content_type, size, bytes)
				SELECT $3, tenant_id, id, $4, $5, $6, $7 FROM conversations WHERE id = $1 AND tenant_id = $2`,
				conversationID, tenantID, f.ID, f.Name, f.ContentType, int64(len(f.Bytes)), f.Bytes)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return ErrNotFound
			}
		}
		return nil
	})
}

// DeleteAttachments removes a tenant's attachments (the files of an upload whose
// activity could not be created).
func (s *Store) DeleteAttachments(ctx context.Context, tenantID string, ids []string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM attachments WHERE tenant_id = $1 AND id = ANY($2::uuid[])`, tenantID, ids)
	return err
}

// Attachment returns an attachment with its bytes and whether its channel and tenant
// are active. tenantID scopes the lookup; ""
// looks it up by id alone, for callers that hold another credential for it (a signed
// contentUrl).
func (s *Store) Attachment(ctx context.Context, tenantID, id string) (Attachment, error) {
	var a Attachment
	err := s.pool.QueryRow(ctx, `
		SELECT a.id::text, a.tenant_id::text, a.conversation_id::text, a.name, a.content_type, a.size, a.bytes, a.inserted_at,
			ch.status = 'active' AND t.status = 'active'
		FROM attachments a
		JOIN conversations c ON c.id = a.conversation_id
		JOIN channels ch ON ch.id = c.channel_id
		JOIN tenants t ON t.id = a.tenant_id
		WHERE a.id = $1 AND ($2 = '' OR a.tenant_id::text = $2)`, id, tenantID).
		Scan(&a.ID, &a.TenantID, &a.ConversationID, &a.Name, &a.ContentType, &a.Size, &a.Bytes, &a.InsertedAt, &a.Active)
	return a, notFound(err)
}
