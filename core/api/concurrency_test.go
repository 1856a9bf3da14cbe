package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

// parallel runs n calls of f at once and waits for them.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f(i)
		}()
	}
	close(start)
	wg.Wait()
}

// rawPost is a POST that reports instead of failing the test, for goroutines.
func (e *env) rawPost(path, body string, headers map[string]string) (int, []byte, error) {
	req, err := http.NewRequest("POST", e.base+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// dataID is the id of a {"data":{"id":…}} or {"id":…} answer ("" when there is none).
func dataID(body []byte) string {
	var a struct {
		ID   string `json:"id"`
		Seq  int64  `json:"seq"`
		Data struct {
			ID  string `json:"id"`
			Seq int64  `json:"seq"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &a) != nil {
		return ""
	}
	if a.Data.ID != "" {
		return a.Data.ID
	}
	return a.ID
}

// dataSeq is the seq of a {"data":{"seq":…}} answer.
func dataSeq(body []byte) int64 {
	var a struct {
		Data struct {
			Seq int64 `json:"seq"`
		} `json:"data"`
	}
	_ = json.Unmarshal(body, &a)
	return a.Data.Seq
}

func TestConcurrentPostsGetGapFreeSeq(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	const n = 100
	seqs := make([]int64, n)
	errs := make([]string, n)
	parallel(n, func(i int) {
		status, body, err := e.rawPost("/api/v1/conversations/"+s.conv+"/activities", fmt.Sprintf(`{"text":"m%d"}`, i), apiKey(s.key))
		if err != nil || status != 201 {
			errs[i] = fmt.Sprintf("%d %s %v", status, body, err)
			return
		}
		seqs[i] = dataSeq(body)
	})
	for i, msg := range errs {
		if msg != "" {
			t.Fatalf("post %d: %s", i, msg)
		}
	}
	slices.Sort(seqs)
	for i, sq := range seqs {
		if sq != int64(i+1) {
			t.Fatalf("seqs %v: not 1..%d without gaps", seqs, n)
		}
	}
	if got := e.count(`SELECT count(DISTINCT seq) FROM activities WHERE conversation_id = $1 AND seq BETWEEN 1 AND $2`, s.conv, n); got != n {
		t.Fatalf("%d distinct seqs stored, want %d", got, n)
	}
	if got := e.count(`SELECT last_seq FROM conversations WHERE id = $1`, s.conv); got != n {
		t.Fatalf("last_seq %d, want %d", got, n)
	}
	// The list is in seq order, complete.
	l := e.list(s.key, s.conv, "?limit=1000")
	if len(l.Data) != n || l.Data[0].Seq != 1 || l.Data[n-1].Seq != n {
		t.Fatalf("list of %d", len(l.Data))
	}
}

// Concurrent duplicates through both APIs (one shared create path) resolve to one row
// and every caller gets its id.
func TestConcurrentIdempotentPostsGiveOneRow(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("echo")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)
	const n = 20
	ids := make([]string, n)
	errs := make([]string, n)
	parallel(n, func(i int) {
		var status int
		var body []byte
		var err error
		if i%2 == 0 {
			status, body, err = e.rawPost("/api/v1/conversations/"+conv.ConversationID+"/activities", fmt.Sprintf(`{"text":"try %d"}`, i),
				map[string]string{"x-api-key": s.key, "x-idempotency-key": "same"})
		} else {
			status, body, err = e.rawPost("/api/v1/converger/conversations/"+conv.ConversationID+"/activities",
				fmt.Sprintf(`{"type":"message","text":"try %d"}`, i),
				map[string]string{"authorization": "Bearer " + conv.Token, "x-idempotency-key": "same"})
		}
		want := map[bool]int{true: 201, false: 200}[i%2 == 0]
		if err != nil || status != want {
			errs[i] = fmt.Sprintf("%d %s %v", status, body, err)
			return
		}
		ids[i] = dataID(body)
	})
	for i, msg := range errs {
		if msg != "" {
			t.Fatalf("post %d: %s", i, msg)
		}
	}
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("ids %v: not one id", ids)
		}
	}
	if got := e.count(`SELECT count(*) FROM activities WHERE conversation_id = $1 AND idempotency_key = 'same'`, conv.ConversationID); got != 1 {
		t.Fatalf("%d rows for one key", got)
	}
	// One echo for the one message, right after it.
	l := e.list(s.key, conv.ConversationID, "")
	if len(l.Data) != 2 || l.Data[0].ID != ids[0] || l.Data[1].Sender != "bot" || l.Data[1].Text != "echo: "+l.Data[0].Text {
		t.Fatalf("activities %+v", l.Data)
	}
}
