package api

import "context"

// hub hands new activities to the streams of their conversation.
type hub struct{}

func newHub() *hub { return &hub{} }

// Listener follows NOTIFY activities, so that streams on every core instance push
// activities created by any of them.
type Listener struct{ s *server }

// Run listens until ctx ends.
func (l *Listener) Run(ctx context.Context) { <-ctx.Done() }
