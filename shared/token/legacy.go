package token

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/converger/edge/shared/ids"
)

// LegacyType is the "type" claim of a legacy conversation token, so that it can never
// pass for a Converger token, nor the other way round.
const LegacyType = "conversation"

// LegacyLifetime is how long a legacy conversation token is valid.
const LegacyLifetime = 3600 * time.Second

// LegacyClaims are the claims of a legacy conversation token (POST /api/v1/tokens),
// which only the legacy WebSocket accepts: the conversation, its tenant, and the user
// as the subject.
type LegacyClaims struct {
	Type           string `json:"type"`
	ConversationID string `json:"conversation_id"`
	TenantID       string `json:"tenant_id"`
	jwt.RegisteredClaims
}

// IssueLegacy signs a legacy conversation token for userID (the sub claim).
func (s *Signer) IssueLegacy(conversationID, tenantID, userID string, now time.Time) (string, error) {
	c := LegacyClaims{Type: LegacyType, ConversationID: conversationID, TenantID: tenantID}
	c.Subject = userID
	c.IssuedAt = jwt.NewNumericDate(now)
	c.ExpiresAt = jwt.NewNumericDate(now.Add(LegacyLifetime))
	t := jwt.NewWithClaims(jwt.SigningMethodEdDSA, &c)
	t.Header["kid"] = s.kid
	return t.SignedString(s.key)
}

// VerifyLegacy checks a legacy conversation token.
func (v *Verifier) VerifyLegacy(tok string) (*LegacyClaims, error) {
	if len(tok) > MaxLength {
		return nil, fmt.Errorf("%w: too long", ErrInvalid)
	}
	var c LegacyClaims
	if _, err := v.parser.ParseWithClaims(tok, &c, v.key); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if c.Type != LegacyType {
		return nil, fmt.Errorf("%w: not a legacy conversation token", ErrInvalid)
	}
	if !ids.IsUUID(c.ConversationID) || !ids.IsUUID(c.TenantID) {
		return nil, fmt.Errorf("%w: conversation_id and tenant_id must be UUIDs", ErrInvalid)
	}
	return &c, nil
}

// key picks the verification key by the token's kid header.
func (v *Verifier) key(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	if k, ok := v.keys[kid]; ok {
		return k, nil
	}
	return nil, errors.New("unknown key id")
}
