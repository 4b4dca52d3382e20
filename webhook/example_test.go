package webhook_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/parley-im/parley/webhook"
)

// A receiver verifies each request, drops ids it has seen, and answers 2xx
// quickly (anything else, or no answer within the endpoint's timeout, is
// retried).
func ExampleVerifyRequest() {
	secret := []byte("the endpoint's secret from the server's config")
	seen := map[string]bool{} // a real receiver keeps this in its database
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _, err := webhook.VerifyRequest(r, secret)
		if err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		if seen[ev.ID] {
			return // a retry of an event already handled
		}
		seen[ev.ID] = true
		if ev.Type == webhook.RecipientOffline {
			var d webhook.OfflineData
			if err := json.Unmarshal(ev.Data, &d); err == nil {
				fmt.Println("push to", d.Users, "from", d.Sender)
			}
		}
	})

	// What a Parley node sends (signed as the server does).
	body := []byte(`{"id":"7.42.recipient.offline","type":"recipient.offline","time":1900000000000,"conv_id":"7","seq":42,` +
		`"data":{"conv_kind":"direct","msg_id":"99","sender":"alice","users":["bob"],"preview":{"sender":"alice"}}}`)
	now := time.Now()
	req := httptest.NewRequest(http.MethodPost, "/hooks", bytes.NewReader(body))
	req.Header.Set(webhook.HeaderTimestamp, fmt.Sprint(now.Unix()))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(secret, now, body))
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)

	forged := httptest.NewRequest(http.MethodPost, "/hooks", bytes.NewReader(bytes.Replace(body, []byte("bob"), []byte("eve"), 1)))
	forged.Header = req.Header.Clone()
	rec2 := httptest.NewRecorder()
	handler.ServeHTTP(rec2, forged)
	if rec2.Code != http.StatusUnauthorized {
		log.Fatal("forged request accepted")
	}
	fmt.Println(rec.Code, rec2.Code)
	// Output:
	// push to [bob] from alice
	// 200 401
}
